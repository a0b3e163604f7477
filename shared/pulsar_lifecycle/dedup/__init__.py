"""PIP-6 guaranteed de-duplication on the client side.

`SequenceMap` is the pure engine (pushed/persisted maps, snapshots, producer cap);
`DedupPublisher` sends every output through it and recovers it after a crash.
"""
from .publisher import (
    DedupPublisher,
    Outcome,
    OutMessage,
    PublishCallback,
    PublishError,
    PublishResult,
    normalize_topic,
    snapshot_key,
)
from .recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY, RecoveryError, TailStats, last_position, read_tail
from .sequence_map import (
    DEFAULT_MAX_PRODUCERS,
    DEFAULT_SNAPSHOT_INTERVAL,
    NO_SEQUENCE,
    CapacityError,
    DedupError,
    DedupSnapshot,
    Position,
    SequenceError,
    SequenceMap,
    SnapshotFormatError,
)

__all__ = [
    "CapacityError",
    "DEFAULT_MAX_PRODUCERS",
    "DEFAULT_SNAPSHOT_INTERVAL",
    "DedupError",
    "DedupPublisher",
    "DedupSnapshot",
    "NO_SEQUENCE",
    "OutMessage",
    "Outcome",
    "PRODUCER_PROPERTY",
    "Position",
    "PublishCallback",
    "PublishError",
    "PublishResult",
    "RecoveryError",
    "SEQUENCE_PROPERTY",
    "SequenceError",
    "SequenceMap",
    "SnapshotFormatError",
    "TailStats",
    "last_position",
    "normalize_topic",
    "read_tail",
    "snapshot_key",
]
