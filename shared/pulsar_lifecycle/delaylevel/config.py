"""userConfig of DelayLevelSyncer: declared once as SyncerConfig fields (config/settings.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

from ..config.settings import check_settings, parse_settings, setting, to_str, user_config_keys
from ..config.system import FOR_OPERATORS, FunctionTopology, Write, config_inputs, function_name
from ..dedup.partition_router import DEFAULT_KEY_HASHING, KEY_HASHINGS
from ..topics import normalize_topic
from .errors import ConfigError
from .rule import cancel_topic, dead_letter_topic, partition_topic
from .strategy import DEFAULT_MAX_DELAY_SECONDS, DEFAULT_MAX_PARTITIONS, DelayLevelTopicPartitionStrategy

__all__ = ["ConfigError", "SyncerConfig", "all_user_config_keys", "parse_syncer_config"]


@dataclass(frozen=True)
class SyncerConfig:
    """DelayLevelSyncer settings: one field per userConfig key (config/settings.py)."""

    delay_level_topic: str = setting(
        'delayLevelTopic', '',
        'The delay-level topic whose partitions (`<topic>-partition-<k>`) this syncer reads. Required. DelayLevelProducer parks on `persistent://public/default/delay-level` by default (the shipped config\'s), shared by every business topic: each parked message carries its own target. A topic no syncer reads is a dead end (`pulsar-lifecycle validate --system`).')
    message_maximum_delay_time_seconds: int = setting(
        'messageMaximumDelayTimeSeconds', DEFAULT_MAX_DELAY_SECONDS,
        "The strategy's maximum delay (seed default 30 days); with `partitionBy` it gives the partition count floor(max / unit). Must match the producers'.")
    partition_by: str = setting(
        'partitionBy', 'DAY',
        "The strategy's unit: `YEAR` (365 d), `MONTH` (30 d), `DAY`, `HOUR`, or `SECONDS` (then `unitSeconds`).")
    unit_seconds: int = setting(
        'unitSeconds', 0,
        'Unit length in seconds when `partitionBy` is `SECONDS` (tests, finer levels); 0 otherwise.',
        minimum=0)
    max_partitions: int = setting(
        'maxPartitions', DEFAULT_MAX_PARTITIONS,
        'Cap on the partition count: a strategy needing more is refused with an error naming it.')
    lookahead_millis: int = setting(
        'lookaheadMillis', 60000,
        'Forward a parked message this long before its slice ends (and before its deliver-at): the margin for clock skew between producers and the syncer plus forwarding and intake latency (docs/delay-levels.md).',
        minimum=0)
    near_term_backend: str = setting(
        'nearTermBackend', 'scheduler',
        "`scheduler`: forward to the BucketSnapshotWriter's `schedulingTopic`; `broker`: forward to the business topic with broker deliver_at (real Pulsar with delayed delivery).",
        choices=("scheduler", "broker"))
    scheduling_topic: str = setting(
        'schedulingTopic', '',
        "The writer's scheduling topic (required with the `scheduler` backend).")
    scheduling_subscription: str = setting(
        'schedulingSubscription', '',
        "The writer's subscription on `schedulingTopic`, whose backlog is the writer's lag (back-pressure, needs `pulsarAdminUrl`).")
    subscription: str = setting(
        'subscription', '',
        "The syncer's Shared subscription on every partition; default `<tenant>/<namespace>/<name>`.")
    producer_name: str = setting(
        'producerName', '',
        'Stable producer-name prefix of the forward publishers (`<prefix>-p<k>` per partition, the same whichever instance forwards k); default `<tenant>/<namespace>/<name>-0`.')
    instances: int = setting(
        'instances', 1,
        "Not needed under a Pulsar runtime or `localrun`: the instance count comes from the Context (`get_num_instances()`, or FunctionDetails `parallelism` in Pulsar's Python runtime) and instance i forwards the partitions k with k % n == i. Used only by a syncer service built without a Context (tests, benchmarks); a value other than 1 that differs from the runtime's count is logged and ignored.",
        minimum=1)
    dedup_snapshot_interval: int = setting(
        'dedupSnapshotInterval', 1000,
        "Each partition's forward publisher snapshots its de-duplication state every this many forwards (Pulsar's brokerDeduplicationEntriesInterval); a restart replays the scheduling topic after the snapshot.",
        minimum=1)
    forward_batch_size: int = setting(
        'forwardBatchSize', 500,
        'Due messages of one partition forwarded together before their acks.',
        minimum=1)
    forward_pipeline_depth: int = setting(
        'forwardPipelineDepth', 1,
        "Batches of one partition that may wait for the broker's confirmation while the next one is sent (each is acked only once confirmed); 0 = send, confirm, ack. 1 forwarded about 17% faster than 0 on pulsar-lite (docs/benchmarks.md) and holds up to one more batch unacked.",
        minimum=0)
    forward_concurrency: int = setting(
        'forwardConcurrency', 2,
        "How many partitions forward at once (the others wait their turn, in order). Forwarding is GIL-bound and pulsar-client releases the GIL twice per message, so more threads forwarding at once mostly wake each other: on pulsar-lite 2 forwarded about 1.3x faster than one thread per partition (docs/benchmarks.md). Waiting for a head's forward time takes no slot.",
        minimum=1)
    receiver_queue_size: int = setting(
        'receiverQueueSize', 200,
        'Receiver queue per partition consumer: the only parked messages held in memory (O(1) in the backlog).',
        minimum=1)
    on_missing_target: str = setting(
        'onMissingTarget', 'dead-letter',
        'A parked message whose business topic no longer exists (admin API): `dead-letter` to `<delay-level topic>-DLQ` with the reason, or `forward` anyway.',
        choices=("dead-letter", "forward"))
    key_hashing: str = setting(
        'keyHashing', DEFAULT_KEY_HASHING,
        "How a forward with a key picks its partition of a partitioned target (the scheduling topic, or with the `broker` backend the business topic): `java_string` (Pulsar's Java client default, JavaStringHash) or `murmur3_32` (Murmur3_32Hash, the Java client's other choice); the one your business producers use, so that a key's delayed and undelayed messages share a partition. Unkeyed forwards are routed by their sequence id.",
        choices=tuple(sorted(KEY_HASHINGS)))
    forward_retry_seconds: int = setting(
        'forwardRetrySeconds', 60,
        "A forward its target refuses (authorization, schema, a missing namespace; with the `broker` backend the business topic is the target) is retried with backoff (0.5 s doubling to 10 s) this long, then sent to `<delay-level topic>-DLQ` with the reason (`__pl_error__`) and its original properties. Its partition waits meanwhile (forwards are in order within a partition); the other partitions go on.",
        minimum=0)
    forward_positions_kept: int = setting(
        'forwardPositionsKept', 200000,
        "Per partition, how many recent forwards' landed positions are kept in memory, so that a cancel of a forwarded message is sent on to the writer at once; older ones (and those forwarded before a restart) are found by reading the scheduling topic. 0 = always read.",
        minimum=0)
    pulsar_admin_url: str = setting(
        'pulsarAdminUrl', '',
        'http(s)://broker:8080 for the checks that need the admin API (target existence, retention policies, writer backlog, `targetPermissionCheck`); empty = skipped.')
    target_permission_check: str = setting(
        'targetPermissionCheck', 'auto',
        "Forward to a target only what every role that may produce to the delay-level topic may produce there itself (tenant admins included, super users aside; the writer's rule, scheduler/target_permissions.py): a parked message whose `__pl_target__` fails goes to `<delay-level topic>-DLQ` with `__pl_error__` naming the roles that lack produce on it and is acked, never forwarded. Grants are read from the admin API at `pulsarAdminUrl` with the token in `adminTokenSecret`. `auto`: on when `pulsarAdminUrl` is set and the broker refuses an anonymous admin read (authentication on); off on pulsar-lite or an open broker. `on`: always (needs `pulsarAdminUrl`). `off`: never (docs/security.md).",
        choices=('auto', 'on', 'off'))
    target_permission_cache_seconds: int = setting(
        'targetPermissionCacheSeconds', 60,
        "How long the grants read for targetPermissionCheck (and the decisions on them) are kept before they are read again; a grant or revocation takes effect within this time.",
        minimum=0)
    admin_token_secret: Optional[str] = setting(
        'adminTokenSecret', None,
        "Name of a function secret holding a Bearer token for the admin API (the writer's and the LedgerDeletionWorker's key), sent with every admin call of the syncer: a tenant admin of the delay-level topic's and the targets' tenants, or a super user.",
        convert=to_str)
    target_cache_seconds: int = setting(
        'targetCacheSeconds', 600,
        "How long a namespace's topic list from the admin API is cached.",
        minimum=1)
    max_near_term_backlog: int = setting(
        'maxNearTermBacklog', 100000,
        "Back-pressure: forwarding pauses while the writer's subscription backlog is above this (needs `pulsarAdminUrl` and `schedulingSubscription`); 0 = off.",
        minimum=0)
    backlog_check_interval_millis: int = setting(
        'backlogCheckIntervalMillis', 1000,
        "How often the writer's backlog is read while forwarding.",
        minimum=1)
    tick_topic: str = setting(
        'tickTopic', '',
        "The function's input: a tick starts the syncer; it sends one wake tick per start and keeps one unacked, so a restart is woken by its redelivery (as the writer, scheduler/wake.py). Use `<delayLevelTopic>-TICK` (the shipped config): a DelayLevelProducer sends one tick there before its first parked message, so the first parked message starts a fresh deployment.")
    tick_mode: str = setting(
        'tickMode', 'hold',
        "`hold`: only the held wake tick; `runner`: also the local runner sends a tick every tickTimeMillis (extra ticks are acked); `chain`: the writer's retired name, same as `hold`.",
        choices=("hold", "runner", "chain"))
    tick_time_millis: int = setting(
        'tickTimeMillis', 1000,
        'Runner tick period, and the delay of the wake tick a failed syncer sends to be rebuilt.',
        minimum=1)
    metrics_interval_seconds: int = setting(
        'metricsIntervalSeconds', 10,
        'How often the pulsar_delay_level_* metrics are recorded.',
        minimum=1)
    partition_discovery_seconds: int = setting(
        'partitionDiscoverySeconds', 60,
        "How often the syncer looks for partitions beyond the ones it reads (producers whose maximum delay grew append them): each check probes the next partition's end (one probe subscription, removed again) and starts forwarding it when it holds messages, up to `maxPartitions`; 0 = off (new partitions are read after a restart with the raised strategy).",
        minimum=0)

    def __post_init__(self) -> None:
        check_settings(self)
        if not self.delay_level_topic:
            raise ConfigError("userConfig delayLevelTopic is required (the delay-level topic this syncer reads)")
        object.__setattr__(self, "delay_level_topic", normalize_topic(self.delay_level_topic))
        if self.near_term_backend == "scheduler":
            if not self.scheduling_topic:
                raise ConfigError("userConfig nearTermBackend=scheduler needs schedulingTopic (the writer's scheduling topic)")
            object.__setattr__(self, "scheduling_topic", normalize_topic(self.scheduling_topic))
        if self.pulsar_admin_url and not self.pulsar_admin_url.startswith(("http://", "https://")):
            raise ConfigError(f"userConfig pulsarAdminUrl must start with http:// or https://, got {self.pulsar_admin_url!r}")
        self.strategy  # noqa: B018 - builds the strategy now: an unreasonable one is a config error

    @classmethod
    def from_user_config(cls, user_config: Optional[Mapping[str, Any]]) -> "SyncerConfig":
        """userConfig -> SyncerConfig; an unknown key or a wrong value is a ConfigError naming it."""
        return parse_settings(cls, user_config, function="DelayLevelSyncer")

    @property
    def strategy(self) -> DelayLevelTopicPartitionStrategy:
        """The partition strategy these settings describe (must match the producers')."""
        return DelayLevelTopicPartitionStrategy(
            message_maximum_delay_time_seconds=self.message_maximum_delay_time_seconds,
            partition_by=self.partition_by,  # type: ignore[arg-type]  # the strategy parses and names a bad unit
            unit_seconds=self.unit_seconds or None, max_partitions=self.max_partitions)


def all_user_config_keys() -> List[str]:
    """Every userConfig key DelayLevelSyncer understands."""
    return user_config_keys(SyncerConfig)


def parse_syncer_config(user_config: Optional[Mapping[str, Any]]) -> SyncerConfig:
    """userConfig -> SyncerConfig (SyncerConfig.from_user_config)."""
    return SyncerConfig.from_user_config(user_config)


def syncer_topology(cfg: Mapping[str, Any], source: str) -> FunctionTopology:
    """What a DelayLevelSyncer config reads, writes and serves (`validate --system`): it reads the
    delay-level partitions and cancels and forwards each parked message to its own business topic
    (`__pl_target__`, which no config names), through the writer's scheduling topic with the
    `scheduler` backend; messages it cannot forward go to `<delay-level topic>-DLQ`."""
    raw = cfg.get("userConfig")
    sc = parse_syncer_config(raw if isinstance(raw, Mapping) else {})
    dl = sc.delay_level_topic
    reads = [*config_inputs(cfg), dl, cancel_topic(dl),
             *(partition_topic(dl, k) for k in range(sc.strategy.partitions))]
    via = sc.scheduling_topic if sc.near_term_backend == "scheduler" else ""
    writes = [Write("forwards of parked messages (to each message's business topic)", "", via=via),
              Write("dead letters", dead_letter_topic(dl), FOR_OPERATORS)]
    if sc.tick_topic:
        writes.append(Write("wake ticks", normalize_topic(sc.tick_topic)))
    return FunctionTopology(source, function_name(cfg), tuple(dict.fromkeys(reads)), tuple(writes), syncs=(dl,))
