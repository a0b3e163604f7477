"""Records exchanged with the bucket engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional, Tuple

# A release key orders every item: (timestamp, ledger_id, entry_id), compared lexicographically.
ReleaseKey = Tuple[int, int, int]

MAX_ENTRY_ID = (1 << 32) - 1  # index ids live in 32-bit RoaringBitmaps (Pulsar's format)
MAX_U64 = (1 << 64) - 1

# Index ids. Pulsar indexes entries: its broker dispatches whole entries, and a batch shares one.
# A function sees single messages, so the engine identifies an item by its *index id*
# `entry_id << BATCH_BITS | batch_index` (unique per message, ordered like the topic, a 32-bit
# value for entry ids below 2**22; Pulsar rolls ledgers at 50,000 entries). What Pulsar reads
# (DelayedIndex.entry_id, the snapshot bitmaps) holds the real entry id; see codec.py.
BATCH_BITS = 10
MAX_BATCH_INDEX = (1 << BATCH_BITS) - 1
MAX_INDEXABLE_ENTRY_ID = (1 << (32 - BATCH_BITS)) - 1


def index_id(entry_id: int, batch_index: int) -> Optional[int]:
    """The index id of the message at (entry_id, batch_index) — batch index -1 (not batched)
    counts as 0 — or None when it does not fit 32 bits."""
    batch = max(batch_index, 0)
    if entry_id < 0 or entry_id > MAX_INDEXABLE_ENTRY_ID or batch > MAX_BATCH_INDEX:
        return None
    return (entry_id << BATCH_BITS) | batch


def split_index_id(ident: int) -> Tuple[int, int]:
    """(entry_id, batch_index) of an index id."""
    return ident >> BATCH_BITS, ident & MAX_BATCH_INDEX


@dataclass
class DelayedMessage:
    """One scheduling-topic message to release at `deliver_at` (ms since epoch).

    (ledger_id, entry_id) is the scheduling message's position and identifies the item: adding
    the same position again is ignored. `entry_id` is the message's *index id*
    (`index_id(entry, batch_index)`): the real entry id only for a message at batch index 0. `partition` is the scheduling topic's partition (-1 when
    not partitioned); `event_time` 0 means none; `target` None means the function's default.
    """

    ledger_id: int
    entry_id: int
    partition: int
    deliver_at: int
    payload: bytes
    key: Optional[str] = None
    properties: Dict[str, str] = field(default_factory=dict)
    event_time: int = 0
    target: Optional[str] = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        # Fast path for the common, valid message; the slow path below names the problem.
        if (type(self.ledger_id) is int and 0 <= self.ledger_id <= MAX_U64
                and type(self.entry_id) is int and 0 <= self.entry_id <= MAX_ENTRY_ID
                and type(self.deliver_at) is int and 0 <= self.deliver_at <= MAX_U64
                and type(self.event_time) is int and 0 <= self.event_time <= MAX_U64
                and type(self.partition) is int and -1 <= self.partition < (1 << 31)
                and type(self.payload) is bytes
                and (self.key is None or type(self.key) is str)
                and (self.target is None or (type(self.target) is str and self.target))
                and type(self.properties) is dict
                and all(type(k) is str and type(v) is str for k, v in self.properties.items())):
            return
        where = f"delayed message {self.ledger_id!r}:{self.entry_id!r}"
        for name, value, hi in (
            ("ledger_id", self.ledger_id, MAX_U64),
            ("entry_id", self.entry_id, MAX_ENTRY_ID),
            ("deliver_at", self.deliver_at, MAX_U64),
            ("event_time", self.event_time, MAX_U64),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
                raise ValueError(f"{where}: {name} must be an int in [0, {hi}], got {value!r}")
        if isinstance(self.partition, bool) or not isinstance(self.partition, int) or not (
            -1 <= self.partition < (1 << 31)
        ):
            raise ValueError(f"{where}: partition must be an int >= -1, got {self.partition!r}")
        if not isinstance(self.payload, (bytes, bytearray, memoryview)):
            raise ValueError(f"{where}: payload must be bytes, got {type(self.payload).__name__}")
        if self.key is not None and not isinstance(self.key, str):
            raise ValueError(f"{where}: key must be str or None, got {type(self.key).__name__}")
        if self.target is not None and (not isinstance(self.target, str) or not self.target):
            raise ValueError(f"{where}: target must be a non-empty str or None, got {self.target!r}")
        if not isinstance(self.properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.properties.items()
        ):
            raise ValueError(f"{where}: properties must be a dict of str to str")


class Release(NamedTuple):
    """One released item. `seq` is 1, 2, 3, ... in release-key order, identical across restarts
    for everything after the committed watermark. A `cancelled` item consumes its seq but must
    not be published. `release_ts` is the release key's timestamp (>= message.deliver_at).
    (A NamedTuple: pop_due builds one per released message, and a frozen dataclass costs about
    twice as much to build.)"""

    seq: int
    message: DelayedMessage
    cancelled: bool
    release_ts: int

    @property
    def key(self) -> ReleaseKey:
        """The release key (release_ts, ledger_id, entry_id)."""
        return (self.release_ts, self.message.ledger_id, self.message.entry_id)


class CancelResult(enum.Enum):
    """What cancel() did."""

    CANCELLED = "cancelled"  # pending; durable tombstone written, it will be released flagged
    CANCELLED_BEFORE_ADD = "cancelled_before_add"  # not added yet; durable tombstone: its add is dropped
    ALREADY_CANCELLED = "already_cancelled"  # already tombstoned (pending, or not added yet)
    ALREADY_RELEASED = "already_released"  # added earlier and released since


@dataclass(frozen=True)
class RecoveryReport:
    """What recover() read and rebuilt."""

    buckets: int
    pending: int
    mutable_items: int
    journal_records: int
    metadata_reads: int
    segment_reads: int
    segments_loaded: int
    bytes_read: int
    exhausted_buckets: int
    orphans_deleted: int
    committed_seq: int
    duration_ms: float


OP_TYPES = ("create", "load", "delete", "merge")
OP_STATES = ("succeed", "failed")
# Pulsar's pulsar_delayed_message_index_bucket_op_latency_ms buckets (ms); the last is overflow.
LATENCY_BUCKETS_MS = (50, 100, 500, 1000, 5000, 30000, 60000)


@dataclass(frozen=True)
class BucketStats:
    """Values behind Pulsar's pulsar_delayed_message_index_* metrics, plus engine counters.

    op_count[(type, state)]: type in OP_TYPES, state in OP_STATES.
    op_latency_ms[type]: counts per LATENCY_BUCKETS_MS bucket plus one overflow bucket
    (per-bucket counts, not cumulative, like Pulsar); op_latency_sum_ms[type] the total.
    """

    bucket_total: int  # immutable buckets + 1 (the last mutable bucket), like Pulsar
    immutable_buckets: int
    loaded: int  # indexes in memory: mutable bucket + loaded segments (unreleased)
    snapshot_size_bytes: int
    pending: int
    mutable_items: int
    released_uncommitted: int
    last_seq: int
    committed_seq: int
    op_count: Dict[Tuple[str, str], int]
    op_latency_ms: Dict[str, Tuple[int, ...]]
    op_latency_sum_ms: Dict[str, float]
