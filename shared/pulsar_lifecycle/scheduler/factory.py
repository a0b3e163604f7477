"""Wiring BucketSnapshotWriter from its Context: storage, engine, publisher, service."""
from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple, TypeVar, Union

from ..bucket import BucketIndex
from ..bucket.records import RecoveryReport
from ..bucket.storage import (
    BucketSnapshotStorage,
    DirectorySnapshotStorage,
    bookkeeper_partition_storage,
    bookkeeper_snapshot_storage,
    lock_exclusively,
)
from ..bucket.storage.lease import FencedSnapshotStorage, LeaseKeeper, new_incarnation
from ..clock import wall_clock_ms
from ..config.settings import ConfigError
from ..dedup.publisher import DedupPublisher
from ..runtime.context_api import num_instances, pulsar_client
from ..scheduling_protocol import cancel_reply_topic
from ..topics import TopicName, normalize_topic
from .config import WriterConfig, parse_writer_config, scheduling_input
from .context_state import ContextStateStore
from .index_identity import STATE_KEY, check_index_identity, known_identity
from .intake import TargetCheck
from .intake_gaps import GapClassifier, intake_gaps_for
from .runtime_input import RuntimeInput
from .scheduling_consumer import SchedulingConsumer, SchedulingSubscription
from .service import SchedulerService
from .snapshot_location import BOOKKEEPER, default_snapshot_dir, snapshot_location
from .wake import wake_after_failure

if TYPE_CHECKING:
    from .partitioned import PartitionedWriter

log = logging.getLogger(__name__)
_T = TypeVar("_T")
# This process's incarnation in partition lease owners: set once, when Pulsar's instance (or
# localrun) imports the writer, so every build in this process, and only a later process, may take
# this process's partitions at once (bucket/storage/lease.py, `superseded`).
_INCARNATION = new_incarnation(wall_clock_ms())

# Each service's targetPermissionCheck, for the runtime intake (functions/bucket_snapshot_writer.py
# classifies what process() receives): target_check_of(service).
_TARGET_CHECKS: "weakref.WeakKeyDictionary[SchedulerService, Optional[TargetCheck]]" = weakref.WeakKeyDictionary()


def target_check_of(service: Any) -> Optional[TargetCheck]:
    """The targetPermissionCheck the factory gave `service` (None: off)."""
    return _TARGET_CHECKS.get(service)

__all__ = ["build_service", "default_snapshot_dir", "open_partition_snapshot_storage", "open_writer_snapshot_storage",
           "state_location", "target_check_of"]


def open_writer_snapshot_storage(cfg: WriterConfig, context: Any, resources: List[Any]) -> BucketSnapshotStorage:
    """The configured BucketSnapshotStorage backend; handles to close later go to `resources`."""
    where = snapshot_location(cfg, context)
    log.info("event=bucket_index_location %s", where.describe())
    if where.storage == BOOKKEEPER:
        return bookkeeper_snapshot_storage(where.url, context.get_function_tenant(),
                                           context.get_function_namespace(), context.get_function_name())
    assert where.path is not None
    resources.append(lock_exclusively(where.path))
    return DirectorySnapshotStorage(where.path)


def open_partition_snapshot_storage(cfg: WriterConfig, context: Any, partition: int,
                                    resources: List[Any]) -> Tuple[FencedSnapshotStorage, Callable[[], None]]:
    """Take partition `partition`'s lease (LeaseBusyError while another owner holds it) and open
    its snapshot namespace behind the lease's fence; returns the store and the release check.
    The lease keeper (renews; releases on close) goes to `resources`."""
    # Imported here, as in _build_partitioned: only a partitioned writer takes leases.
    from ..bucket.storage.directory_lease import DirectoryLease
    from .partition_assignment import partition_label

    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    owner = f"{fqfn}/{context.get_instance_id()}/{_INCARNATION}"
    ttl_ms = cfg.partition_lease_seconds * 1000
    where = snapshot_location(cfg, context, per_instance=False)
    log.info("event=bucket_index_location partition=%d %s", partition, where.describe())
    leases: Any
    if where.storage == BOOKKEEPER:
        inner, leases, lease = bookkeeper_partition_storage(
            where.url, context.get_function_tenant(), context.get_function_namespace(),
            context.get_function_name(), partition_label(partition), owner, ttl_ms)
    else:
        assert where.path is not None
        root = where.path / partition_label(partition)
        leases = DirectoryLease(root)
        try:
            lease = leases.acquire(owner, ttl_ms)
        except BaseException:
            leases.close()
            raise
        inner = DirectorySnapshotStorage(root)
    resources.append(LeaseKeeper(leases, lease, ttl_ms).start())
    return FencedSnapshotStorage(inner, leases, lease), lambda: leases.check(lease)


def state_location(context: Any, key_prefix: str) -> str:
    """How to name this instance's dedup state in an error message."""
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    store = getattr(getattr(context, "state", None), "path", None)
    where = f" in {store}" if store is not None else ""
    return f"state key {key_prefix}{STATE_KEY} of {fqfn}{where}"


def build_service(context: Any) -> Union[SchedulerService, PartitionedWriter]:
    """Everything the function needs, built from userConfig and the function's identity: one
    SchedulerService, or with schedulingTopicPartitions one per owned partition."""
    user = dict(context.get_user_config_map() or {})
    scheduling, direct = scheduling_input(context.get_input_topics(), user)
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    cfg = parse_writer_config(user, topic=scheduling, cursor=fqfn)
    if cfg.scheduling_topic_partitions:
        return _build_partitioned(context, cfg, scheduling, direct, fqfn)
    instance = context.get_instance_id()
    return _assemble(context, cfg, _Names(
        topic=scheduling, base_topic=scheduling, producer_name=cfg.producer_name or f"{fqfn}-{instance}-release",
        state_prefix=f"dedup/{instance}/", direct=direct),
        lambda resources: (open_writer_snapshot_storage(cfg, context, resources), None))


def _build_partitioned(context: Any, cfg: WriterConfig, scheduling: str, direct: bool, fqfn: str) -> PartitionedWriter:
    # Imported here: an unpartitioned writer (the shipped config) does not load the partition
    # machinery at its start.
    from .partition_assignment import PartitionAssignment, partition_label
    from .partitioned import PartitionedWriter

    if not direct:
        raise ConfigError("userConfig schedulingTopicPartitions > 0 needs direct intake (schedulingTopic)")
    if normalize_topic(scheduling) in [normalize_topic(t) for t in context.get_input_topics()]:
        raise ConfigError(f"userConfig schedulingTopicPartitions > 0: the scheduling topic {scheduling} must not be a "
                          "function input (each partition's own consumer takes its messages); inputs: tickTopic only")
    assignment = PartitionAssignment(TopicName.parse(scheduling), cfg.scheduling_topic_partitions,
                                     int(context.get_instance_id()), num_instances(context))

    def build_partition(k: int) -> SchedulerService:
        label = partition_label(k)
        names = _Names(topic=assignment.topic_of(k), base_topic=scheduling,
                       producer_name=f"{cfg.producer_name}-{label}" if cfg.producer_name else f"{fqfn}-{label}-release",
                       state_prefix=f"dedup/{label}/", direct=True)
        return _assemble(context, cfg, names, lambda resources: open_partition_snapshot_storage(cfg, context, k, resources))

    log.info("event=writer_partitions topic=%s partitions=%d instance=%d of=%d owned=%s", scheduling,
             assignment.partitions, assignment.instance_id, assignment.num_instances, list(assignment.owned))
    retry_s = min(5.0, max(0.2, cfg.tick_time_millis / 1000.0))
    return PartitionedWriter(cfg, assignment.owned, build_partition, retry_s=retry_s).start()


@dataclass(frozen=True)
class _Names:
    """What one SchedulerService consumes, publishes as and keeps its dedup state under."""

    topic: str  # the scheduling topic (or partition) this service indexes
    base_topic: str  # the configured scheduling topic (the -INVALID topic is named after it)
    producer_name: str
    state_prefix: str
    direct: bool


def _assemble(context: Any, cfg: WriterConfig, names: _Names,
              open_storage: Callable[[List[Any]], Tuple[Any, Optional[Callable[[], None]]]]) -> SchedulerService:
    """One SchedulerService: storage (and its release check), engine, publisher, intake, started."""
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    default_target = context.get_output_topic()
    if not default_target:
        raise ValueError("BucketSnapshotWriter needs `output` (the business topic releases go to)")
    resources: List[Any] = []
    storage: Any = None
    publisher = None
    recovery: Optional["Future[RecoveryReport]"] = None
    try:
        storage, release_check = open_storage(resources)
        deleter = _snapshot_deleter(cfg, context, names.topic)
        if deleter is not None:
            resources.append(deleter)  # closed with the service: its producers before the client
        bucket_cfg = cfg.bucket if names.topic == cfg.bucket.topic else replace(cfg.bucket, topic=names.topic)
        engine = BucketIndex(storage, bucket_cfg, on_snapshot_obsolete=deleter)
        client = pulsar_client(context)
        dedup_state = ContextStateStore(context, prefix=names.state_prefix)
        # The usual restart knows its index without the release producer: its recovery (disk and
        # CPU) runs while the producer opens (round trips to the broker), instead of after it.
        identity = known_identity(storage, dedup_state)
        recovery = _aside(engine.recover) if identity is not None else None
        # The producers' queue holds every round the release pipeline may have in flight, so their
        # back-pressure never serializes the rounds (docs/architecture.md, "Release pipeline").
        publisher = DedupPublisher(client, names.producer_name, dedup_state, key_hashing=cfg.key_hashing,
                                   max_pending_messages=max(1000, cfg.release_batch_size * cfg.release_rounds_in_flight),
                                   batching_max_publish_delay_ms=cfg.release_batching_delay_millis)
        published = publisher.open(default_target)
        if identity is None:
            # Before recovery: a new index gets its sequence base written into its cursor here.
            identity = check_index_identity(storage, dedup_state,
                                            state_location=state_location(context, names.state_prefix),
                                            published_seq=max(0, published), replace_index_id=cfg.replace_index_id)
        # No role reaches through the writer what it may not reach itself (docs/security.md).
        permissions = _target_permissions(cfg, context, names.topic, default_target)
        if permissions is not None:
            resources.append(permissions.source)
        target_check = permissions.refusal if permissions is not None else None
        source_factory = None
        runtime_input = None
        if names.direct:
            sub = SchedulingSubscription(
                topic=names.topic, subscription=cfg.scheduling_subscription or fqfn,
                batch_size=cfg.ingest_batch_size, batch_delay_ms=cfg.ingest_batch_delay_millis,
                max_delay_ms=cfg.max_delay_seconds * 1000, allowed_target_prefixes=cfg.allowed_target_prefixes,
                target_check=target_check)
            # The scheduling topic as an input only starts the writer: the service closes it (runtime_input.py).
            runtime_input = RuntimeInput.of_input(context, names.topic)
            # What a dead consumer holds is read only while no other instance shares the subscription
            # (intake_gaps.py): another instance's share would look the same.
            sole_consumer = bool(cfg.scheduling_topic_partitions) or num_instances(context) <= 1
            rules = GapClassifier(sub.max_delay_ms, sub.allowed_target_prefixes, target_check)
            source_factory = lambda: SchedulingConsumer(client, sub, gaps=intake_gaps_for(  # noqa: E731 - opened after recovery
                client, names.topic, engine, dedup_state, identity.index_id, rules, sole_consumer))
        sender: Any = publisher
        if release_check is not None:  # a partition's lease fences its releases
            from .partitioned import FencedPublisher

            sender = FencedPublisher(publisher, release_check)
        service = SchedulerService(engine, sender, cfg, default_target,
                                   cfg.invalid_message_topic or f"{names.base_topic}-INVALID",
                                   client, context.record_metric, resources=resources, source_factory=source_factory,
                                   runtime_input=runtime_input, reply_topic=cancel_reply_topic(names.topic),
                                   dead_letter_topic=cfg.dead_letter_topic or f"{names.base_topic}-DLQ")
        if runtime_input is not None and cfg.tick_topic:
            # A start that fails once the runtime's input is closed has no redelivered scheduling
            # message to retry it: a tick does (the hook arm_wake sets once the service runs).
            service.on_failure = lambda: wake_after_failure(client, cfg.tick_topic, cfg.tick_time_millis)
        _TARGET_CHECKS[service] = target_check
        for res in resources:
            if isinstance(res, LeaseKeeper):  # a partition's: a lost lease stops the service at once
                res.watch(service.fence)
        service.start(recovered=recovery.result() if recovery is not None else None)
    except BaseException:
        if recovery is not None:
            recovery.exception()  # waits: the storage closed below is the one it reads
        # The next process() call builds again: the snapshot-directory lock (or the partition's
        # lease) must not outlive this try.
        if publisher is not None:
            publisher.close(timeout_s=5)
        if storage is not None and callable(getattr(storage, "close", None)):
            storage.close()
        for res in resources:
            res.close()
        raise
    return service


def _aside(fn: Callable[[], _T]) -> "Future[_T]":
    """fn() on a thread of its own; its result, or what it raised, in the returned future."""
    done: "Future[_T]" = Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to whoever waits for the result
            done.set_exception(exc)

    threading.Thread(target=run, name="bucket-recover", daemon=True).start()
    return done


def _target_permissions(cfg: WriterConfig, context: Any, topic: str, default_target: str) -> Any:
    """The writer's TargetPermissionCheck, or None (targetPermissionCheck off, or auto without pulsarAdminUrl)."""
    if cfg.target_permission_check == "off" or (cfg.target_permission_check == "auto" and not cfg.pulsar_admin_url):
        log.info("event=target_permission_check state=off reason='targetPermissionCheck=%s%s'",
                 cfg.target_permission_check, "" if cfg.target_permission_check == "off" else ", no pulsarAdminUrl")
        return None
    # Imported here: the admin client pulls in requests (as _snapshot_deleter's imports do).
    from .permission_source import target_permission_check

    return target_permission_check(cfg, context, topic, default_target)


def _snapshot_deleter(cfg: WriterConfig, context: Any, scheduling_topic: str) -> Any:
    """None (engine deletes directly) or the two-phase deletion hand-off."""
    if cfg.snapshot_deletion != "two-phase":
        return None
    # Imported here: the deletion service pulls in requests and the admin client (~0.1 s of every
    # writer start), and only snapshotDeletion=two-phase uses it.
    from ..deletion.service import LedgerDeletionService
    from ..deletion.topics import DeletionTopics
    from ..timing import DelayedProducer
    from .snapshot_deletion import TwoPhaseSnapshotDeleter

    client = pulsar_client(context)
    topics = DeletionTopics(namespace=cfg.snapshot_deletion_namespace, topic_name=cfg.snapshot_deletion_topic_name,
                            parallelism=cfg.snapshot_deletion_parallelism)
    delayed = DelayedProducer(client, backend="scheduler", scheduling_topic=scheduling_topic)
    service = LedgerDeletionService(client, topics=topics, delayed=delayed,
                                    send_delay_seconds=cfg.snapshot_deletion_send_delay_seconds)
    return TwoPhaseSnapshotDeleter(service, scheduling_topic)
