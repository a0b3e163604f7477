"""Bucket engine configuration: Pulsar's broker settings (snake_case) plus our extra seal rules."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping

from ..config.settings import ConfigError, check_settings, parse_settings, setting, settings_of


@dataclass(frozen=True)
class BucketConfig:
    """Tuning of the PIP-195 bucket index. Defaults are Pulsar's unless noted.

    The userConfig keys are Pulsar's broker.conf names (camelCase of the field names).
    delayed_delivery_max_num_buckets: Pulsar's default is -1 (never merge). Ours is 64 because the
    extra seal triggers (max_unacked_per_bucket, max_seal_delay_millis) create a bucket per that
    many items or that much time, which without merging would grow without bound (and memory
    holds one segment per bucket). -1 still disables merging.
    topic / cursor: names passed to the snapshot storage as custom metadata (Pulsar puts them in
    the snapshot ledger's metadata); not userConfig keys.
    """

    delayed_delivery_min_index_count_per_bucket: int = setting(
        "delayedDeliveryMinIndexCountPerBucket", 50000,
        "Pulsar's seal rule: seal the mutable bucket at a ledger boundary once it holds this many indexes.",
        minimum=1)
    delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds: int = setting(
        "delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds", 300,
        "Segment cut rule: a segment spans at most this many seconds of deliver-at times.", minimum=1)
    delayed_delivery_max_indexes_per_bucket_snapshot_segment: int = setting(
        "delayedDeliveryMaxIndexesPerBucketSnapshotSegment", 5000,
        "Segment cut rule: at most this many indexes per segment (-1 = unlimited).", minimum=1, also=(-1,))
    delayed_delivery_max_num_buckets: int = setting(
        "delayedDeliveryMaxNumBuckets", 64,
        "Merge adjacent buckets above this many (Pulsar's default -1 never merges; ours is 64, see bucket-format.md).",
        minimum=1, also=(-1,))
    max_unacked_per_bucket: int = setting(
        "maxUnackedPerBucket", 10000,
        "Ours: also seal when the mutable bucket holds this many items (stays under Pulsar's 50,000 "
        "unacked-per-consumer cap).", minimum=1)
    max_seal_delay_millis: int = setting(
        "maxSealDelayMillis", 300_000,
        "Ours: also seal when the mutable bucket's oldest item is older than this.", minimum=1)
    topic: str = ""
    cursor: str = ""

    def __post_init__(self) -> None:
        check_settings(self)
        for name in ("topic", "cursor"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"BucketConfig.{name} must be a str, got {getattr(self, name)!r}")

    @property
    def time_step_ms(self) -> int:
        """The segment time step in ms (Pulsar PR #19615: the setting is in seconds)."""
        return self.delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds * 1000

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "BucketConfig":
        """Build from userConfig keys (`delayedDeliveryMaxNumBuckets`, `maxUnackedPerBucket`) or
        the field names (`max_unacked_per_bucket`, `topic`). Unknown keys are an error."""
        key_of = {f.name: key for key, (f, _spec) in settings_of(cls).items()}
        plain = {f.name for f in fields(cls)} - set(key_of)
        user: Dict[str, Any] = {}
        extra: Dict[str, Any] = {}
        for raw_key, value in values.items():
            if raw_key in plain:
                extra[raw_key] = value
            else:
                user[key_of.get(raw_key, raw_key)] = value
        return parse_settings(cls, user, function="BucketConfig", extra=extra)
