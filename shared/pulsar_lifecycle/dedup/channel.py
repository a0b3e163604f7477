"""`TopicChannel`: one output topic of a DedupPublisher — its producer, its sequence map, the sends
in flight and their completion, and the topic's dedup snapshot.

Threads: `cond` guards the in-flight state; pulsar-client runs `on_send_complete` on its I/O
thread (it only updates memory and runs the callers' callbacks); `publish_lock` serializes the
publishes of the topic; `snapshot_lock` serializes snapshot writes (done by calling threads,
never on the client's I/O thread).
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
from typing import Any, Callable, Deque, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

import pulsar

try:  # pulsar-client's native module: the message builder behind pulsar.Producer.send_async
    from _pulsar import MessageBuilder as _MessageBuilder
except ImportError:  # pragma: no cover - another pulsar-client layout; the public send is used
    _MessageBuilder = None

from ..state.base import StateStore
from .recovery import TailStats, position_of
from .sequence_map import NO_SEQUENCE, DedupError, DedupSnapshot, Position, SequenceMap

log = logging.getLogger(__name__)

SNAPSHOT_KEY_PREFIX = "pulsar-lifecycle/dedup"


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


class OutMessage(NamedTuple):
    """One message of `publish_many` (a NamedTuple: callers build one per message, and a frozen
    dataclass costs about three times as much to build)."""

    payload: bytes
    sequence_id: int
    properties: Optional[Mapping[str, str]] = None
    partition_key: Optional[str] = None
    event_timestamp: Optional[int] = None
    deliver_at: Optional[int] = None  # broker delayed delivery (ms since epoch); None = now


# publish_many gives a message its own completion callback above this size: pulsar-client fails
# an oversized message on its own (MessageTooBig) while later ones succeed.
TRACK_EACH_ABOVE_BYTES = 1 << 20

# Checks one message (payload, sequence id, caller's properties); returns its properties to send.
MessageCheck = Callable[[Any, int, Optional[Mapping[str, str]]], Dict[str, str]]


def snapshot_key(producer_name: str, topic: str) -> str:
    """The state-store key of one (producer, topic) snapshot."""
    return f"{SNAPSHOT_KEY_PREFIX}/{producer_name}@{topic}"


def _runs(accepted: List[Tuple[OutMessage, Dict[str, str]]]) -> List[List[Tuple[OutMessage, Dict[str, str]]]]:
    """A burst's runs: all of it, except that a message over TRACK_EACH_ABOVE_BYTES is a run of its own."""
    if not any(len(m.payload) > TRACK_EACH_ABOVE_BYTES for m, _ in accepted):
        return [accepted] if accepted else []
    runs: List[List[Tuple[OutMessage, Dict[str, str]]]] = [[]]
    for mp in accepted:
        if len(mp[0].payload) > TRACK_EACH_ABOVE_BYTES:
            runs.append([mp])
            runs.append([])
        else:
            runs[-1].append(mp)
    return [run for run in runs if run]


def safe_callback(cb: PublishCallback, result: PublishResult) -> None:
    """Run a caller's callback; an exception is logged, never raised into pulsar-client's thread."""
    try:
        cb(result)
    except Exception:
        log.exception("event=dedup_user_callback_error topic=%s seq=%d", result.topic, result.sequence_id)


@dataclass
class PendingSend:
    """One send in flight, or a run of them: the `count` sends up to and including `seq`, of
    which only the last has a completion callback (publish_many); pulsar-client completes a
    producer's sends in order, so that callback completes the whole run."""

    seq: int
    callback: Optional[PublishCallback]
    done: bool = False
    position: Optional[Position] = None
    count: int = 1
    stranded: bool = False  # nothing will ever complete it (a send of the run raised; its channel failed)


@dataclass
class TopicChannel:
    """One output topic: its producer, its sequence map and the sends in flight."""

    topic: str
    seqmap: SequenceMap
    producer_name: str
    state_store: StateStore
    producer: Optional[pulsar.Producer] = None
    recovery: Optional[TailStats] = None
    pending: Deque[PendingSend] = field(default_factory=deque)
    outstanding: int = 0  # sends not yet completed (a run counts its sends)
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
    tiebreak: "itertools.count[int]" = field(default_factory=itertools.count)
    # Optional: called on pulsar-client's I/O thread with (topic, sequence id, message id) for
    # every message this channel's broker confirms (DedupPublisher.track_landed); keep it short.
    on_landed: Optional[Callable[[str, int, Any], None]] = None

    # -- errors ----------------------------------------------------------------------------------
    def failed_error(self) -> PublishError:
        """The error for a publish on a channel that failed earlier."""
        return PublishError(f"topic {self.topic} producer {self.producer_name}: channel failed at sequence id "
                            f"{self.failed_seq}: {self.failed}")

    def send_failed_error(self) -> PublishError:
        """The error reporting the send that failed the channel."""
        return PublishError(f"topic {self.topic} producer {self.producer_name}: send of sequence id "
                            f"{self.failed_seq} failed: {self.failed}")

    # -- publishing ------------------------------------------------------------------------------
    def publish(self, payload: bytes, sequence_id: int, props: Dict[str, str], *,
                callback: Optional[PublishCallback], partition_key: Optional[str], ordering_key: Optional[str],
                event_timestamp: Optional[int]) -> Outcome:
        """DedupPublisher.publish on this topic, with the message already checked (`props` has the
        dedup properties): send unless the id is already pushed; SENT or DUPLICATE."""
        name = self.producer_name
        immediate: Optional[PublishResult] = None
        with self.publish_lock:
            with self.cond:
                if self.failed is not None:
                    raise self.failed_error()
                if not self.seqmap.should_publish(name, sequence_id):
                    self.duplicates += 1
                    if sequence_id <= self.seqmap.highest_persisted(name):
                        immediate = PublishResult(self.topic, sequence_id, Outcome.DUPLICATE)
                    elif callback is not None:
                        heapq.heappush(self.waiters, (sequence_id, next(self.tiebreak), callback))
                    log.debug("event=dedup_duplicate_dropped topic=%s producer=%s seq=%d", self.topic, name, sequence_id)
                    outcome = Outcome.DUPLICATE
                else:
                    previous = self.seqmap.highest_pushed(name)
                    self.seqmap.mark_pushed(name, sequence_id)
                    pending = PendingSend(sequence_id, callback)
                    self.pending.append(pending)
                    self.outstanding += 1
                    outcome = Outcome.SENT
            if outcome is Outcome.SENT:
                try:
                    assert self.producer is not None
                    self.producer.send_async(
                        bytes(payload),
                        lambda res, msg_id: self.on_send_complete(pending, res, msg_id),
                        properties=props,
                        partition_key=partition_key,
                        ordering_key=ordering_key,
                        sequence_id=sequence_id,
                        event_timestamp=event_timestamp,
                    )
                except Exception as exc:
                    # Nothing left the client: undo the push so the same id can be retried.
                    with self.cond:
                        if self.pending and self.pending[-1] is pending:
                            self.pending.pop()
                        self.outstanding -= 1
                        self.seqmap.rollback_pushed(name, sequence_id, previous)
                        self.cond.notify_all()
                    raise PublishError(f"topic {self.topic} producer {name}: send of sequence id {sequence_id} "
                                       f"failed: {exc}") from exc
                self.sent += 1
        if immediate is not None and callback is not None:
            safe_callback(callback, immediate)
        return outcome

    def publish_many(self, messages: Iterable[OutMessage], check: MessageCheck) -> List[Outcome]:
        """DedupPublisher.publish_many on this topic; `check(payload, seq, properties)` validates a
        message and gives its properties with the dedup ones (raising ends the burst there).

        Per burst, not per message (the syncer's forward rate, docs/benchmarks.md): every message
        is checked first, the sequence map and the in-flight list are updated under one lock,
        then the accepted messages are sent in order as runs (`PendingSend.count`), each with
        one completion callback on its last send. A burst is one run, except that a message
        over TRACK_EACH_ABOVE_BYTES is a run of its own (pulsar-client fails an oversized message
        alone, while the ones after it succeed)."""
        name = self.producer_name
        checked: List[Tuple[OutMessage, Dict[str, str]]] = []
        error: Optional[BaseException] = None
        for m in messages:
            try:
                checked.append((m, check(m.payload, m.sequence_id, m.properties)))
            except BaseException as exc:  # the messages before it are still published
                error = exc
                break
        with self.publish_lock:
            with self.cond:
                if self.failed is not None:
                    raise self.failed_error()
                seqmap = self.seqmap
                fresh = seqmap.push_increasing(name, [m.sequence_id for m, _ in checked])
                if all(fresh):
                    accepted = checked
                    outcomes = [Outcome.SENT] * len(checked)
                else:
                    accepted, outcomes = [], []
                    for mp, push in zip(checked, fresh):
                        if push:
                            accepted.append(mp)
                            outcomes.append(Outcome.SENT)
                            continue
                        self.duplicates += 1
                        outcomes.append(Outcome.DUPLICATE)
                        log.debug("event=dedup_duplicate_dropped topic=%s producer=%s seq=%d highest_persisted=%d",
                                  self.topic, name, mp[0].sequence_id, seqmap.highest_persisted(name))
                runs = _runs(accepted)
                queued = [PendingSend(run[-1][0].sequence_id, None, count=len(run)) for run in runs]
                self.pending.extend(queued)
                self.outstanding += len(accepted)
            for i, (pending, run) in enumerate(zip(queued, runs)):
                try:
                    if self.failed is not None:
                        # An earlier run of the burst failed (pulsar-client fails an oversized
                        # message at once): nothing after it is sent.
                        raise self.failed_error()
                    self.send_run(pending, run)
                except PublishError:
                    # The channel failed (send_run stranded its run); the runs after it will
                    # never be sent.
                    for later in queued[i:]:
                        self.strand(later, "publish_many aborted before this send")
                    raise
        if error is not None:
            raise error
        return outcomes

    # -- sends in flight -------------------------------------------------------------------------
    def strand(self, pending: PendingSend, reason: str) -> None:
        """`pending` (a send or a run) will never complete: fail the channel and take it out of
        the in-flight count (the watermark stops before it)."""
        with self.cond:
            if self.failed is None:
                self.failed, self.failed_seq = reason, pending.seq
            if not pending.stranded and not pending.done:
                pending.stranded = True
                self.outstanding -= pending.count
            self.cond.notify_all()

    def send_run(self, pending: PendingSend, run: List[Tuple[OutMessage, Dict[str, str]]]) -> None:
        """Hand a run's messages to the producer, the last one with the run's completion callback."""
        assert self.producer is not None
        callback = lambda res, msg_id: self.on_send_complete(pending, res, msg_id)  # noqa: E731
        last = len(run) - 1
        i = 0
        if self.on_landed is not None:
            self._send_run_tracked(pending, run, self.on_landed)
            return
        try:
            raw = getattr(self.producer, "_producer", None)
            if raw is not None and _MessageBuilder is not None:
                # pulsar.Producer.send_async builds the message with a type check and a call per
                # property; building it here (one call for all properties) is the same message for
                # a third of the cost. Fallback: the public call (another pulsar-client layout).
                builder, send = _MessageBuilder, raw.send_async
                for i, (m, props) in enumerate(run):
                    mb = builder().content(bytes(m.payload)).properties(props).sequence_id(m.sequence_id)
                    if m.partition_key:
                        mb.partition_key(m.partition_key)
                    if m.event_timestamp:
                        mb.event_timestamp(m.event_timestamp)
                    if m.deliver_at is not None:
                        mb.deliver_at(int(m.deliver_at))
                    send(mb.build(), callback if i == last else None)
            else:
                for i, (m, props) in enumerate(run):
                    extra = {} if m.deliver_at is None else {"deliver_at": int(m.deliver_at)}
                    self.producer.send_async(bytes(m.payload), callback if i == last else None, properties=props,
                                             partition_key=m.partition_key, sequence_id=m.sequence_id,
                                             event_timestamp=m.event_timestamp, **extra)
        except Exception as exc:
            self.strand(pending, f"send raised: {exc}")
            seq = run[i][0].sequence_id
            log.error("event=dedup_send_failed topic=%s producer=%s seq=%d error=%r", self.topic, self.producer_name,
                      seq, exc)
            raise PublishError(f"topic {self.topic} producer {self.producer_name}: send of sequence id "
                               f"{seq} failed: {exc}") from exc
        self.sent += len(run)

    def _send_run_tracked(self, pending: PendingSend, run: List[Tuple[OutMessage, Dict[str, str]]],
                          landed: Callable[[str, int, Any], None]) -> None:
        """`send_run` with a completion callback on every message that reports where it landed
        (`on_landed`); the last one also completes the run."""
        assert self.producer is not None
        topic, ok = self.topic, pulsar.Result.Ok
        last = len(run) - 1
        i = 0

        def track(seq: int) -> Callable[[object, object], None]:
            def cb(res: object, msg_id: object) -> None:
                if res == ok:
                    try:
                        landed(topic, seq, msg_id)
                    except Exception:  # pragma: no cover - never into pulsar-client's thread
                        log.exception("event=dedup_landed_callback_error topic=%s seq=%d", topic, seq)
            return cb

        def finish(seq: int) -> Callable[[object, object], None]:
            first = track(seq)

            def cb(res: object, msg_id: object) -> None:
                first(res, msg_id)
                self.on_send_complete(pending, res, msg_id)
            return cb
        try:
            for i, (m, props) in enumerate(run):
                extra = {} if m.deliver_at is None else {"deliver_at": int(m.deliver_at)}
                self.producer.send_async(bytes(m.payload), finish(m.sequence_id) if i == last else track(m.sequence_id),
                                         properties=props, partition_key=m.partition_key, sequence_id=m.sequence_id,
                                         event_timestamp=m.event_timestamp, **extra)
        except Exception as exc:
            self.strand(pending, f"send raised: {exc}")
            seq = run[i][0].sequence_id
            log.error("event=dedup_send_failed topic=%s producer=%s seq=%d error=%r", self.topic, self.producer_name,
                      seq, exc)
            raise PublishError(f"topic {self.topic} producer {self.producer_name}: send of sequence id "
                               f"{seq} failed: {exc}") from exc
        self.sent += len(run)

    def on_send_complete(self, pending: PendingSend, res: object, msg_id: object) -> None:
        """pulsar-client's completion callback of a send (of a run's last send)."""
        # Runs on pulsar-client's I/O thread: an exception escaping here kills the process.
        try:
            self.complete(pending, res, msg_id)
        except Exception:  # pragma: no cover - defensive
            log.exception("event=dedup_callback_error topic=%s seq=%d", self.topic, pending.seq)

    def complete(self, pending: PendingSend, res: object, msg_id: object) -> None:
        """Record the fate of `pending` (a send or a run), move the persisted watermark over the
        completed prefix and run the callbacks that became due."""
        name = self.producer_name
        fire: List[Tuple[PublishCallback, PublishResult]] = []
        with self.cond:
            if not pending.stranded:
                self.outstanding -= pending.count
            if res == pulsar.Result.Ok:
                pos = position_of(msg_id)
                # -1:-1 is broker de-duplication saying "already stored": a success.
                broker_dup = pos.ledger_id < 0 and pos.entry_id < 0
                pending.position = None if broker_dup else pos
                pending.done = True
                if pending.callback is not None:
                    outcome = Outcome.DUPLICATE if broker_dup else Outcome.PERSISTED
                    fire.append((pending.callback, PublishResult(self.topic, pending.seq, outcome, pending.position)))
            else:
                # A run's sends have no known fate but the last's: the whole run failed.
                pending.stranded = True
                err = str(res)
                if self.failed is None:
                    self.failed, self.failed_seq = err, pending.seq
                    log.error("event=dedup_send_failed topic=%s producer=%s seq=%d result=%s", self.topic, name,
                              pending.seq, err)
                if pending.callback is not None:
                    fire.append((pending.callback, PublishResult(self.topic, pending.seq, Outcome.FAILED, error=err)))
            # The persisted watermark only moves over a prefix of completed sends, so a snapshot
            # never claims an id whose predecessors are not all on the topic.
            queue = self.pending
            if queue and queue[0].done:
                # The completed prefix in one mark.
                count, last, position = 0, 0, None
                while queue and queue[0].done:
                    head = queue.popleft()
                    count += head.count
                    last = head.seq
                    if head.position is not None:
                        position = head.position
                snap = self.seqmap.mark_persisted_run(name, last, count, position)
                if snap is not None:
                    self.due_snapshot = snap
            persisted = self.seqmap.highest_persisted(name)
            while self.waiters and self.waiters[0][0] <= persisted:
                seq, _, cb = heapq.heappop(self.waiters)
                fire.append((cb, PublishResult(self.topic, seq, Outcome.DUPLICATE)))
            if self.failed is not None:
                while self.waiters:
                    seq, _, cb = heapq.heappop(self.waiters)
                    fire.append((cb, PublishResult(self.topic, seq, Outcome.FAILED, error=self.failed)))
            self.cond.notify_all()
        for cb, result in fire:
            safe_callback(cb, result)

    # -- snapshots -------------------------------------------------------------------------------
    def write_due_snapshot(self) -> None:
        """Write the due snapshot, if any and not older than the last written, to the state store."""
        with self.snapshot_lock:
            with self.cond:
                snap, self.due_snapshot = self.due_snapshot, None
            if snap is None or snap.entries < self.written_entries:
                return
            try:
                self.state_store.put(snapshot_key(self.producer_name, self.topic), snap.to_bytes())
            except Exception as exc:
                # Snapshots only shorten recovery (the tail replay is what makes it exact), so a
                # store outage must not stop publishing; the next interval tries again.
                log.error(
                    "event=dedup_snapshot_write_failed topic=%s producer=%s entries=%d error=%s",
                    self.topic, self.producer_name, snap.entries, exc,
                )
                return
            self.written_entries = snap.entries
            log.info(
                "event=dedup_snapshot_written topic=%s producer=%s position=%s highest=%d entries=%d",
                self.topic, self.producer_name, snap.position, snap.producers.get(self.producer_name, NO_SEQUENCE),
                snap.entries,
            )

    def snapshot_now(self) -> DedupSnapshot:
        """Take the persisted map as a snapshot, write it and return it."""
        with self.cond:
            self.due_snapshot = self.seqmap.take_snapshot()
            snap = self.due_snapshot
        self.write_due_snapshot()
        return snap

    # -- draining and closing --------------------------------------------------------------------
    def wait_idle(self, deadline: Optional[float], timeout_s: Optional[float]) -> None:
        """Wait until no send is in flight; TimeoutError at `deadline` (time.monotonic(); None:
        never), naming `timeout_s`, the caller's whole wait."""
        with self.cond:
            while self.outstanding > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"topic {self.topic} producer {self.producer_name}: {self.outstanding} sends still "
                        f"in flight after {timeout_s}s"
                    )
                self.cond.wait(remaining if remaining is None else min(remaining, 1.0))

    def wait_persisted(self, seq: int, deadline: Optional[float], timeout_s: Optional[float]) -> None:
        """Wait until `seq` and every id pushed before it are on the topic; PublishError if a send
        failed first, TimeoutError at `deadline` (as wait_idle)."""
        with self.cond:
            while self.seqmap.highest_persisted(self.producer_name) < seq:
                if self.failed is not None:
                    raise self.send_failed_error()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"topic {self.topic} producer {self.producer_name}: sequence id {seq} not "
                                       f"persisted after {timeout_s}s")
                self.cond.wait(remaining if remaining is None else min(remaining, 1.0))

    def close(self) -> None:
        """Write a final snapshot, remove this producer from the map and close the producer."""
        with self.cond:
            self.due_snapshot = self.seqmap.take_snapshot()
            self.seqmap.producer_removed(self.producer_name)
        self.write_due_snapshot()
        if self.producer is not None:
            try:
                self.producer.close()
            except pulsar.PulsarException as exc:
                log.warning("event=dedup_producer_close_failed topic=%s error=%s", self.topic, exc)
        log.info(
            "event=dedup_channel_closed topic=%s producer=%s persisted=%d sent=%d duplicates=%d",
            self.topic, self.producer_name, self.seqmap.highest_persisted(self.producer_name), self.sent,
            self.duplicates,
        )
