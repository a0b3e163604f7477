"""userConfig of DelayLevelSyncer: parsed once, unknown keys rejected, every key documented."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..dedup.publisher import normalize_topic
from .errors import ConfigError
from .strategy import DEFAULT_MAX_DELAY_SECONDS, DEFAULT_MAX_PARTITIONS, DelayLevelTopicPartitionStrategy

__all__ = ["SYNCER_KEYS", "SyncerConfig", "all_user_config_keys", "check_function_config", "parse_syncer_config"]

# userConfig key -> (attribute, default, meaning). docs/configuration.md lists every key.
SYNCER_KEYS: Dict[str, Tuple[str, Any, str]] = {
    "delayLevelTopic": ("delay_level_topic", "", "The delay-level topic whose partitions (`<topic>-partition-<k>`) this syncer reads. Required. Producers default it to `<business topic>-delay-level`."),
    "messageMaximumDelayTimeSeconds": ("message_maximum_delay_time_seconds", DEFAULT_MAX_DELAY_SECONDS, "The strategy's maximum delay (seed default 30 days); with `partitionBy` it gives the partition count floor(max / unit). Must match the producers'."),
    "partitionBy": ("partition_by", "DAY", "The strategy's unit: `YEAR` (365 d), `MONTH` (30 d), `DAY`, `HOUR`, or `SECONDS` (then `unitSeconds`)."),
    "unitSeconds": ("unit_seconds", 0, "Unit length in seconds when `partitionBy` is `SECONDS` (tests, finer levels); 0 otherwise."),
    "maxPartitions": ("max_partitions", DEFAULT_MAX_PARTITIONS, "Cap on the partition count: a strategy needing more is refused with an error naming it."),
    "lookaheadMillis": ("lookahead_millis", 60000, "Forward a parked message this long before its slice ends (and before its deliver-at): the margin for clock skew between producers and the syncer plus forwarding and intake latency (docs/delay-levels.md)."),
    "nearTermBackend": ("near_term_backend", "scheduler", "`scheduler`: forward to the BucketSnapshotWriter's `schedulingTopic`; `broker`: forward to the business topic with broker deliver_at (real Pulsar with delayed delivery)."),
    "schedulingTopic": ("scheduling_topic", "", "The writer's scheduling topic (required with the `scheduler` backend)."),
    "schedulingSubscription": ("scheduling_subscription", "", "The writer's subscription on `schedulingTopic`, whose backlog is the writer's lag (back-pressure, needs `pulsarAdminUrl`)."),
    "subscription": ("subscription", "", "The syncer's Shared subscription on every partition; default `<tenant>/<namespace>/<name>`."),
    "producerName": ("producer_name", "", "Stable producer-name prefix of the forward publishers (`<prefix>-p<k>` per partition); default `<tenant>/<namespace>/<name>-<instance>`."),
    "instances": ("instances", 1, "Set to the function's `parallelism`: instance i forwards the partitions k with k % instances == i (one consumer per partition keeps its forwards' sequence ids increasing)."),
    "dedupSnapshotInterval": ("dedup_snapshot_interval", 1000, "Each partition's forward publisher snapshots its de-duplication state every this many forwards (Pulsar's brokerDeduplicationEntriesInterval); a restart replays the scheduling topic after the snapshot."),
    "forwardBatchSize": ("forward_batch_size", 500, "Due messages of one partition forwarded together before their acks."),
    "receiverQueueSize": ("receiver_queue_size", 200, "Receiver queue per partition consumer: the only parked messages held in memory (O(1) in the backlog)."),
    "onMissingTarget": ("on_missing_target", "dead-letter", "A parked message whose business topic no longer exists (admin API): `dead-letter` to `<delay-level topic>-DLQ` with the reason, or `forward` anyway."),
    "pulsarAdminUrl": ("pulsar_admin_url", "", "http(s)://broker:8080 for the checks that need the admin API (target existence, retention policies, writer backlog); empty = skipped."),
    "targetCacheSeconds": ("target_cache_seconds", 600, "How long a namespace's topic list from the admin API is cached."),
    "maxNearTermBacklog": ("max_near_term_backlog", 100000, "Back-pressure: forwarding pauses while the writer's subscription backlog is above this (needs `pulsarAdminUrl` and `schedulingSubscription`); 0 = off."),
    "backlogCheckIntervalMillis": ("backlog_check_interval_millis", 1000, "How often the writer's backlog is read while forwarding."),
    "tickTopic": ("tick_topic", "", "The function's input: a tick starts the syncer; it sends one wake tick per start and keeps one unacked, so a restart is woken by its redelivery (as the writer, scheduler/wake.py). A fresh deployment needs one first tick (the local runner's in `runner` mode, or one sent by the operator)."),
    "tickMode": ("tick_mode", "hold", "`hold`: only the held wake tick; `runner`: also the local runner sends a tick every tickTimeMillis (extra ticks are acked); `chain`: the writer's retired name, same as `hold`."),
    "tickTimeMillis": ("tick_time_millis", 1000, "Runner tick period, and the delay of the wake tick a failed syncer sends to be rebuilt."),
    "metricsIntervalSeconds": ("metrics_interval_seconds", 10, "How often the pulsar_delay_level_* metrics are recorded."),
    "partitionDiscoverySeconds": ("partition_discovery_seconds", 60, "How often the syncer looks for partitions beyond the ones it reads (producers whose maximum delay grew append them): each check probes the next partition's end (one probe subscription, removed again) and starts forwarding it when it holds messages, up to `maxPartitions`; 0 = off (new partitions are read after a restart with the raised strategy)."),
}


@dataclass(frozen=True)
class SyncerConfig:
    """DelayLevelSyncer settings (attributes named after SYNCER_KEYS)."""

    delay_level_topic: str = ""
    message_maximum_delay_time_seconds: int = DEFAULT_MAX_DELAY_SECONDS
    partition_by: str = "DAY"
    unit_seconds: int = 0
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    lookahead_millis: int = 60000
    near_term_backend: str = "scheduler"
    scheduling_topic: str = ""
    scheduling_subscription: str = ""
    subscription: str = ""
    producer_name: str = ""
    instances: int = 1
    dedup_snapshot_interval: int = 1000
    forward_batch_size: int = 500
    receiver_queue_size: int = 200
    on_missing_target: str = "dead-letter"
    pulsar_admin_url: str = ""
    target_cache_seconds: int = 600
    max_near_term_backlog: int = 100000
    backlog_check_interval_millis: int = 1000
    tick_topic: str = ""
    tick_mode: str = "hold"
    tick_time_millis: int = 1000
    metrics_interval_seconds: int = 10
    partition_discovery_seconds: int = 60

    def __post_init__(self) -> None:
        if not self.delay_level_topic:
            raise ConfigError("userConfig delayLevelTopic is required (the delay-level topic this syncer reads)")
        object.__setattr__(self, "delay_level_topic", normalize_topic(self.delay_level_topic))
        if self.near_term_backend not in ("scheduler", "broker"):
            raise ConfigError(f"userConfig nearTermBackend must be 'scheduler' or 'broker', got {self.near_term_backend!r}")
        if self.near_term_backend == "scheduler":
            if not self.scheduling_topic:
                raise ConfigError("userConfig nearTermBackend=scheduler needs schedulingTopic (the writer's scheduling topic)")
            object.__setattr__(self, "scheduling_topic", normalize_topic(self.scheduling_topic))
        if self.on_missing_target not in ("dead-letter", "forward"):
            raise ConfigError(f"userConfig onMissingTarget must be 'dead-letter' or 'forward', got {self.on_missing_target!r}")
        if self.tick_mode not in ("hold", "runner", "chain"):
            raise ConfigError(f"userConfig tickMode must be 'hold', 'runner' or 'chain', got {self.tick_mode!r}")
        if self.pulsar_admin_url and not self.pulsar_admin_url.startswith(("http://", "https://")):
            raise ConfigError(f"userConfig pulsarAdminUrl must start with http:// or https://, got {self.pulsar_admin_url!r}")
        for attr in ("instances", "dedup_snapshot_interval", "forward_batch_size", "receiver_queue_size", "tick_time_millis", "metrics_interval_seconds",
                     "target_cache_seconds", "backlog_check_interval_millis"):
            if getattr(self, attr) <= 0:
                raise ConfigError(f"userConfig {_key_of(attr)} must be > 0, got {getattr(self, attr)!r}")
        for attr in ("lookahead_millis", "max_near_term_backlog", "unit_seconds", "partition_discovery_seconds"):
            if getattr(self, attr) < 0:
                raise ConfigError(f"userConfig {_key_of(attr)} must be >= 0, got {getattr(self, attr)!r}")
        self.strategy  # noqa: B018 - builds the strategy now: an unreasonable one is a config error

    @property
    def strategy(self) -> DelayLevelTopicPartitionStrategy:
        """The partition strategy these settings describe (must match the producers')."""
        return DelayLevelTopicPartitionStrategy(
            message_maximum_delay_time_seconds=self.message_maximum_delay_time_seconds,
            partition_by=self.partition_by,  # type: ignore[arg-type] - the strategy parses and names a bad unit
            unit_seconds=self.unit_seconds or None, max_partitions=self.max_partitions)


def _key_of(attr: str) -> str:
    return next(k for k, v in SYNCER_KEYS.items() if v[0] == attr)


def all_user_config_keys() -> List[str]:
    """Every userConfig key DelayLevelSyncer understands."""
    return sorted(SYNCER_KEYS)


def parse_syncer_config(user_config: Optional[Mapping[str, Any]]) -> SyncerConfig:
    """userConfig -> SyncerConfig; an unknown key or a wrong type is a ConfigError naming it."""
    out: Dict[str, Any] = {}
    for key, value in (user_config or {}).items():
        if key not in SYNCER_KEYS:
            raise ConfigError(f"unknown userConfig key {key!r} for DelayLevelSyncer; valid keys: {all_user_config_keys()}")
        attr, default, _ = SYNCER_KEYS[key]
        if isinstance(default, int):
            # --user-config JSON goes through Gson: 5 -> 5.0; 5.5 or "x" is an error.
            try:
                number = float(value) if not isinstance(value, bool) else None
            except (TypeError, ValueError):
                number = None
            if number is None or number != int(number):
                raise ConfigError(f"userConfig {key} must be a whole number, got {value!r}")
            value = int(number)
        elif not isinstance(value, str):
            raise ConfigError(f"userConfig {key} must be a string, got {value!r}")
        out[attr] = value
    return SyncerConfig(**out)


def check_function_config(cfg: Mapping[str, Any]) -> List[str]:
    """What `validate` can tell about a DelayLevelSyncer config: its userConfig values."""
    user = cfg.get("userConfig") if isinstance(cfg.get("userConfig"), Mapping) else {}
    known = {k: v for k, v in user.items() if k in SYNCER_KEYS}
    try:
        parse_syncer_config(known)
    except (ValueError, TypeError) as exc:
        return [str(exc)]
    return []
