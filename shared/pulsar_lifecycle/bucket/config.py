"""Bucket engine configuration: Pulsar's broker settings (snake_case) plus our extra seal rules."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class BucketConfig:
    """Tuning of the PIP-195 bucket index. Defaults are Pulsar's unless noted.

    * delayed_delivery_min_index_count_per_bucket (50000): Pulsar's seal rule — seal the last
      mutable bucket when a message of a newer ledger arrives and it holds at least this many.
    * delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds (300) and
      delayed_delivery_max_indexes_per_bucket_snapshot_segment (5000, -1 = unlimited): Pulsar's
      segment cut rule.
    * delayed_delivery_max_num_buckets: Pulsar's default is -1 (never merge). Ours is 64 because
      the extra seal triggers below create a bucket per maxUnackedPerBucket items or per
      maxSealDelayMillis, which without merging would grow without bound (and memory holds one
      segment per bucket). -1 still disables merging.
    * max_unacked_per_bucket (ours, 10000): also seal when the mutable bucket holds this many
      items, keeping it (memory, journal replay) well under Pulsar's 50000 unacked-per-consumer cap.
    * max_seal_delay_millis (ours, 300000): also seal when the mutable bucket's oldest item was
      added longer ago than this (checked by maybe_seal()).
    * topic / cursor: names passed to the snapshot storage as custom metadata (Pulsar puts them
      in the snapshot ledger's metadata).
    """

    delayed_delivery_min_index_count_per_bucket: int = 50000
    delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds: int = 300
    delayed_delivery_max_indexes_per_bucket_snapshot_segment: int = 5000
    delayed_delivery_max_num_buckets: int = 64
    max_unacked_per_bucket: int = 10000
    max_seal_delay_millis: int = 300_000
    topic: str = ""
    cursor: str = ""

    def __post_init__(self) -> None:
        def positive(name: str, allow_minus_one: bool = False) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"BucketConfig.{name} must be an int, got {value!r}")
            if value <= 0 and not (allow_minus_one and value == -1):
                extra = " or -1" if allow_minus_one else ""
                raise ValueError(f"BucketConfig.{name} must be > 0{extra}, got {value!r}")

        positive("delayed_delivery_min_index_count_per_bucket")
        positive("delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds")
        positive("delayed_delivery_max_indexes_per_bucket_snapshot_segment", allow_minus_one=True)
        positive("delayed_delivery_max_num_buckets", allow_minus_one=True)
        positive("max_unacked_per_bucket")
        positive("max_seal_delay_millis")
        for name in ("topic", "cursor"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"BucketConfig.{name} must be a str, got {getattr(self, name)!r}")

    @property
    def time_step_ms(self) -> int:
        """The segment time step in ms (Pulsar PR #19615: the setting is in seconds)."""
        return self.delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds * 1000

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "BucketConfig":
        """Build from userConfig-style keys: Pulsar's camelCase names (`delayedDeliveryMaxNumBuckets`,
        `maxUnackedPerBucket`) or the snake_case field names. Unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        kwargs = {}
        for raw_key, value in values.items():
            key = raw_key if raw_key in known else re.sub(r"(?<!^)(?=[A-Z])", "_", raw_key).lower()
            if key not in known:
                raise ValueError(f"unknown bucket setting {raw_key!r}; known: {sorted(known)}")
            if key not in ("topic", "cursor") and isinstance(value, str):
                try:
                    value = int(value)
                except ValueError:
                    raise ValueError(f"bucket setting {raw_key!r} must be an integer, got {value!r}") from None
            kwargs[key] = value
        return cls(**kwargs)
