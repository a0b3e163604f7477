"""userConfig of BucketSnapshotWriter: declared once as WriterConfig fields (config/settings.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..bucket.config import BucketConfig
from ..config.settings import (
    ConfigError,
    check_settings,
    parse_settings,
    read_setting,
    setting,
    settings_of,
    to_int,
    to_str,
    user_config_keys,
)
from ..dedup.partition_router import DEFAULT_KEY_HASHING, KEY_HASHINGS
from ..topics import normalize_topic

if TYPE_CHECKING:
    from ..config.system import FunctionTopology

# Not imported here: the deletion package and config.system (what `validate --system` reads) are
# not on a writer's start path; importing them cost every start 15-35 ms (writer_topology and
# _http_urls import them when called).

TICK_MODES = ("hold", "runner", "chain")
#: snapshotStorage values: `auto` decides per runtime (scheduler/snapshot_location.py).
SNAPSHOT_STORAGES = ("auto", "directory", "bookkeeper")
# The snapshotDeletion* keys mirror the LedgerDeletionWorker's and have its defaults: DeletionTopics'
# namespace, topic name and parallelism (deletion/topics.py) and DeletionConfig's sendDelaySeconds.
_WORKER = {"deletion_namespace": "pulsar/system", "deletion_topic_name": "__ledger_deletion",
           "ledger_deletion_parallelism": 4, "send_delay_seconds": 60}


def _http_urls(key: str, value: Any) -> Tuple[str, ...]:
    """pulsarAdminUrl's converter, the LedgerDeletionWorker's (deletion/config.py to_http_urls)."""
    from ..deletion.config import to_http_urls

    return to_http_urls(key, value)


@dataclass(frozen=True)
class WriterConfig:
    """BucketSnapshotWriter settings (one field per userConfig key) plus the bucket engine's
    (BucketConfig, whose keys the writer also reads)."""

    scheduling_topic: str = setting(
        'schedulingTopic', '',
        "Direct intake: the scheduling topic the writer consumes itself, in batches, through the runtime's client. Keep it also a function input (on the same subscription, e.g. `receiverQueueSize: 1`, as the shipped config does) so the first scheduling message starts a fresh deployment; then the inputs are it and `tickTopic`. Empty = runtime intake: the one input besides `tickTopic` is the scheduling topic, one message per process() call (about 3x slower, see docs/benchmarks.md).")
    scheduling_subscription: str = setting(
        'schedulingSubscription', '',
        "Subscription of the direct-intake consumer (Shared, Earliest); default `<tenant>/<namespace>/<name>`, the runtime's default subscription name. When the scheduling topic is also an input it must be the function's subscription (`subName`, or the default).")
    snapshot_storage: str = setting(
        'snapshotStorage', 'auto',
        "Where the bucket index lives. `auto`: where the runtime keeps function state: under Pulsar's runtime (`functions create`) on the BookKeeper table service the instance was given for its state (the worker's `stateStorageServiceUrl`; the writer refuses to start, naming snapshotStorageServiceUrl and snapshotDir, on a worker without one), under `pulsar-lifecycle localrun` in a directory next to its function state (snapshotDir's default); a set snapshotDir or snapshotStorageServiceUrl picks that place instead. `directory`: the directory snapshotDir. `bookkeeper`: the table service at snapshotStorageServiceUrl.",
        choices=SNAPSHOT_STORAGES)
    snapshot_dir: str = setting(
        'snapshotDir', '',
        'Directory of the snapshot store (with `directory`, or `auto` when set). Under `pulsar-lifecycle localrun` the default is `<--data-dir>/buckets/<tenant>_<namespace>_<name>` (`-instance-<i>` appended for instances after the first), next to the function state; under Pulsar\'s runtime there is none (a worker\'s working directory is neither durable nor kept when the instance moves): an absolute path every instance reaches, on durable storage.')
    replace_index_id: str = setting(
        'replaceIndexId', '',
        "Set only when the writer refuses to start because its bucket index is missing or not the one its dedup state follows, and that index is lost for good: the id the error names. The writer then starts a new index (the lost index's pending messages are gone); a stale value is harmless.")
    snapshot_storage_service_url: str = setting(
        'snapshotStorageServiceUrl', '',
        '`bk://host:4181` of the BookKeeper table service keeping the index: required with `bookkeeper`; with `auto` it replaces the function state\'s table service.')
    allowed_target_prefix: Tuple[str, ...] = setting(
        'allowedTargetPrefix', (),
        'Per-message targets (`__pl_target__`) must start with one of these prefixes: a list, or one string (several comma-separated, for `--user-config` JSON); empty = per-message targets refused. List every target the functions that delay through this writer use (the shipped config: `persistent://public/default/` and the deletion topics `persistent://pulsar/system/__ledger_deletion`).')
    target_permission_check: str = setting(
        'targetPermissionCheck', 'auto',
        "Release to a target only what every role that may produce to the scheduling topic may produce there itself (tenant admins included, super users aside): a message whose target (or, without `__pl_target__`, the output) fails goes to the `-INVALID` topic naming the roles that lack produce on it, never indexed. Grants are read from the admin API at `pulsarAdminUrl` with the token in `adminTokenSecret`. `auto`: on when `pulsarAdminUrl` is set and the broker refuses an anonymous admin read (authentication on); off on pulsar-lite or an open broker. `on`: always (needs `pulsarAdminUrl`). `off`: never (docs/security.md).",
        choices=('auto', 'on', 'off'))
    target_permission_cache_seconds: int = setting(
        'targetPermissionCacheSeconds', 60,
        "How long the grants read for targetPermissionCheck (and the decisions on them) are kept before they are read again; a grant or revocation takes effect within this time.",
        minimum=0)
    pulsar_admin_url: Tuple[str, ...] = setting(
        'pulsarAdminUrl', (),
        "Admin REST URL(s), comma-separated or a list, tried in turn (the LedgerDeletionWorker's key): where targetPermissionCheck reads grants; empty = no check.",
        convert=_http_urls)
    admin_token_secret: Optional[str] = setting(
        'adminTokenSecret', None,
        "Name of a function secret holding a Bearer token for the admin API (the LedgerDeletionWorker's key): a tenant admin of the scheduling topic's and the targets' tenants, or a super user.",
        convert=to_str)
    max_delay_seconds: int = setting(
        'maxDelaySeconds', 400 * 86400,
        'Deliver-at times further than this in the future are refused (sent to invalidMessageTopic).',
        minimum=1)
    unknown_cancel_retention_seconds: int = setting(
        'unknownCancelRetentionSeconds', 86400,
        "How long a cancel of an id the writer has not indexed is kept (its tombstone), in case its message is still on its way to the writer (redelivered after a crash, behind a backlog): the message is dropped when it comes within this time and delivered after it. `delayed cancel` answers such a cancel `not known (yet)` and names this time. The id a cancel names is the position of a message already stored on the scheduling topic, so the race is only as long as the writer's intake lags (an outage, a backlog): one day covers a writer down for a day, at one bit and one map entry per unknown id. A restart starts the time again for the tombstones it recovers.",
        minimum=1)
    invalid_message_topic: str = setting(
        'invalidMessageTopic', '',
        'Where malformed scheduling messages go, with the reason in `__pl_error__`; default `<first input>-INVALID`.')
    tick_topic: str = setting(
        'tickTopic', '',
        'Input topic of wake ticks: at each start the writer sends one and keeps one unacked, which Pulsar redelivers to the next instance after a restart, so it wakes with an idle scheduling topic (docs/architecture.md, "Clock").')
    tick_mode: str = setting(
        'tickMode', 'runner',
        '`hold` (shipped): only the held wake tick; `runner`: also the local runner sends a tick every tickTimeMillis (extra ticks are acked, never re-sent); `chain`: the retired deliver_after chain, now the same as `hold` (a chain multiplied with every extra tick and ran away on brokers that ignore deliver_after).',
        choices=TICK_MODES)
    tick_time_millis: int = setting(
        'tickTimeMillis', 1000,
        "Longest idle wait of the release thread, and the local runner's tick period in `runner` mode (Pulsar's delayedDeliveryTickTimeMillis).",
        minimum=1)
    ingest_batch_size: int = setting(
        'ingestBatchSize', 500,
        'Scheduling messages made durable together in one journal write before they are acked.',
        minimum=1)
    ingest_batch_delay_millis: int = setting(
        'ingestBatchDelayMillis', 5,
        'Longest wait to fill an ingest batch.',
        minimum=0)
    release_batch_size: int = setting(
        'releaseBatchSize', 1000,
        'Releases taken from the index per round.',
        minimum=1)
    release_rounds_in_flight: int = setting(
        'releaseRoundsInFlight', 4,
        'Release rounds sent and not yet confirmed by the broker before the release thread waits: the next round is popped and sent while up to this many wait for their confirmations (the release watermark still only passes confirmed rounds). 1 = one round at a time.',
        minimum=1)
    release_batching_delay_millis: int = setting(
        'releaseBatchingDelayMillis', 1,
        "How long a release producer holds a batch open for more messages before sending it (the client's batchingMaxPublishDelay). A full round fills its batches and goes at once; a due message released alone waits up to this long. 1 = the Java client's default (pulsar-client for Python and C++ default to 10).",
        minimum=1, maximum=1000)
    commit_interval_millis: int = setting(
        'commitIntervalMillis', 100,
        'How often the release watermark is made durable (re-released after a crash at most this much; dedup drops them).',
        minimum=1)
    producer_name: str = setting(
        'producerName', '',
        'Stable producer name of the release publisher; default `<tenant>/<namespace>/<name>-<instance>-release`.')
    metrics_interval_seconds: int = setting(
        'metricsIntervalSeconds', 10,
        'How often the pulsar_delayed_message_index_* metrics are recorded.',
        minimum=1)
    snapshot_deletion: str = setting(
        'snapshotDeletion', 'direct',
        'How exhausted/merged snapshots are removed: `direct` (delete from the store) or `two-phase` (a DELAYED_INDEX_BUCKET request to LedgerDeletionWorker, PIP-186).',
        choices=("direct", "two-phase"))
    snapshot_deletion_namespace: str = setting(
        'snapshotDeletionNamespace', _WORKER['deletion_namespace'],
        "Namespace of the deletion topics used with `two-phase` (the worker's deletionNamespace); targets under it are always allowed.")
    snapshot_deletion_topic_name: str = setting(
        'snapshotDeletionTopicName', _WORKER['deletion_topic_name'],
        "Deletion topic base name (the worker's deletionTopicName).")
    snapshot_deletion_parallelism: int = setting(
        'snapshotDeletionParallelism', _WORKER['ledger_deletion_parallelism'],
        "Partitions of the deletion topic (the worker's ledgerDeletionParallelism).",
        minimum=1)
    snapshot_deletion_send_delay_seconds: int = setting(
        'snapshotDeletionSendDelaySeconds', _WORKER['send_delay_seconds'],
        'Phase-one send delay of snapshot deletion requests (sendDelaySeconds); delayed through this writer itself.',
        minimum=0)
    scheduling_topic_partitions: int = setting(
        'schedulingTopicPartitions', 0,
        "Partitions of `schedulingTopic` (a partitioned topic; partitions are addressed by name, `<topic>-partition-<k>`). 0 = not partitioned: one writer instance owns the whole topic. With N > 0 instance i of the function's `parallelism` owns the partitions k with k % parallelism == i, each with its own index (`<snapshotDir>/partition-<k>` or the table prefix `bucket/partition-<k>/`), dedup producer, watermark and lease (docs/scaling.md). Needs direct intake, and the scheduling topic must then not be a function input.",
        minimum=0)
    partition_lease_seconds: int = setting(
        'partitionLeaseSeconds', 30,
        "With schedulingTopicPartitions: how long a partition's lease lasts without renewal (renewed every third of it). A new owner takes a partition when its lease is released, expired, or its holder's process is gone (directory store); a paused old owner is fenced by the lease epoch (docs/scaling.md).",
        minimum=1)
    key_hashing: str = setting(
        'keyHashing', DEFAULT_KEY_HASHING,
        "How a keyed release to a partitioned target picks its partition: `java_string` (Pulsar's Java client default, JavaStringHash: the partition a Java producer sends that key to) or `murmur3_32` (Murmur3_32Hash, the Java client's other choice). Unkeyed releases go by their own id, so a replay picks the same partition.",
        choices=tuple(KEY_HASHINGS))
    target_retry_seconds: int = setting(
        'targetRetrySeconds', 60,
        "How long releases to a target the writer cannot publish to (open or send refused) are held and retried (backoff 0.5 s doubling to 10 s) before they go to `deadLetterTopic`; other targets are released on time meanwhile.",
        minimum=0)
    dead_letter_topic: str = setting(
        'deadLetterTopic', '',
        'Where releases whose target kept refusing them go, with the reason in `__pl_error__` and the target in `__pl_dead_target__`; default `<scheduling topic>-DLQ`.')
    bucket: BucketConfig = field(default_factory=BucketConfig)

    @property
    def allowed_target_prefixes(self) -> tuple:
        """Per-message targets accepted: the configured prefixes, plus the deletion topics with two-phase."""
        out = list(self.allowed_target_prefix)
        if self.snapshot_deletion == "two-phase":
            out.append(f"persistent://{self.snapshot_deletion_namespace}/{self.snapshot_deletion_topic_name}")
        return tuple(out)

    def __post_init__(self) -> None:
        check_settings(self)
        url = self.snapshot_storage_service_url
        if self.snapshot_storage == "bookkeeper" and not url.startswith("bk://"):
            raise ConfigError("userConfig snapshotStorage=bookkeeper needs snapshotStorageServiceUrl bk://host:port")
        if self.snapshot_storage == "auto" and url and not url.startswith("bk://"):
            raise ConfigError(f"userConfig snapshotStorageServiceUrl must be bk://host:port, got {url!r}")
        if self.snapshot_storage == "auto" and url and self.snapshot_dir:
            raise ConfigError("userConfig snapshotDir and snapshotStorageServiceUrl are both set: set snapshotStorage "
                              "to directory or bookkeeper to say which one keeps the bucket index")

    @classmethod
    def from_user_config(cls, user_config: Optional[Mapping[str, Any]], topic: str = "",
                         cursor: str = "") -> "WriterConfig":
        """userConfig -> WriterConfig (bucket keys go to its BucketConfig); an unknown key is an
        error listing the valid ones."""
        bucket = parse_settings(BucketConfig, _pick(user_config, BucketConfig), function=FUNCTION,
                                extra={"topic": topic, "cursor": cursor})
        return parse_settings(cls, user_config, function=FUNCTION, also_known=list(settings_of(BucketConfig)),
                              extra={"bucket": bucket})


FUNCTION = "BucketSnapshotWriter"


def _pick(user_config: Optional[Mapping[str, Any]], cls: type) -> Dict[str, Any]:
    known = settings_of(cls)
    return {k: v for k, v in (user_config or {}).items() if k in known}


def all_user_config_keys() -> List[str]:
    """Every userConfig key BucketSnapshotWriter understands."""
    return user_config_keys(WriterConfig, BucketConfig)


def parse_writer_config(user_config: Optional[Mapping[str, Any]], topic: str = "", cursor: str = "") -> WriterConfig:
    """userConfig -> WriterConfig (WriterConfig.from_user_config)."""
    return WriterConfig.from_user_config(user_config, topic=topic, cursor=cursor)


def scheduling_input(input_topics: Sequence[str], user: Mapping[str, Any]) -> Tuple[str, bool]:
    """(scheduling topic, direct intake?) from the function's inputs and userConfig.

    Direct intake (`schedulingTopic` set): the inputs are the tick topic and, so that the first
    scheduling message starts the function, optionally the scheduling topic itself. Runtime
    intake: exactly one input besides the tick topic.
    """
    inputs = [normalize_topic(t) for t in input_topics]
    tick_topic = read_setting(user, "tickTopic", to_str, "")
    tick = normalize_topic(tick_topic) if tick_topic else ""
    others = [t for t in inputs if t != tick]
    scheduling_topic = read_setting(user, "schedulingTopic", to_str, "")
    if scheduling_topic:
        topic = normalize_topic(scheduling_topic)
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


def _tick_spread_problems(cfg: Mapping[str, Any], tick_topic: str, partitions: int) -> List[str]:
    # Several instances of a partitioned writer are each started by a tick; with a receiver queue
    # above 1 the broker may hand every tick to one instance (pulsar-lite did) and the others,
    # with their partitions, never start.
    try:
        parallelism = int(cfg.get("parallelism") or 1)
    except (TypeError, ValueError):
        return []  # a bad value: reported by the field check
    specs = cfg.get("inputSpecs")
    if parallelism <= 1 or not tick_topic:
        return []
    if not isinstance(specs, Mapping):
        specs = {}
    tick = normalize_topic(tick_topic)
    for topic, spec in specs.items():
        if isinstance(topic, str) and normalize_topic(topic) == tick:
            queue = spec.get("receiverQueueSize") if isinstance(spec, Mapping) else None
            if queue != 1:
                return [f"userConfig schedulingTopicPartitions={partitions} with parallelism {parallelism}: the "
                        f"tick input {tick_topic} needs receiverQueueSize: 1 (is {queue!r}) so the ticks "
                        "reach every instance; with a larger queue one instance may take them all and the "
                        "others never start"]
            return []
    return [f"userConfig schedulingTopicPartitions={partitions} with parallelism {parallelism}: declare the "
            f"tick input {tick_topic} under inputSpecs with receiverQueueSize: 1 so the ticks reach every instance"]


def check_writer_inputs(cfg: Mapping[str, Any]) -> List[str]:
    """What `validate` can tell about a BucketSnapshotWriter config's inputs beyond field types:
    the intake's inputs and one subscription for the scheduling topic's two consumers (the
    values of its userConfig keys are checked by the registry, through WriterConfig)."""
    raw = cfg.get("userConfig")
    user: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    known = {k: v for k, v in user.items() if k in all_user_config_keys()}

    def text(key: str) -> str:
        try:
            return str(read_setting(known, key, to_str, ""))
        except ConfigError:
            return ""  # a bad value: reported once, by the registry's value check

    topics = {"tickTopic": text("tickTopic"), "schedulingTopic": text("schedulingTopic")}
    subscription = text("schedulingSubscription")
    inputs: List[str] = [t for t in (cfg.get("inputs") or []) if isinstance(t, str)]
    for key in ("inputSpecs", "customSerdeInputs"):
        if isinstance(cfg.get(key), Mapping):
            inputs += [t for t in cfg[key] if isinstance(t, str)]
    problems = []
    sched = normalize_topic(topics["schedulingTopic"]) if topics["schedulingTopic"] else ""
    if sched and sched in [normalize_topic(t) for t in inputs]:
        fqfn = f"{cfg.get('tenant', 'public')}/{cfg.get('namespace', 'default')}/{cfg.get('name', '')}"
        function_sub = cfg.get("subName") or fqfn
        if (subscription or fqfn) != function_sub:
            problems.append(f"the scheduling topic is also an input: userConfig schedulingSubscription "
                            f"({subscription or fqfn!r}) must be the function's subscription "
                            f"({function_sub!r}), or the two consumers get every message each")
    try:
        partitions = int(read_setting(known, "schedulingTopicPartitions", to_int, 0))
    except ConfigError:
        partitions = 0  # a bad value: reported once, by the registry's value check
    if partitions > 0:
        if not sched:
            problems.append("userConfig schedulingTopicPartitions needs direct intake: set schedulingTopic")
        elif sched in [normalize_topic(t) for t in inputs]:
            problems.append(f"userConfig schedulingTopicPartitions={partitions}: the scheduling topic {sched} must not "
                            "be a function input (each owned partition has its own consumer); inputs: tickTopic only")
        problems += _tick_spread_problems(cfg, topics["tickTopic"], partitions)
    try:
        scheduling_input(inputs, topics)
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    return problems


def writer_topology(cfg: Mapping[str, Any], source: str) -> FunctionTopology:
    """What a BucketSnapshotWriter config reads, writes and serves (`validate --system`);
    ValueError/ConfigError when the config cannot say."""
    from ..config.system import FOR_OPERATORS, OUTPUT, FunctionTopology, Scheduling, Write, config_inputs, function_name
    from ..deletion.topics import DeletionTopics

    raw = cfg.get("userConfig")
    user: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    inputs = config_inputs(cfg)
    topic, _direct = scheduling_input(inputs, user)
    wc = parse_writer_config(user, topic=topic)
    partitions = [f"{topic}-partition-{k}" for k in range(wc.scheduling_topic_partitions)]
    writes = [Write("wake ticks", normalize_topic(wc.tick_topic))] if wc.tick_topic else []
    output = cfg.get("output")
    if isinstance(output, str) and output:
        writes.append(Write("releases", normalize_topic(output), OUTPUT))
    writes.append(Write("refused scheduling messages", normalize_topic(wc.invalid_message_topic or f"{topic}-INVALID"),
                        FOR_OPERATORS))
    writes.append(Write("releases whose target refused them", normalize_topic(wc.dead_letter_topic or f"{topic}-DLQ"),
                        FOR_OPERATORS))
    if wc.snapshot_deletion == "two-phase":
        deletion = DeletionTopics(namespace=wc.snapshot_deletion_namespace, topic_name=wc.snapshot_deletion_topic_name,
                                  parallelism=wc.snapshot_deletion_parallelism)
        via = topic if wc.snapshot_deletion_send_delay_seconds > 0 else ""
        writes += [Write("two-phase snapshot deletion requests", deletion.deletion_partition(k), via=via)
                   for k in range(deletion.parallelism)]
    return FunctionTopology(source, function_name(cfg), tuple(dict.fromkeys([*inputs, topic, *partitions])),
                            tuple(writes), (Scheduling(topic, tuple(wc.allowed_target_prefixes)),))
