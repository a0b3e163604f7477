"""`DedupPublisher`: every output message leaves through here, exactly once per sequence id.

PIP-6 de-duplication done by the client, so it holds on a broker without de-duplication (the
embedded pulsar-lite) and agrees with the broker's own on a real cluster: each topic gets one
pulsar-client producer with the caller's stable producer name, every message carries an explicit
``sequence_id`` (what broker de-duplication keys on) and the properties ``__pl_producer__`` and
``__pl_seq__`` (Python cannot read a message's sequence id back, and recovery must).

Producer settings follow the Pulsar Python runtime's output producer (``setup_producer``):
``block_if_queue_full=True``, batching with a 10 ms delay, ``send_timeout_millis=0`` and LZ4.
All three are kept because they help correctness: a send timeout would fail messages during a
broker outage and leave holes; blocking instead of failing on a full queue does the same; and
batching is safe because only ids above the highest pushed are ever sent, so a batch never
straddles ids the broker has already stored (the client re-sends whole batches unchanged).

Threads: `publish` may be called from several threads, but ids must be monotonic per topic, so
callers normally publish from one. pulsar-client runs send callbacks on its I/O thread; the
callbacks only update memory and call the caller's callback (keep that short). Snapshots are
written to the state store by the calling thread (on the next `publish`, `flush` or `close`), never
on the client's I/O thread.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import pulsar

from ..state.base import StateStore
from ..topics import TopicName
from .recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY, RecoveryError, TailStats, position_of, read_tail
from .sequence_map import (
    DEFAULT_MAX_PRODUCERS,
    DEFAULT_SNAPSHOT_INTERVAL,
    NO_SEQUENCE,
    DedupError,
    DedupSnapshot,
    Position,
    SequenceMap,
    SnapshotFormatError,
    check_sequence_id,
)

log = logging.getLogger(__name__)

SNAPSHOT_KEY_PREFIX = "pulsar-lifecycle/dedup"
RESERVED_PROPERTIES = (PRODUCER_PROPERTY, SEQUENCE_PROPERTY)


class Outcome(str, Enum):
    """What happened to a publish. `publish` returns SENT or DUPLICATE; callbacks get the rest."""

    SENT = "sent"  # handed to the producer; the callback follows
    DUPLICATE = "duplicate"  # already on the topic (dropped here, or -1:-1 from broker de-dup)
    PERSISTED = "persisted"  # the broker stored it
    FAILED = "failed"  # the send failed; the topic's channel refuses further publishes


@dataclass(frozen=True)
class PublishResult:
    """Passed to a publish callback once the message's fate is known."""

    topic: str
    sequence_id: int
    outcome: Outcome
    position: Optional[Position] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the message is on the topic (persisted now or earlier)."""
        return self.outcome in (Outcome.PERSISTED, Outcome.DUPLICATE)


PublishCallback = Callable[[PublishResult], None]


class PublishError(DedupError):
    """A send failed or the topic's channel is unusable after an earlier failure."""


def snapshot_key(producer_name: str, topic: str) -> str:
    """The state-store key of one (producer, topic) snapshot."""
    return f"{SNAPSHOT_KEY_PREFIX}/{producer_name}@{topic}"


def normalize_topic(topic: str) -> str:
    """Pulsar's full topic name: `t` and `tenant/ns/t` get `persistent://` (and public/default)."""
    return TopicName.from_client(topic).full_name


@dataclass(frozen=True)
class OutMessage:
    """One message of `publish_many`."""

    payload: bytes
    sequence_id: int
    properties: Optional[Mapping[str, str]] = None
    partition_key: Optional[str] = None
    event_timestamp: Optional[int] = None
    deliver_at: Optional[int] = None  # broker delayed delivery (ms since epoch); None = now


# publish_many gives a message its own completion callback above this size: pulsar-client fails
# an oversized message on its own (MessageTooBig) while later ones succeed.
TRACK_EACH_ABOVE_BYTES = 1 << 20


@dataclass
class _Pending:
    seq: int
    callback: Optional[PublishCallback]
    done: bool = False
    position: Optional[Position] = None
    tracked: bool = True  # False: completed by the next tracked send of the channel (publish_many)
    stranded: bool = False  # untracked, and nothing will ever complete it (its channel failed)


@dataclass
class _Channel:
    """One output topic: its producer, its sequence map and the sends in flight."""

    topic: str
    seqmap: SequenceMap
    producer: Optional[pulsar.Producer] = None
    recovery: Optional[TailStats] = None
    pending: Deque[_Pending] = field(default_factory=deque)
    outstanding: int = 0  # sends whose callback has not run yet
    untracked: int = 0  # untracked sends not yet completed by a tracked one
    # Duplicates of ids still in flight: (seq, tiebreak, callback), fired when persisted reaches seq.
    waiters: List[Tuple[int, int, PublishCallback]] = field(default_factory=list)
    failed: Optional[str] = None
    failed_seq: Optional[int] = None
    due_snapshot: Optional[DedupSnapshot] = None
    written_entries: int = -1  # `entries` of the last snapshot written, to never write an older one
    sent: int = 0
    duplicates: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    publish_lock: threading.Lock = field(default_factory=threading.Lock)
    snapshot_lock: threading.Lock = field(default_factory=threading.Lock)


class DedupPublisher:
    """Publishes each (producer, sequence id) at most once per topic, across crashes.

    `producer_name` must be stable across restarts and unique among live publishers (e.g.
    "<tenant>/<ns>/<function>-<instance>-release"). Sequence ids must be > 0 and increase per
    topic; an id at or below the highest already pushed is dropped and reported as DUPLICATE.
    The first publish to a topic (or `open(topic)`) recovers the topic's sequence map from the
    state store's snapshot plus a replay of the topic after it.
    """

    def __init__(
        self,
        client: pulsar.Client,
        producer_name: str,
        state_store: StateStore,
        *,
        snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
        batching_max_publish_delay_ms: int = 10,
        compression_type: pulsar.CompressionType = pulsar.CompressionType.LZ4,
        max_pending_messages: int = 1000,
        producer_properties: Optional[Mapping[str, str]] = None,
        recovery_timeout_s: float = 120.0,
        recovery_max_messages: int = 10_000_000,
    ) -> None:
        if not isinstance(producer_name, str) or not producer_name.strip():
            raise ValueError(f"producer_name must be a non-empty str, got {producer_name!r}")
        if not isinstance(state_store, StateStore):
            raise TypeError(f"state_store must implement StateStore (put/get bytes), got {type(state_store).__name__}")
        if recovery_timeout_s <= 0:
            raise ValueError(f"recovery_timeout_s must be > 0, got {recovery_timeout_s!r}")
        if recovery_max_messages < 1:
            raise ValueError(f"recovery_max_messages must be >= 1, got {recovery_max_messages!r}")
        self.client = client
        self.producer_name = producer_name
        self.state_store = state_store
        self.snapshot_interval = snapshot_interval
        self.max_producers = max_producers
        self.batching_max_publish_delay_ms = batching_max_publish_delay_ms
        self.compression_type = compression_type
        self.max_pending_messages = max_pending_messages
        self.producer_properties = dict(producer_properties or {})
        self.recovery_timeout_s = recovery_timeout_s
        self.recovery_max_messages = recovery_max_messages
        # Validates the map settings now rather than at the first publish.
        SequenceMap("validation", snapshot_interval=snapshot_interval, max_producers=max_producers)
        self._channels: Dict[str, _Channel] = {}
        self._names: Dict[str, str] = {}  # topic as given -> normalized name
        self._lock = threading.Lock()
        self._open_locks: Dict[str, threading.Lock] = {}
        self._tiebreak = itertools.count()
        self._closed = False

    # -- opening and recovery --------------------------------------------------------------

    def open(self, topic: str) -> int:
        """Recover `topic` (if not yet open) and create its producer; returns the highest persisted id."""
        return self._channel(normalize_topic(topic)).seqmap.highest_persisted(self.producer_name)

    def _channel_for(self, topic: str) -> _Channel:
        """The channel of `topic` as the caller spells it (the normalized name is cached)."""
        full = self._names.get(topic)
        if full is None:
            full = normalize_topic(topic)
            self._names[topic] = full
        return self._channel(full)

    def _channel(self, topic: str) -> _Channel:
        ch = self._channels.get(topic)
        if ch is not None:
            return ch
        with self._lock:
            if self._closed:
                raise PublishError(f"publisher {self.producer_name} is closed")
            open_lock = self._open_locks.setdefault(topic, threading.Lock())
        with open_lock:
            ch = self._channels.get(topic)
            if ch is None:
                ch = self._open_channel(topic)
                with self._lock:
                    self._channels[topic] = ch
        return ch

    def _check_not_partitioned(self, topic: str) -> None:
        parts = [normalize_topic(p) for p in self.client.get_topic_partitions(topic)]
        if parts != [topic]:
            raise ValueError(
                f"topic {topic} is partitioned ({len(parts)} partitions): de-duplication is per partition, "
                "publish to each partition by name (<topic>-partition-<k>)"
            )

    def _open_channel(self, topic: str) -> _Channel:
        self._check_not_partitioned(topic)
        seqmap = SequenceMap(topic, snapshot_interval=self.snapshot_interval, max_producers=self.max_producers)
        key = snapshot_key(self.producer_name, topic)
        raw = self.state_store.get(key)
        snapshot: Optional[DedupSnapshot] = None
        if raw is not None:
            try:
                snapshot = DedupSnapshot.from_bytes(raw)
                seqmap.restore(snapshot)
            except (SnapshotFormatError, ValueError) as exc:
                # Replaying the whole topic gives the exact map too, only slower.
                log.warning("event=dedup_snapshot_unreadable topic=%s key=%s error=%s", topic, key, exc)
                snapshot = None
                seqmap = SequenceMap(topic, snapshot_interval=self.snapshot_interval, max_producers=self.max_producers)
        name = self.producer_name

        def on_message(msg: pulsar.Message) -> bool:
            props = msg.properties()
            if props.get(PRODUCER_PROPERTY) != name:
                return False
            raw_seq = props.get(SEQUENCE_PROPERTY)
            try:
                seq = check_sequence_id(int(raw_seq))
            except (TypeError, ValueError):
                log.warning(
                    "event=dedup_replay_bad_sequence topic=%s producer=%s position=%s value=%r",
                    topic, name, position_of(msg.message_id()), raw_seq,
                )
                return False
            seqmap.replay(name, seq, position_of(msg.message_id()))
            return True

        stats = read_tail(
            self.client, topic, seqmap.position, on_message,
            timeout_s=self.recovery_timeout_s, max_messages=self.recovery_max_messages,
        )
        if stats.end is not None and stats.messages_read:
            seqmap.advance_position(stats.end)
        seqmap.producer_added(name)
        ch = _Channel(topic=topic, seqmap=seqmap, recovery=stats)
        if stats.messages_read:
            # Record the replay so the next recovery starts after it (Pulsar does this only past
            # brokerDeduplicationEntriesInterval entries; one put is cheaper than any re-read).
            ch.due_snapshot = seqmap.take_snapshot()
            self._write_due_snapshot(ch)
        ch.producer = self.client.create_producer(
            topic,
            producer_name=name,
            block_if_queue_full=True,
            batching_enabled=True,
            batching_max_publish_delay_ms=self.batching_max_publish_delay_ms,
            send_timeout_millis=0,
            compression_type=self.compression_type,
            max_pending_messages=self.max_pending_messages,
            properties=self.producer_properties or None,
        )
        log.info(
            "event=dedup_channel_opened topic=%s producer=%s snapshot=%s snapshot_position=%s replayed=%d "
            "matched=%d highest=%d recovery_seconds=%.3f",
            topic, name, snapshot is not None, snapshot.position if snapshot else None,
            stats.messages_read, stats.matched, seqmap.highest_persisted(name), stats.seconds,
        )
        return ch

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        sequence_id: int,
        *,
        properties: Optional[Mapping[str, str]] = None,
        partition_key: Optional[str] = None,
        ordering_key: Optional[str] = None,
        event_timestamp: Optional[int] = None,
        callback: Optional[PublishCallback] = None,
    ) -> Outcome:
        """Send `payload` with `sequence_id` unless that id is already pushed; returns SENT or DUPLICATE.

        `callback(PublishResult)` runs once the fate is known: PERSISTED, DUPLICATE (for a dropped
        id, once everything up to it is persisted) or FAILED.
        """
        props = self._checked_message(payload, sequence_id, properties)
        if self._closed:
            raise PublishError(f"publisher {self.producer_name} is closed")
        ch = self._channel_for(topic)
        if ch.due_snapshot is not None:  # unlocked peek; _write_due_snapshot re-checks under the lock
            self._write_due_snapshot(ch)
        name = self.producer_name
        immediate: Optional[PublishResult] = None
        with ch.publish_lock:
            with ch.cond:
                if ch.failed is not None:
                    raise self._channel_failed(ch)
                if not ch.seqmap.should_publish(name, sequence_id):
                    ch.duplicates += 1
                    if sequence_id <= ch.seqmap.highest_persisted(name):
                        immediate = PublishResult(ch.topic, sequence_id, Outcome.DUPLICATE)
                    elif callback is not None:
                        heapq.heappush(ch.waiters, (sequence_id, next(self._tiebreak), callback))
                    log.debug("event=dedup_duplicate_dropped topic=%s producer=%s seq=%d", ch.topic, name, sequence_id)
                    outcome = Outcome.DUPLICATE
                else:
                    previous = ch.seqmap.highest_pushed(name)
                    ch.seqmap.mark_pushed(name, sequence_id)
                    pending = _Pending(sequence_id, callback)
                    ch.pending.append(pending)
                    ch.outstanding += 1
                    outcome = Outcome.SENT
            if outcome is Outcome.SENT:
                try:
                    assert ch.producer is not None
                    ch.producer.send_async(
                        bytes(payload),
                        lambda res, msg_id: self._on_send_complete(ch, pending, res, msg_id),
                        properties=props,
                        partition_key=partition_key,
                        ordering_key=ordering_key,
                        sequence_id=sequence_id,
                        event_timestamp=event_timestamp,
                    )
                except Exception as exc:
                    # Nothing left the client: undo the push so the same id can be retried.
                    with ch.cond:
                        if ch.pending and ch.pending[-1] is pending:
                            ch.pending.pop()
                        ch.outstanding -= 1
                        ch.seqmap.rollback_pushed(name, sequence_id, previous)
                        ch.cond.notify_all()
                    raise PublishError(f"topic {ch.topic} producer {name}: send of sequence id {sequence_id} failed: {exc}") from exc
                ch.sent += 1
        if immediate is not None and callback is not None:
            self._safe_callback(callback, immediate)
        return outcome

    def publish_many(self, topic: str, messages: Sequence[OutMessage]) -> List[Outcome]:
        """Publish messages with increasing sequence ids to one topic; SENT or DUPLICATE each.

        The fast path for bursts: only the last message sent (and any over
        TRACK_EACH_ABOVE_BYTES) gets a completion callback from pulsar-client, whose success
        also completes the earlier ones (a producer completes its sends in order); a Python
        callback per message costs more than the send itself. There are no per-message
        callbacks: read progress with `persisted_seq(topic)` and failures with `check()`.
        A send that raises fails the channel (the earlier untracked sends have no known fate).
        """
        if self._closed:
            raise PublishError(f"publisher {self.producer_name} is closed")
        ch = self._channel_for(topic)
        if ch.due_snapshot is not None:
            self._write_due_snapshot(ch)
        name = self.producer_name
        outcomes: List[Outcome] = []
        with ch.publish_lock:
            held: Optional[Tuple[_Pending, OutMessage, Dict[str, str]]] = None
            try:
                for m in messages:
                    seq = m.sequence_id
                    props = self._checked_message(m.payload, seq, m.properties)
                    with ch.cond:
                        if ch.failed is not None:
                            raise self._channel_failed(ch)
                        if not ch.seqmap.should_publish(name, seq):
                            ch.duplicates += 1
                            outcomes.append(Outcome.DUPLICATE)
                            continue
                        ch.seqmap.mark_pushed(name, seq)
                        pending = _Pending(seq, None, tracked=len(m.payload) > TRACK_EACH_ABOVE_BYTES)
                        ch.pending.append(pending)
                        ch.outstanding += 1
                        ch.untracked += 0 if pending.tracked else 1
                    if pending.tracked and held is not None:
                        self._track(ch, held[0])  # close the group before a message that may fail alone
                    outcomes.append(Outcome.SENT)
                    if held is not None:
                        self._send_held(ch, *held)
                    held = (pending, m, props)
            except BaseException:
                # A bad message (or a failed channel) ends the burst early; the message held back
                # was accepted, so it is sent, tracked, unless the channel can no longer send.
                if held is not None:
                    if ch.failed is None:
                        self._track(ch, held[0])
                        try:
                            self._send_held(ch, *held)
                        except PublishError:
                            pass  # stranded, channel failed; the original error is the one to raise
                    else:
                        self._strand(ch, held[0], "publish_many aborted before this send")
                raise
            if held is not None:
                self._track(ch, held[0])
                self._send_held(ch, *held)
        return outcomes

    @staticmethod
    def _track(ch: _Channel, pending: _Pending) -> None:
        """Give a not-yet-sent message its own completion callback (it closes the group)."""
        with ch.cond:
            if not pending.tracked:
                pending.tracked = True
                ch.untracked -= 1

    def _strand(self, ch: _Channel, pending: _Pending, reason: str) -> None:
        """`pending`, and the untracked sends it would have completed, will never complete: fail
        the channel and take them out of the in-flight count (the watermark stops there)."""
        with ch.cond:
            if ch.failed is None:
                ch.failed, ch.failed_seq = reason, pending.seq
            for p in [p for p in ch.pending if p is pending or not p.tracked]:
                if not p.stranded and not p.done:
                    p.stranded = True
                    ch.outstanding -= 1
                    if not p.tracked:
                        ch.untracked -= 1
            ch.cond.notify_all()

    def _send_held(self, ch: _Channel, pending: _Pending, m: OutMessage, props: Dict[str, str]) -> None:
        assert ch.producer is not None
        callback = (lambda res, msg_id: self._on_send_complete(ch, pending, res, msg_id)) if pending.tracked else None
        try:
            extra = {} if m.deliver_at is None else {"deliver_at": int(m.deliver_at)}
            ch.producer.send_async(bytes(m.payload), callback, properties=props, partition_key=m.partition_key,
                                   sequence_id=m.sequence_id, event_timestamp=m.event_timestamp, **extra)
        except Exception as exc:
            self._strand(ch, pending, f"send raised: {exc}")
            log.error("event=dedup_send_failed topic=%s producer=%s seq=%d error=%r", ch.topic, self.producer_name,
                      pending.seq, exc)
            raise PublishError(f"topic {ch.topic} producer {self.producer_name}: send of sequence id "
                               f"{pending.seq} failed: {exc}") from exc
        ch.sent += 1

    def check(self) -> None:
        """Raise PublishError if a send on any topic failed (the channel then refuses publishes)."""
        for ch in list(self._channels.values()):
            if ch.failed is not None:
                raise self._send_failed(ch)

    def _channel_failed(self, ch: _Channel) -> PublishError:
        """The error for a publish on a channel that failed earlier."""
        return PublishError(f"topic {ch.topic} producer {self.producer_name}: channel failed at sequence id "
                            f"{ch.failed_seq}: {ch.failed}")

    def _send_failed(self, ch: _Channel) -> PublishError:
        """The error reporting the send that failed the channel."""
        return PublishError(f"topic {ch.topic} producer {self.producer_name}: send of sequence id "
                            f"{ch.failed_seq} failed: {ch.failed}")

    def _checked_message(self, payload: object, seq: int, properties: Optional[Mapping[str, str]]) -> Dict[str, str]:
        """Check one message's id, payload and properties; its properties with the dedup ones added."""
        check_sequence_id(seq, allow_zero=False)  # pulsar-client ignores 0 (truthiness)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        props: Dict[str, str] = {}
        for k, v in (properties or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"message properties must be str -> str, got {k!r}: {v!r}")
            if k in RESERVED_PROPERTIES:
                raise ValueError(f"message property {k!r} is reserved for de-duplication")
            props[k] = v
        props[PRODUCER_PROPERTY] = self.producer_name
        props[SEQUENCE_PROPERTY] = str(seq)
        return props

    def _on_send_complete(self, ch: _Channel, pending: _Pending, res: object, msg_id: object) -> None:
        # Runs on pulsar-client's I/O thread: an exception escaping here kills the process.
        try:
            self._complete(ch, pending, res, msg_id)
        except Exception:  # pragma: no cover - defensive
            log.exception("event=dedup_callback_error topic=%s seq=%d", ch.topic, pending.seq)

    def _complete(self, ch: _Channel, pending: _Pending, res: object, msg_id: object) -> None:
        name = self.producer_name
        fire: List[Tuple[PublishCallback, PublishResult]] = []
        with ch.cond:
            ch.outstanding -= 1
            # Untracked sends before this one complete with it: pulsar-client completes a
            # producer's sends in order (an ack out of order makes it reconnect and resend).
            covered: List[_Pending] = []
            if ch.untracked:
                covered = [p for p in itertools.takewhile(lambda p: p is not pending, ch.pending)
                           if not p.tracked and not p.done and not p.stranded]
                ch.outstanding -= len(covered)
                ch.untracked -= len(covered)
                if res != pulsar.Result.Ok:
                    for p in covered:
                        p.stranded = True
            if res == pulsar.Result.Ok:
                for p in covered:
                    p.done = True
                pos = position_of(msg_id)
                # -1:-1 is broker de-duplication saying "already stored": a success.
                broker_dup = pos.ledger_id < 0 and pos.entry_id < 0
                pending.position = None if broker_dup else pos
                pending.done = True
                if pending.callback is not None:
                    outcome = Outcome.DUPLICATE if broker_dup else Outcome.PERSISTED
                    fire.append((pending.callback, PublishResult(ch.topic, pending.seq, outcome, pending.position)))
            else:
                err = str(res)
                if ch.failed is None:
                    ch.failed, ch.failed_seq = err, pending.seq
                    log.error("event=dedup_send_failed topic=%s producer=%s seq=%d result=%s", ch.topic, name, pending.seq, err)
                if pending.callback is not None:
                    fire.append((pending.callback, PublishResult(ch.topic, pending.seq, Outcome.FAILED, error=err)))
            # The persisted watermark only moves over a prefix of completed sends, so a snapshot
            # never claims an id whose predecessors are not all on the topic.
            while ch.pending and ch.pending[0].done:
                head = ch.pending.popleft()
                snap = ch.seqmap.mark_persisted(name, head.seq, head.position)
                if snap is not None:
                    ch.due_snapshot = snap
            persisted = ch.seqmap.highest_persisted(name)
            while ch.waiters and ch.waiters[0][0] <= persisted:
                seq, _, cb = heapq.heappop(ch.waiters)
                fire.append((cb, PublishResult(ch.topic, seq, Outcome.DUPLICATE)))
            if ch.failed is not None:
                while ch.waiters:
                    seq, _, cb = heapq.heappop(ch.waiters)
                    fire.append((cb, PublishResult(ch.topic, seq, Outcome.FAILED, error=ch.failed)))
            ch.cond.notify_all()
        for cb, result in fire:
            self._safe_callback(cb, result)

    @staticmethod
    def _safe_callback(cb: PublishCallback, result: PublishResult) -> None:
        try:
            cb(result)
        except Exception:
            log.exception("event=dedup_user_callback_error topic=%s seq=%d", result.topic, result.sequence_id)

    # -- snapshots -------------------------------------------------------------------------

    def _write_due_snapshot(self, ch: _Channel) -> None:
        with ch.snapshot_lock:
            with ch.cond:
                snap, ch.due_snapshot = ch.due_snapshot, None
            if snap is None or snap.entries < ch.written_entries:
                return
            try:
                self.state_store.put(snapshot_key(self.producer_name, ch.topic), snap.to_bytes())
            except Exception as exc:
                # Snapshots only shorten recovery (the tail replay is what makes it exact), so a
                # store outage must not stop publishing; the next interval tries again.
                log.error(
                    "event=dedup_snapshot_write_failed topic=%s producer=%s entries=%d error=%s",
                    ch.topic, self.producer_name, snap.entries, exc,
                )
                return
            ch.written_entries = snap.entries
            log.info(
                "event=dedup_snapshot_written topic=%s producer=%s position=%s highest=%d entries=%d",
                ch.topic, self.producer_name, snap.position, snap.producers.get(self.producer_name, NO_SEQUENCE),
                snap.entries,
            )

    def snapshot(self, topic: str) -> DedupSnapshot:
        """Write the topic's persisted map to the state store now and return it."""
        ch = self._channel(normalize_topic(topic))
        with ch.cond:
            ch.due_snapshot = ch.seqmap.take_snapshot()
            snap = ch.due_snapshot
        self._write_due_snapshot(ch)
        return snap

    # -- watermarks ------------------------------------------------------------------------

    def persisted_seq(self, topic: str) -> int:
        """Highest id such that it and every id pushed before it are on the topic (-1 if none).

        A caller that commits its own progress only up to this id never commits a message that a
        crash could lose.
        """
        ch = self._channels.get(normalize_topic(topic))
        if ch is None:
            return NO_SEQUENCE
        with ch.cond:
            return ch.seqmap.highest_persisted(self.producer_name)

    def pushed_seq(self, topic: str) -> int:
        """Highest id handed to the producer for `topic` (-1 if none)."""
        ch = self._channels.get(normalize_topic(topic))
        if ch is None:
            return NO_SEQUENCE
        with ch.cond:
            return ch.seqmap.highest_pushed(self.producer_name)

    def recovery_stats(self, topic: str) -> Optional[TailStats]:
        """What the recovery of `topic` replayed, or None if the topic is not open."""
        ch = self._channels.get(normalize_topic(topic))
        return ch.recovery if ch is not None else None

    def topics(self) -> List[str]:
        """Topics opened so far."""
        return sorted(self._channels)

    # -- flush and close -------------------------------------------------------------------

    def flush(self, timeout_s: Optional[float] = 30.0) -> None:
        """Wait until every send has completed and write any due snapshot.

        Raises TimeoutError after `timeout_s` (None waits forever) and PublishError if a send failed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for ch in list(self._channels.values()):
            with ch.cond:
                while ch.outstanding > 0:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(
                            f"topic {ch.topic} producer {self.producer_name}: {ch.outstanding} sends still "
                            f"in flight after {timeout_s}s"
                        )
                    ch.cond.wait(remaining if remaining is None else min(remaining, 1.0))
            self._write_due_snapshot(ch)
            if ch.failed is not None:
                raise self._send_failed(ch)

    def close(self, timeout_s: Optional[float] = 30.0) -> None:
        """Flush, write a final snapshot per topic and close the producers (not the client)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush(timeout_s)
        except (TimeoutError, PublishError) as exc:
            # The snapshot below is still exact: it stops at the last contiguous confirmed id.
            log.warning("event=dedup_close_flush_incomplete producer=%s error=%s", self.producer_name, exc)
        for ch in list(self._channels.values()):
            with ch.cond:
                ch.due_snapshot = ch.seqmap.take_snapshot()
                ch.seqmap.producer_removed(self.producer_name)
            self._write_due_snapshot(ch)
            if ch.producer is not None:
                try:
                    ch.producer.close()
                except pulsar.PulsarException as exc:
                    log.warning("event=dedup_producer_close_failed topic=%s error=%s", ch.topic, exc)
            log.info(
                "event=dedup_channel_closed topic=%s producer=%s persisted=%d sent=%d duplicates=%d",
                ch.topic, self.producer_name, ch.seqmap.highest_persisted(self.producer_name), ch.sent, ch.duplicates,
            )

    def __enter__(self) -> "DedupPublisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "DedupPublisher",
    "OutMessage",
    "Outcome",
    "PublishCallback",
    "PublishError",
    "PublishResult",
    "RecoveryError",
    "normalize_topic",
    "snapshot_key",
]
