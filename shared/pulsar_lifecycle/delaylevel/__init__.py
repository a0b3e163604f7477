"""Delay-level topics (Pulsar #15500, seed 002): long delays parked on disk in time-sliced
partitions and handed to the near-term path when they come close.

Engines (pure): `strategy` (partition count, partition of a delay), `rule` (forward time,
sequence ids, names). Adapters: `producer` (DelayLevelProducer), `forwarder` (one partition),
`service` (the syncer), `admin` (admin REST checks). Wiring: `wiring.build_syncer`.
"""
from .errors import (
    ConfigError,
    DelayLevelError,
    DelayTooLongError,
    ParkedMessageError,
    PartitionRefusedError,
    ShrinkRefusedError,
    StrategyError,
)
from .rule import (
    DEFAULT_DELAY_LEVEL_TOPIC,
    cancel_topic,
    dead_letter_topic,
    dedicated_delay_level_topic,
    default_delay_level_topic,
    forward_at,
    partition_topic,
    sequence_id,
)
from .strategy import DelayLevelTopicPartitionStrategy, PartitionBy

__all__ = [
    "DEFAULT_DELAY_LEVEL_TOPIC",
    "ConfigError",
    "DelayLevelError",
    "DelayLevelTopicPartitionStrategy",
    "DelayTooLongError",
    "ParkedMessageError",
    "PartitionBy",
    "PartitionRefusedError",
    "ShrinkRefusedError",
    "StrategyError",
    "cancel_topic",
    "dead_letter_topic",
    "dedicated_delay_level_topic",
    "default_delay_level_topic",
    "forward_at",
    "partition_topic",
    "sequence_id",
]
