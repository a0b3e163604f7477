"""userConfig of BucketSnapshotWriter: parsed once, unknown keys rejected."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..bucket.config import BucketConfig
from ..dedup.publisher import normalize_topic

# userConfig key -> (attribute, default, meaning). docs/configuration.md is generated from this.
WRITER_KEYS: Dict[str, tuple] = {
    "schedulingTopic": ("scheduling_topic", "", "Direct intake: the scheduling topic the writer consumes itself, in batches, through the runtime's client. Keep it also a function input (on the same subscription, e.g. `receiverQueueSize: 1`, as the shipped config does) so the first scheduling message starts a fresh deployment; then the inputs are it and `tickTopic`. Empty = runtime intake: the one input besides `tickTopic` is the scheduling topic, one message per process() call (about 3x slower, see docs/benchmarks.md)."),
    "schedulingSubscription": ("scheduling_subscription", "", "Subscription of the direct-intake consumer (Shared, Earliest); default `<tenant>/<namespace>/<name>`, the runtime's default subscription name. When the scheduling topic is also an input it must be the function's subscription (`subName`, or the default)."),
    "snapshotStorage": ("snapshot_storage", "directory", "Where bucket snapshots live: `directory` (embedded, default) or `bookkeeper` (BookKeeper table service)."),
    "snapshotDir": ("snapshot_dir", "", "Directory of the embedded snapshot store. Under `pulsar-lifecycle localrun` the default is `<--data-dir>/buckets/<tenant>_<namespace>_<name>` (`-instance-<i>` appended for instances after the first), next to the function state; anywhere else it must be set (or use `bookkeeper`)."),
    "replaceIndexId": ("replace_index_id", "", "Set only when the writer refuses to start because its bucket index is missing or not the one its dedup state follows, and that index is lost for good: the id the error names. The writer then starts a new index (the lost index's pending messages are gone); a stale value is harmless."),
    "snapshotStorageServiceUrl": ("snapshot_storage_service_url", "", "`bk://host:4181` of the table service when snapshotStorage is `bookkeeper`."),
    "allowedTargetPrefix": ("allowed_target_prefix", "", "Per-message targets (`__pl_target__`) must start with this prefix; empty = per-message targets refused."),
    "maxDelaySeconds": ("max_delay_seconds", 400 * 86400, "Deliver-at times further than this in the future are refused (sent to invalidMessageTopic)."),
    "invalidMessageTopic": ("invalid_message_topic", "", "Where malformed scheduling messages go, with the reason in `__pl_error__`; default `<first input>-INVALID`."),
    "tickTopic": ("tick_topic", "", "Input topic of wake ticks: at each start the writer sends one and keeps one unacked, which Pulsar redelivers to the next instance after a restart, so it wakes with an idle scheduling topic (docs/architecture.md, \"Clock\")."),
    "tickMode": ("tick_mode", "runner", "`hold` (shipped): only the held wake tick; `runner`: also the local runner sends a tick every tickTimeMillis (extra ticks are acked, never re-sent); `chain`: the retired deliver_after chain, now the same as `hold` (a chain multiplied with every extra tick and ran away on brokers that ignore deliver_after)."),
    "tickTimeMillis": ("tick_time_millis", 1000, "Longest idle wait of the release thread, and the local runner's tick period in `runner` mode (Pulsar's delayedDeliveryTickTimeMillis)."),
    "ingestBatchSize": ("ingest_batch_size", 500, "Scheduling messages made durable together in one journal write before they are acked."),
    "ingestBatchDelayMillis": ("ingest_batch_delay_millis", 5, "Longest wait to fill an ingest batch."),
    "releaseBatchSize": ("release_batch_size", 1000, "Releases taken from the index per round."),
    "commitIntervalMillis": ("commit_interval_millis", 100, "How often the release watermark is made durable (re-released after a crash at most this much; dedup drops them)."),
    "producerName": ("producer_name", "", "Stable producer name of the release publisher; default `<tenant>/<namespace>/<name>-<instance>-release`."),
    "metricsIntervalSeconds": ("metrics_interval_seconds", 10, "How often the pulsar_delayed_message_index_* metrics are recorded."),
    "snapshotDeletion": ("snapshot_deletion", "direct", "How exhausted/merged snapshots are removed: `direct` (delete from the store) or `two-phase` (a DELAYED_INDEX_BUCKET request to LedgerDeletionWorker, PIP-186)."),
    "snapshotDeletionNamespace": ("snapshot_deletion_namespace", "pulsar/system", "Namespace of the deletion topics used with `two-phase` (the worker's deletionNamespace); targets under it are always allowed."),
    "snapshotDeletionTopicName": ("snapshot_deletion_topic_name", "__ledger_deletion", "Deletion topic base name (the worker's deletionTopicName)."),
    "snapshotDeletionParallelism": ("snapshot_deletion_parallelism", 4, "Partitions of the deletion topic (the worker's ledgerDeletionParallelism)."),
    "snapshotDeletionSendDelaySeconds": ("snapshot_deletion_send_delay_seconds", 60, "Phase-one send delay of snapshot deletion requests (sendDelaySeconds); delayed through this writer itself."),
}


TICK_MODES = ("hold", "runner", "chain")


@dataclass(frozen=True)
class WriterConfig:
    """BucketSnapshotWriter settings plus the bucket engine's (BucketConfig)."""

    scheduling_topic: str = ""
    scheduling_subscription: str = ""
    snapshot_storage: str = "directory"
    snapshot_dir: str = ""
    replace_index_id: str = ""
    snapshot_storage_service_url: str = ""
    allowed_target_prefix: str = ""
    max_delay_seconds: int = 400 * 86400
    invalid_message_topic: str = ""
    tick_topic: str = ""
    tick_mode: str = "runner"
    tick_time_millis: int = 1000
    ingest_batch_size: int = 500
    ingest_batch_delay_millis: int = 5
    release_batch_size: int = 1000
    commit_interval_millis: int = 100
    producer_name: str = ""
    metrics_interval_seconds: int = 10
    snapshot_deletion: str = "direct"
    snapshot_deletion_namespace: str = "pulsar/system"
    snapshot_deletion_topic_name: str = "__ledger_deletion"
    snapshot_deletion_parallelism: int = 4
    snapshot_deletion_send_delay_seconds: int = 60
    bucket: BucketConfig = field(default_factory=BucketConfig)

    @property
    def allowed_target_prefixes(self) -> tuple:
        """Per-message targets accepted: the configured prefix, plus the deletion topics with two-phase."""
        out = [self.allowed_target_prefix] if self.allowed_target_prefix else []
        if self.snapshot_deletion == "two-phase":
            out.append(f"persistent://{self.snapshot_deletion_namespace}/{self.snapshot_deletion_topic_name}")
        return tuple(out)

    def __post_init__(self) -> None:
        if self.snapshot_storage not in ("directory", "bookkeeper"):
            raise ValueError(f"userConfig snapshotStorage must be 'directory' or 'bookkeeper', got {self.snapshot_storage!r}")
        if self.snapshot_storage == "bookkeeper" and not self.snapshot_storage_service_url.startswith("bk://"):
            raise ValueError("userConfig snapshotStorage=bookkeeper needs snapshotStorageServiceUrl bk://host:port")
        if self.tick_mode not in TICK_MODES:
            raise ValueError(f"userConfig tickMode must be one of {', '.join(repr(m) for m in TICK_MODES)}, "
                             f"got {self.tick_mode!r}")
        for name in ("max_delay_seconds", "tick_time_millis", "ingest_batch_size", "release_batch_size",
                     "commit_interval_millis", "metrics_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"userConfig {_key_of(name)} must be > 0, got {getattr(self, name)!r}")
        if self.snapshot_deletion not in ("direct", "two-phase"):
            raise ValueError(f"userConfig snapshotDeletion must be 'direct' or 'two-phase', got {self.snapshot_deletion!r}")
        if self.snapshot_deletion_parallelism <= 0 or self.snapshot_deletion_send_delay_seconds < 0:
            raise ValueError("userConfig snapshotDeletionParallelism must be > 0 and snapshotDeletionSendDelaySeconds >= 0")
        if self.ingest_batch_delay_millis < 0:
            raise ValueError("userConfig ingestBatchDelayMillis must be >= 0")


def _key_of(attr: str) -> str:
    return next(k for k, v in WRITER_KEYS.items() if v[0] == attr)


def bucket_keys() -> Dict[str, str]:
    """userConfig names of the bucket engine settings (Pulsar's broker.conf names)."""
    out = {}
    for f in fields(BucketConfig):
        if f.name in ("topic", "cursor"):
            continue
        parts = f.name.split("_")
        out[parts[0] + "".join(p.capitalize() for p in parts[1:])] = f.name
    return out


def all_user_config_keys() -> list:
    """Every userConfig key BucketSnapshotWriter understands."""
    return sorted(list(WRITER_KEYS) + list(bucket_keys()))


def parse_writer_config(user_config: Optional[Mapping[str, Any]], topic: str = "", cursor: str = "") -> WriterConfig:
    """userConfig -> WriterConfig; an unknown key is an error listing the valid ones."""
    writer: Dict[str, Any] = {}
    bucket: Dict[str, Any] = {"topic": topic, "cursor": cursor}
    bkeys = bucket_keys()
    for key, value in (user_config or {}).items():
        if key in WRITER_KEYS:
            attr, default, _ = WRITER_KEYS[key]
            if isinstance(default, int) and not isinstance(default, bool):
                try:
                    value = int(value)  # --user-config JSON goes through Gson: 5 -> 5.0
                except (TypeError, ValueError):
                    raise ValueError(f"userConfig {key} must be an integer, got {value!r}") from None
            elif not isinstance(value, str):
                raise ValueError(f"userConfig {key} must be a string, got {value!r}")
            writer[attr] = value
        elif key in bkeys:
            bucket[bkeys[key]] = int(value)
        else:
            raise ValueError(f"unknown userConfig key {key!r} for BucketSnapshotWriter; valid keys: {all_user_config_keys()}")
    return WriterConfig(bucket=BucketConfig(**bucket), **writer)


def scheduling_input(input_topics: Sequence[str], user: Mapping[str, Any]) -> Tuple[str, bool]:
    """(scheduling topic, direct intake?) from the function's inputs and userConfig.

    Direct intake (`schedulingTopic` set): the inputs are the tick topic and, so that the first
    scheduling message starts the function, optionally the scheduling topic itself. Runtime
    intake: exactly one input besides the tick topic.
    """
    inputs = [normalize_topic(t) for t in input_topics]
    tick = normalize_topic(str(user["tickTopic"])) if user.get("tickTopic") else ""
    others = [t for t in inputs if t != tick]
    if user.get("schedulingTopic"):
        topic = normalize_topic(str(user["schedulingTopic"]))
        if not tick or tick not in inputs:
            raise ValueError("userConfig schedulingTopic (direct intake) needs tickTopic, and the tick topic as the "
                             "function's input: ticks start the function and wake it after a restart")
        others = [t for t in others if t != topic]
        if others:
            raise ValueError(f"userConfig schedulingTopic={topic} (direct intake): the inputs may be only tickTopic "
                             f"and the scheduling topic, but they also have {others}: remove them from inputs/inputSpecs")
        return topic, True
    if len(others) != 1:
        raise ValueError(f"BucketSnapshotWriter needs exactly one scheduling input besides tickTopic (or userConfig "
                         f"schedulingTopic for direct intake), got {others}")
    return others[0], False


def check_function_config(cfg: Mapping[str, Any]) -> List[str]:
    """What `validate` can tell about a BucketSnapshotWriter config beyond field types: values
    of known userConfig keys (unknown keys are reported by the key check) and the inputs."""
    user = cfg.get("userConfig") if isinstance(cfg.get("userConfig"), Mapping) else {}
    known = {k: v for k, v in user.items() if k in WRITER_KEYS or k in bucket_keys()}
    inputs: List[str] = [t for t in (cfg.get("inputs") or []) if isinstance(t, str)]
    for key in ("inputSpecs", "customSerdeInputs"):
        if isinstance(cfg.get(key), Mapping):
            inputs += [t for t in cfg[key] if isinstance(t, str)]
    problems = []
    sched = normalize_topic(str(known["schedulingTopic"])) if known.get("schedulingTopic") else ""
    if sched and sched in [normalize_topic(t) for t in inputs]:
        fqfn = f"{cfg.get('tenant', 'public')}/{cfg.get('namespace', 'default')}/{cfg.get('name', '')}"
        function_sub = cfg.get("subName") or fqfn
        if (known.get("schedulingSubscription") or fqfn) != function_sub:
            problems.append(f"the scheduling topic is also an input: userConfig schedulingSubscription "
                            f"({known.get('schedulingSubscription') or fqfn!r}) must be the function's subscription "
                            f"({function_sub!r}), or the two consumers get every message each")
    for check in (lambda: parse_writer_config(known), lambda: scheduling_input(inputs, known)):
        try:
            check()
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
    return problems
