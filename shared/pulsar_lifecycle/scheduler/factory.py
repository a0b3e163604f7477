"""Wiring BucketSnapshotWriter from its Context: storage, engine, publisher, service."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, List

from ..bucket import BucketIndex
from ..bucket.storage import (
    BucketSnapshotStorage,
    DirectorySnapshotStorage,
    bookkeeper_snapshot_storage,
    lock_exclusively,
)
from ..dedup.publisher import DedupPublisher
from ..deletion.service import LedgerDeletionService
from ..deletion.topics import DeletionTopics
from ..runtime.context_api import pulsar_client
from ..timing import DelayedProducer
from .config import WriterConfig, parse_writer_config, scheduling_input
from .context_state import ContextStateStore
from .index_identity import STATE_KEY, check_index_identity
from .runtime_input import RuntimeInput
from .scheduling_consumer import SchedulingConsumer, SchedulingSubscription
from .service import SchedulerService
from .snapshot_deletion import TwoPhaseSnapshotDeleter

log = logging.getLogger(__name__)


def default_snapshot_dir(context: Any) -> Path:
    """`<--data-dir>/buckets/<tenant>_<namespace>_<name>[-instance-<i>]` under the local runner.

    Anywhere else (Pulsar's own runtime) there is no default: a worker's working directory is
    neither durable nor the same after a reschedule, so snapshotDir must be explicit.
    """
    data_dir = getattr(context, "data_dir", None)
    if not data_dir:
        raise ValueError("userConfig snapshotDir is required with snapshotStorage=directory outside "
                         "`pulsar-lifecycle localrun` (or use snapshotStorage=bookkeeper)")
    table = f"{context.get_function_tenant()}_{context.get_function_namespace()}_{context.get_function_name()}".replace("-", "_")
    instance = int(context.get_instance_id())
    # Instance 0 keeps the name earlier versions used (`.pulsar-lifecycle/buckets/<table>` = the default data dir).
    return Path(data_dir) / "buckets" / (table if instance == 0 else f"{table}-instance-{instance}")


def open_writer_snapshot_storage(cfg: WriterConfig, context: Any, resources: List[Any]) -> BucketSnapshotStorage:
    """The configured BucketSnapshotStorage backend; handles to close later go to `resources`."""
    if cfg.snapshot_storage == "bookkeeper":
        return bookkeeper_snapshot_storage(cfg.snapshot_storage_service_url, context.get_function_tenant(),
                                           context.get_function_namespace(), context.get_function_name())
    path = Path(cfg.snapshot_dir) if cfg.snapshot_dir else default_snapshot_dir(context)
    resources.append(lock_exclusively(path))
    return DirectorySnapshotStorage(path)


def state_location(context: Any, key_prefix: str) -> str:
    """How to name this instance's dedup state in an error message."""
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    store = getattr(getattr(context, "state", None), "path", None)
    where = f" in {store}" if store is not None else ""
    return f"state key {key_prefix}{STATE_KEY} of {fqfn}{where}"


def build_service(context: Any) -> SchedulerService:
    """Everything the function needs, built from userConfig and the function's identity."""
    user = dict(context.get_user_config_map() or {})
    scheduling, direct = scheduling_input(context.get_input_topics(), user)
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    cfg = parse_writer_config(user, topic=scheduling, cursor=fqfn)
    default_target = context.get_output_topic()
    if not default_target:
        raise ValueError("BucketSnapshotWriter needs `output` (the business topic releases go to)")
    resources: List[Any] = []
    storage: Any = None
    publisher = None
    try:
        storage = open_writer_snapshot_storage(cfg, context, resources)
        deleter = _snapshot_deleter(cfg, context, scheduling)
        if deleter is not None:
            resources.append(deleter)  # closed with the service: its producers before the client
        engine = BucketIndex(storage, cfg.bucket, on_snapshot_obsolete=deleter)
        producer_name = cfg.producer_name or f"{fqfn}-{context.get_instance_id()}-release"
        client = pulsar_client(context)
        prefix = f"dedup/{context.get_instance_id()}/"
        dedup_state = ContextStateStore(context, prefix=prefix)
        publisher = DedupPublisher(client, producer_name, dedup_state)
        published = publisher.open(default_target)
        # Before recovery: a new index gets its sequence base written into its cursor here.
        check_index_identity(storage, dedup_state, state_location=state_location(context, prefix),
                             published_seq=max(0, published), replace_index_id=cfg.replace_index_id)
        source_factory = None
        runtime_input = None
        if direct:
            sub = SchedulingSubscription(
                topic=scheduling, subscription=cfg.scheduling_subscription or fqfn,
                batch_size=cfg.ingest_batch_size, batch_delay_ms=cfg.ingest_batch_delay_millis,
                max_delay_ms=cfg.max_delay_seconds * 1000, allowed_target_prefixes=cfg.allowed_target_prefixes)
            # The scheduling topic as an input only starts the writer (runtime_input.py).
            runtime_input = RuntimeInput(context, scheduling)
            hand_back = runtime_input.hand_back
            source_factory = lambda: SchedulingConsumer(client, sub, hand_back)  # noqa: E731 - opened after recovery
        service = SchedulerService(engine, publisher, cfg, default_target,
                                   cfg.invalid_message_topic or f"{scheduling}-INVALID",
                                   client, context.record_metric, resources=resources, source_factory=source_factory,
                                   runtime_input=runtime_input)
        service.start()
    except BaseException:
        # The next process() call builds again: the snapshot-directory lock must not outlive this try.
        if publisher is not None:
            publisher.close(timeout_s=5)
        if storage is not None and callable(getattr(storage, "close", None)):
            storage.close()
        for res in resources:
            res.close()
        raise
    return service


def _snapshot_deleter(cfg: WriterConfig, context: Any, scheduling_topic: str) -> Any:
    """None (engine deletes directly) or the two-phase deletion hand-off."""
    if cfg.snapshot_deletion != "two-phase":
        return None
    client = pulsar_client(context)
    topics = DeletionTopics(namespace=cfg.snapshot_deletion_namespace, topic_name=cfg.snapshot_deletion_topic_name,
                            parallelism=cfg.snapshot_deletion_parallelism)
    delayed = DelayedProducer(client, backend="scheduler", scheduling_topic=scheduling_topic)
    service = LedgerDeletionService(client, topics=topics, delayed=delayed,
                                    send_delay_seconds=cfg.snapshot_deletion_send_delay_seconds)
    return TwoPhaseSnapshotDeleter(service, scheduling_topic)
