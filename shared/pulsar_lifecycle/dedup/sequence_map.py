"""PIP-6's per-topic sequence-id map, as a pure engine (no Pulsar I/O).

It mirrors the broker's ``MessageDeduplication``:

* two maps ``producer -> highest sequence id``: *pushed* (updated before a message is handed to
  the broker) and *persisted* (updated when the broker confirms it);
* a message whose sequence id is at or below the producer's highest pushed id is a duplicate;
* every ``snapshot_interval`` persisted entries (``brokerDeduplicationEntriesInterval``, 1000) the
  persisted map is snapshotted together with the topic position up to which it is exact;
* recovery = restore the last snapshot, then replay every entry after its position and raise each
  producer's ids to ``max(current, replayed)``.

The number of producers is capped (``brokerDeduplicationMaxNumberOfProducers``, 10000). When a new
producer would exceed it, the least-recently-used *inactive* producer is forgotten, as Pulsar's
purge of inactive producers forgets them; active producers are never evicted.
"""
from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Set

from ..exceptions import PulsarLifecycleError

log = logging.getLogger(__name__)

DEFAULT_SNAPSHOT_INTERVAL = 1000  # brokerDeduplicationEntriesInterval
DEFAULT_MAX_PRODUCERS = 10000  # brokerDeduplicationMaxNumberOfProducers
NO_SEQUENCE = -1  # what Pulsar reports for a producer it has never seen (last_sequence_id)
MAX_SEQUENCE = 2**63 - 1  # sequence ids are int64 on the wire

SNAPSHOT_FORMAT = "pulsar-lifecycle/dedup-snapshot"
SNAPSHOT_VERSION = 1


class DedupError(PulsarLifecycleError, RuntimeError):
    """Base class of de-duplication errors."""


class SequenceError(DedupError, ValueError):
    """A sequence id is invalid or breaks the monotonic order of its producer."""


class CapacityError(DedupError):
    """The producer cap is reached and every tracked producer is active."""


class SnapshotFormatError(DedupError, ValueError):
    """Snapshot bytes that are not a valid de-duplication snapshot."""


def check_sequence_id(seq: Any, *, allow_zero: bool = True) -> int:
    """Return `seq` if it is a valid int64 sequence id, else raise SequenceError naming the problem."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise SequenceError(f"sequence id must be an int, got {type(seq).__name__} {seq!r}")
    low = 0 if allow_zero else 1
    if seq < low or seq > MAX_SEQUENCE:
        raise SequenceError(f"sequence id {seq} out of range [{low}, 2**63-1]")
    return seq


def _check_producer(producer: Any) -> str:
    if not isinstance(producer, str) or not producer:
        raise ValueError(f"producer name must be a non-empty str, got {producer!r}")
    return producer


@dataclass(frozen=True, order=True)
class Position:
    """A position in a topic: a Pulsar message id without its topic.

    Ordered by (ledger, entry, batch index); batch index -1 (the whole entry) sorts before the
    messages inside that entry, so it is a safe inclusive start for a replay.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = field(default=-1, compare=False)

    def entry(self) -> "Position":
        """The position of the whole entry holding this message."""
        return Position(self.ledger_id, self.entry_id, -1, self.partition)

    def to_json(self) -> Dict[str, int]:
        """A JSON-friendly dict."""
        return {
            "ledger_id": self.ledger_id,
            "entry_id": self.entry_id,
            "batch_index": self.batch_index,
            "partition": self.partition,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Position":
        """Inverse of `to_json`; raises SnapshotFormatError on a malformed dict."""
        try:
            vals = {k: data[k] for k in ("ledger_id", "entry_id")}
            vals["batch_index"] = data.get("batch_index", -1)
            vals["partition"] = data.get("partition", -1)
        except (KeyError, TypeError) as exc:
            raise SnapshotFormatError(f"position {data!r} lacks ledger_id/entry_id") from exc
        for k, v in vals.items():
            if isinstance(v, bool) or not isinstance(v, int):
                raise SnapshotFormatError(f"position field {k} must be an int, got {v!r}")
        return cls(**vals)


@dataclass(frozen=True)
class DedupSnapshot:
    """The persisted map of one topic, exact up to and including `position`.

    `position` is None when nothing had been persisted yet (replay then starts at the earliest
    message). `entries` counts the persisted entries recorded over the map's life (for stats).
    """

    topic: str
    position: Optional[Position]
    producers: Mapping[str, int]
    entries: int = 0

    def to_bytes(self) -> bytes:
        """Deterministic JSON bytes (sorted keys)."""
        doc = {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "topic": self.topic,
            "position": self.position.to_json() if self.position is not None else None,
            "producers": dict(self.producers),
            "entries": self.entries,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> "DedupSnapshot":
        """Parse `to_bytes` output; raises SnapshotFormatError naming what is wrong."""
        try:
            doc = json.loads(bytes(raw).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise SnapshotFormatError(f"de-duplication snapshot is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotFormatError(f"not a de-duplication snapshot (format={doc.get('format') if isinstance(doc, dict) else None!r})")
        if doc.get("version") != SNAPSHOT_VERSION:
            raise SnapshotFormatError(f"unsupported de-duplication snapshot version {doc.get('version')!r}")
        topic = doc.get("topic")
        if not isinstance(topic, str) or not topic:
            raise SnapshotFormatError(f"snapshot topic must be a non-empty str, got {topic!r}")
        producers = doc.get("producers")
        if not isinstance(producers, dict):
            raise SnapshotFormatError("snapshot producers must be an object")
        for name, seq in producers.items():
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < NO_SEQUENCE:
                raise SnapshotFormatError(f"snapshot sequence id of producer {name!r} is invalid: {seq!r}")
        entries = doc.get("entries", 0)
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 0:
            raise SnapshotFormatError(f"snapshot entries must be a non-negative int, got {entries!r}")
        pos = doc.get("position")
        position = Position.from_json(pos) if pos is not None else None
        return cls(topic=topic, position=position, producers=dict(producers), entries=entries)


class SequenceMap:
    """Highest pushed and persisted sequence id per producer for one topic (not thread-safe)."""

    def __init__(
        self,
        topic: str,
        *,
        snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty str, got {topic!r}")
        if isinstance(snapshot_interval, bool) or not isinstance(snapshot_interval, int) or snapshot_interval < 1:
            raise ValueError(f"snapshot_interval must be an int >= 1, got {snapshot_interval!r}")
        if isinstance(max_producers, bool) or not isinstance(max_producers, int) or max_producers < 1:
            raise ValueError(f"max_producers must be an int >= 1, got {max_producers!r}")
        self.topic = topic
        self.snapshot_interval = snapshot_interval
        self.max_producers = max_producers
        self._pushed: Dict[str, int] = {}
        self._persisted: Dict[str, int] = {}
        # Oldest use first; OrderedDict.move_to_end keeps LRU bookkeeping O(1).
        self._lru: "OrderedDict[str, None]" = OrderedDict()
        self._active: Set[str] = set()
        self._position: Optional[Position] = None
        self._since_snapshot = 0
        self._entries = 0
        self.evicted = 0

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, producer: object) -> bool:
        return producer in self._lru

    def producers(self) -> Iterator[str]:
        """Tracked producer names, least recently used first."""
        return iter(list(self._lru))

    def highest_pushed(self, producer: str) -> int:
        """Highest sequence id pushed by `producer`, or -1 (NO_SEQUENCE) if unknown."""
        return self._pushed.get(producer, NO_SEQUENCE)

    def highest_persisted(self, producer: str) -> int:
        """Highest sequence id confirmed persisted for `producer`, or -1 if unknown."""
        return self._persisted.get(producer, NO_SEQUENCE)

    @property
    def position(self) -> Optional[Position]:
        """The position up to which the persisted map is exact."""
        return self._position

    @property
    def entries_since_snapshot(self) -> int:
        """Persisted entries recorded since the last snapshot."""
        return self._since_snapshot

    def is_active(self, producer: str) -> bool:
        """Whether `producer` is currently registered as connected."""
        return producer in self._active

    def should_publish(self, producer: str, seq: int) -> bool:
        """False when `seq` is at or below the producer's highest pushed id (a duplicate)."""
        _check_producer(producer)
        check_sequence_id(seq)
        return seq > self._pushed.get(producer, NO_SEQUENCE)

    # -- producer lifecycle ---------------------------------------------------------------

    def producer_added(self, producer: str) -> None:
        """Register `producer` as connected: it is never evicted while active."""
        _check_producer(producer)
        self._admit(producer)
        self._active.add(producer)

    def producer_removed(self, producer: str) -> None:
        """Mark `producer` inactive (its ids are kept until evicted)."""
        self._active.discard(producer)

    def _touch(self, producer: str) -> None:
        self._lru.move_to_end(producer)

    def _admit(self, producer: str) -> None:
        """Make room for `producer` if it is new, evicting the LRU inactive producer."""
        if producer in self._lru:
            self._touch(producer)
            return
        while len(self._lru) >= self.max_producers:
            victim = next((p for p in self._lru if p not in self._active), None)
            if victim is None:
                raise CapacityError(
                    f"topic {self.topic}: {len(self._lru)} producers tracked, all active; "
                    f"max_producers={self.max_producers} (brokerDeduplicationMaxNumberOfProducers)"
                )
            self._forget(victim)
            self.evicted += 1
            log.info("event=dedup_producer_evicted topic=%s producer=%s", self.topic, victim)
        self._lru[producer] = None

    def _forget(self, producer: str) -> None:
        self._lru.pop(producer, None)
        self._pushed.pop(producer, None)
        self._persisted.pop(producer, None)
        self._active.discard(producer)

    # -- publish path ----------------------------------------------------------------------

    def mark_pushed(self, producer: str, seq: int) -> None:
        """Record that `seq` was handed to the broker; it must exceed the highest pushed id."""
        _check_producer(producer)
        check_sequence_id(seq)
        last = self._pushed.get(producer, NO_SEQUENCE)
        if seq <= last:
            raise SequenceError(
                f"topic {self.topic} producer {producer}: sequence id {seq} is not above the highest pushed {last}"
            )
        self._admit(producer)
        self._pushed[producer] = seq

    def push_increasing(self, producer: str, seqs: Iterable[int]) -> List[bool]:
        """`should_publish` then `mark_pushed` for each id of a burst, with the producer checked
        once: True for an id above every id pushed before it (it is marked pushed), False for a
        duplicate (nothing recorded)."""
        _check_producer(producer)
        start = last = self._pushed.get(producer, NO_SEQUENCE)
        out: List[bool] = []
        for seq in seqs:
            if type(seq) is not int or not 0 <= seq <= MAX_SEQUENCE:
                check_sequence_id(seq)  # raises, naming the problem
            if seq > last:
                last = seq
                out.append(True)
            else:
                out.append(False)
        if last != start:
            self._admit(producer)
            self._pushed[producer] = last
        return out

    def rollback_pushed(self, producer: str, seq: int, previous: int) -> None:
        """Undo `mark_pushed(producer, seq)` when the send never left (back to `previous`)."""
        if self._pushed.get(producer) == seq:
            self._pushed[producer] = max(previous, self._persisted.get(producer, NO_SEQUENCE))

    def reset_pushed_to_persisted(self) -> None:
        """Forget pushed-but-unconfirmed ids (Pulsar's resetHighestSequenceIdPushed)."""
        for producer in list(self._pushed):
            self._pushed[producer] = self._persisted.get(producer, NO_SEQUENCE)

    def mark_persisted(
        self, producer: str, seq: int, position: Optional[Position] = None
    ) -> Optional[DedupSnapshot]:
        """Record a confirmed entry; returns a snapshot every `snapshot_interval` entries.

        Call it in the topic's order: the snapshot claims exactness up to `position`.
        `position` is None when the broker answered "duplicate" (-1:-1): the entry is already
        on the topic at an earlier position, so the last known position stays valid.
        """
        return self.mark_persisted_run(producer, seq, 1, position)

    def mark_persisted_run(
        self, producer: str, seq: int, count: int, position: Optional[Position] = None
    ) -> Optional[DedupSnapshot]:
        """`mark_persisted` for a run of `count` confirmed entries in the topic's order, `seq`
        the highest and `position` the latest known position among them: the same marks, one
        call (a snapshot, when the interval is reached within the run, is taken at its end)."""
        self._apply_persisted(producer, seq, position)
        self._entries += count
        self._since_snapshot += count
        if self._since_snapshot >= self.snapshot_interval:
            return self.take_snapshot()
        return None

    def _advance(self, position: Optional[Position]) -> None:
        if position is not None and (self._position is None or position > self._position):
            self._position = position

    # -- snapshot and recovery -------------------------------------------------------------

    def take_snapshot(self) -> DedupSnapshot:
        """The persisted map now, exact up to `position`; resets the entry counter."""
        self._since_snapshot = 0
        return DedupSnapshot(
            topic=self.topic, position=self._position, producers=dict(self._persisted), entries=self._entries
        )

    def restore(self, snapshot: DedupSnapshot) -> None:
        """Replace the state by `snapshot`; every producer starts inactive, as in Pulsar."""
        if snapshot.topic != self.topic:
            raise ValueError(f"snapshot is for topic {snapshot.topic}, this map is for {self.topic}")
        self._pushed.clear()
        self._persisted.clear()
        self._lru.clear()
        self._active.clear()
        # Lowest ids first so that, if the snapshot holds more than the cap, the most advanced
        # producers survive (a lossy cap, as Pulsar's snapshot cap is).
        for producer, seq in sorted(snapshot.producers.items(), key=lambda kv: kv[1]):
            self._admit(producer)
            self._pushed[producer] = seq
            self._persisted[producer] = seq
        self._position = snapshot.position
        self._entries = snapshot.entries
        self._since_snapshot = 0

    def replay(self, producer: str, seq: int, position: Optional[Position] = None) -> None:
        """Apply one entry read back from the topic after the snapshot position."""
        self._apply_persisted(producer, seq, position)

    def _apply_persisted(self, producer: str, seq: int, position: Optional[Position]) -> None:
        """An entry of `producer` with `seq` is on the topic (at `position`): raise both marks."""
        _check_producer(producer)
        check_sequence_id(seq)
        self._admit(producer)
        if seq > self._persisted.get(producer, NO_SEQUENCE):
            self._persisted[producer] = seq
        if seq > self._pushed.get(producer, NO_SEQUENCE):
            self._pushed[producer] = seq
        self._advance(position)

    def advance_position(self, position: Position) -> None:
        """Record that every entry up to `position` has been applied (end of a replay)."""
        self._advance(position)
