"""Wiring BucketSnapshotWriter from its Context: storage, engine, publisher, service."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..bucket import BucketIndex
from ..bucket.storage_dir import DirectorySnapshotStorage
from ..dedup.publisher import DedupPublisher
from .config import WriterConfig, parse_writer_config
from .context_state import ContextStateStore
from .service import SchedulerService

log = logging.getLogger(__name__)


def open_snapshot_storage(cfg: WriterConfig, context: Any) -> Any:
    """The configured BucketSnapshotStorage backend."""
    table = f"{context.get_function_tenant()}_{context.get_function_namespace()}_{context.get_function_name()}".replace("-", "_")
    if cfg.snapshot_storage == "bookkeeper":
        from ..bucket.storage_bk import BookKeeperTableSnapshotStorage

        return BookKeeperTableSnapshotStorage(cfg.snapshot_storage_service_url, context.get_function_tenant(),
                                              context.get_function_namespace(), f"{context.get_function_name()}_buckets".replace("-", "_"))
    path = Path(cfg.snapshot_dir) if cfg.snapshot_dir else Path(".pulsar-lifecycle") / "buckets" / table
    return DirectorySnapshotStorage(path)


def build_service(context: Any) -> SchedulerService:
    """Everything the function needs, built from userConfig and the function's identity."""
    inputs = context.get_input_topics()
    user = dict(context.get_user_config_map() or {})
    tick = user.get("tickTopic") or ""
    scheduling = [t for t in inputs if t != tick]
    if len(scheduling) != 1:
        raise ValueError(f"BucketSnapshotWriter needs exactly one scheduling input besides tickTopic, got {scheduling}")
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    cfg = parse_writer_config(user, topic=scheduling[0], cursor=fqfn)
    default_target = context.get_output_topic()
    if not default_target:
        raise ValueError("BucketSnapshotWriter needs `output` (the business topic releases go to)")
    storage = open_snapshot_storage(cfg, context)
    engine = BucketIndex(storage, cfg.bucket)
    producer_name = cfg.producer_name or f"{fqfn}-{context.get_instance_id()}-release"
    publisher = DedupPublisher(context.get_pulsar_client(), producer_name,
                               ContextStateStore(context, prefix=f"dedup/{context.get_instance_id()}/"))
    publisher.open(default_target)
    service = SchedulerService(engine, publisher, cfg, default_target,
                               cfg.invalid_message_topic or f"{scheduling[0]}-INVALID",
                               context.get_pulsar_client(), context.record_metric)
    service.start()
    return service
