"""The scheduler service behind BucketSnapshotWriter: intake, release thread, commits, metrics.

Threads:
- the intake thread takes a batch of scheduling messages from its source, makes it durable in
  the bucket index, then acks the batch's source messages. The source is either the function's
  own batch consumer of the scheduling topic (direct intake, `schedulingTopic`; see
  scheduling_consumer.py) or a queue that process() fills one message at a time (runtime intake);
- process() (the runtime's execution thread) handles ticks, and with runtime intake classifies
  each scheduling message and queues it;
- the release thread sleeps until the next deliver-at time, pops due items in release-key order,
  publishes them through the dedup publisher with the engine's sequence ids and commits the
  release watermark once the broker confirmed everything up to it. Rounds are pipelined: the
  next round is popped, encoded and sent while up to `releaseRoundsInFlight` earlier rounds
  wait for their confirmations; only the watermark waits for them.
A crash anywhere re-derives the same (item, seq) pairs after the last commit and the dedup
publisher drops the ones already on the topic: nothing lost, nothing twice.
"""
from __future__ import annotations

import bisect
import json
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Tuple

import pulsar

from ..bucket.metrics import LATENCY_BUCKETS_MS
from ..bucket.positions import BATCH_BITS, MAX_BATCH_INDEX, encode, format_user_id
from ..bucket.records import DelayedMessage, RecoveryReport, Release
from ..bucket.storage.lease import LeaseLostError
from ..clock import Clock, wall_clock_ms
from ..dedup.publisher import DedupPublisher, OutMessage
from ..durable import DurableWriteError
from ..scheduling_protocol import (
    BATCH_INDEX_PROP,
    CANCEL_KEPT_PROP,
    CANCEL_OUTCOME_PROP,
    CANCEL_PROP,
    ERROR_PROP,
    ORIGIN_MSG_ID_PROP,
    RELEASED_AT_PROP,
    format_origin_msg_id,
)
from ..topics import normalize_topic
from .config import WriterConfig
from .dead_letter import DeadLetters
from .intake import Cancel, Invalid
from .target_health import DEAD_LETTER, TargetHealth

log = logging.getLogger(__name__)
# Recorded (value 1) each time the index could not be made durable (ENOSPC, EROFS, ...): the
# batch was not acked and is redelivered. Pulsar's Python instance exports the count as
# pulsar_function_user_metric_count{metric="pulsar_lifecycle_scheduler_persist_failures"}.
PERSIST_FAILURES_METRIC = "pulsar_lifecycle_scheduler_persist_failures"
# Release lateness (the writer's clock when it publishes a release minus the message's
# deliver-at, ms) as a Prometheus histogram recorded through record_metric: a running count per
# upper bound `<name>_bucket{le=B}` (cumulative, le=+Inf = every release), `<name>_sum` and
# `<name>_count`, each a running total recorded every metricsIntervalSeconds. Pulsar's Python
# instance has only the user-metric Summary (contextimpl.py), so these are series of it
# (metric="pulsar_lifecycle_scheduler_release_lateness_ms_bucket{le=1000}", ...); local run mode
# also shows them under their own names. docs/operations.md, "Metrics".
LATENESS_METRIC = "pulsar_lifecycle_scheduler_release_lateness_ms"
LATENESS_BUCKETS_MS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000)
PENDING_METRIC = "pulsar_lifecycle_scheduler_pending"
# Held targets (a target the writer cannot publish to: its releases wait, retried with backoff),
# the releases waiting for them, and the releases sent to the dead-letter topic (running total).
HELD_TARGETS_METRIC = "pulsar_lifecycle_scheduler_held_targets"
HELD_RELEASES_METRIC = "pulsar_lifecycle_scheduler_held_releases"
DEAD_LETTERED_METRIC = "pulsar_lifecycle_scheduler_dead_lettered_total"
# The state-store keys (under the service's dedup prefix) of the release status `inspect writer`
# reads, and of the highest sequence id dead-lettered per target (a replay after a crash sends
# those to the dead-letter topic again, where de-duplication drops them, never to the target).
STATUS_KEY = "writer-status"
# An outstanding release whose target is held: the watermark stops at it.
HELD = "\x00held"


def persist_failure(exc: BaseException) -> Optional[DurableWriteError]:
    """The DurableWriteError behind `exc` (its cause/context chain), if any."""
    seen = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, DurableWriteError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


@dataclass
class Pending:
    """A classified intake item; `ack` acknowledges its source message (runtime intake only)."""

    item: Any  # DelayedMessage | Cancel | Invalid
    ack: Optional[Callable[[], None]] = None
    payload: bytes = b""
    properties: Dict[str, str] = field(default_factory=dict)


@dataclass
class IntakeBatch:
    """Scheduling messages made durable together; `ack` acknowledges all their source messages.

    Without `adds`, `items` holds every message of the batch. With `adds` (the direct consumer:
    no `Pending` per scheduling message), `adds` holds the batch's index items in order and
    `items` only its cancels and refusals, in order; the intake thread adds before it cancels
    either way.
    """

    items: List[Pending]
    ack: Callable[[], None]
    adds: Optional[List[DelayedMessage]] = None

    def __len__(self) -> int:
        """The scheduling messages of the batch."""
        return len(self.items) + (len(self.adds) if self.adds is not None else 0)

    def split(self) -> Tuple[List[DelayedMessage], List[Pending]]:
        """(index items in order, the other items in order)."""
        if self.adds is not None:
            return self.adds, self.items
        adds = [p.item for p in self.items if type(p.item) is DelayedMessage]
        if len(adds) == len(self.items):
            return adds, []
        return adds, [p for p in self.items if type(p.item) is not DelayedMessage]


class IntakeSource(Protocol):
    """Where the intake thread gets its batches."""

    def take(self) -> Optional[IntakeBatch]:
        """The next batch, or None after a short idle wait (the intake thread then checks stop)."""

    def close(self) -> None:
        """Release the source (its unacked messages are redelivered)."""


class QueueIntake:
    """Runtime intake: process() submits one message at a time, the intake thread takes batches."""

    def __init__(self, batch_size: int, batch_delay_ms: int, stop: threading.Event) -> None:
        self._queue: "queue.Queue[Pending]" = queue.Queue(maxsize=max(1000, 4 * batch_size))
        self._batch_size = batch_size
        self._batch_delay_s = batch_delay_ms / 1000.0
        self._stop = stop

    def submit(self, pending: Pending) -> bool:
        """Queue one item; blocks while the queue is full; False once the service stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(pending, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def take(self, wait_s: float = 0.2) -> Optional[IntakeBatch]:
        """Up to batch_size queued items, waiting up to `wait_s` for the first; None when idle."""
        try:
            first = self._queue.get(timeout=wait_s) if wait_s > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        batch = [first]
        deadline = time.monotonic() + self._batch_delay_s
        while len(batch) < self._batch_size:
            remaining = deadline - time.monotonic()
            try:
                batch.append(self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait())
            except queue.Empty:
                break

        def ack() -> None:
            for p in batch:
                if p.ack is not None:
                    p.ack()
        return IntakeBatch(batch, ack)

    def close(self) -> None:
        """Nothing to release: queued items were never acked and are redelivered."""


class SchedulerService:
    """Owns the engine, the release publisher and the two worker threads."""

    def __init__(self, engine: Any, publisher: DedupPublisher, config: WriterConfig, default_target: str,
                 invalid_topic: str, client: Any, record_metric: Callable[[str, float], None],
                 resources: Optional[List[Any]] = None,
                 source_factory: Optional[Callable[[], IntakeSource]] = None, clock: Clock = wall_clock_ms,
                 runtime_input: Optional[Any] = None, reply_topic: str = "", dead_letter_topic: str = "") -> None:
        self.engine = engine
        # Where cancels that ask for an answer get it (cancel_reply_topic of the topic this
        # service indexes); a cancel naming any other topic is applied and not answered.
        self.reply_topic = reply_topic
        self.clock = clock  # deliver-at times are wall-clock instants; tests may inject a FakeClock
        self.publisher = publisher
        self.config = config
        self.default_target = default_target
        self.invalid_topic = invalid_topic
        self.client = client
        self.record_metric = record_metric
        self._resources = list(resources or [])  # closed on stop (e.g. the snapshot dir lock)
        self._stop = threading.Event()
        self._queue = QueueIntake(config.ingest_batch_size, config.ingest_batch_delay_millis, self._stop)
        # The direct source is opened after recovery, so nothing is received before the index is usable.
        self._source_factory = source_factory
        self._source: IntakeSource = self._queue
        # Direct intake with the scheduling topic also an input: the runtime's consumer of it
        # (runtime_input.RuntimeInput), closed by start().
        self.runtime_input = runtime_input
        self._wake = threading.Condition()
        self._threads: List[threading.Thread] = []
        # In release order, release thread only: (seq, None) for a cancelled item, else
        # [seq, destination, OutMessage]; the destination is the target (a plain topic), a
        # partition of it, HELD while its target is held, or a _DeadDest once dead-lettered.
        self._outstanding: Deque[Any] = deque()
        # The release pipeline (release thread only): per round sent and not yet confirmed, oldest
        # first, the highest sequence id it sent to each destination; and the round being sent.
        # At releaseRoundsInFlight of them the thread waits for the oldest before popping more.
        self._in_flight: Deque[Dict[str, int]] = deque()
        self._round_sent: Dict[str, int] = {}
        self.window_waits = 0
        # Targets whose releases go out now (opened); the others are held while they open.
        self._ready: set = set()
        self._health = TargetHealth(config.target_retry_seconds * 1000, seq_of=lambda item: item[0][0])
        self._opening: Dict[str, "Future[Any]"] = {}
        self._opener: Optional[ThreadPoolExecutor] = None
        self._dest_target: Dict[str, str] = {}  # destination (full name) -> target as released
        self._failed_seen: Dict[str, str] = {}  # failed destinations already held
        self._norm: Dict[str, str] = {}
        self.dead_letter_topic = dead_letter_topic or f"{invalid_topic.rsplit('-INVALID', 1)[0]}-DLQ"
        self._dead = DeadLetters(publisher, self.dead_letter_topic, self._full)
        self._status_written = ""
        self._committed = 0
        self._invalid_producer: Any = None
        self.failure: Optional[BaseException] = None
        # Called once when a worker thread dies (e.g. to get process() called, which rebuilds).
        self.on_failure: Optional[Callable[[], None]] = None
        self.received = 0
        self.released = 0
        self.cancelled = 0
        self.invalid = 0
        self.lateness = LatenessHistogram()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, recovered: Optional[RecoveryReport] = None) -> None:
        """Recover the index (unless the caller did: `recovered` is its report), close the
        runtime's input of the scheduling topic (direct intake), open the intake source and start
        the intake and release threads."""
        report = recovered if recovered is not None else self.engine.recover()
        log.info("event=scheduler_recovered report=%s target=%s", report, self.default_target)
        # Closed only now: a failed recovery leaves the input open, so the runtime redelivers the
        # message that started this and process() builds again. Closed before the direct consumer
        # subscribes: it then finds what the closed consumer held waiting for redelivery.
        if self.runtime_input is not None:
            self.runtime_input.close()
        try:
            if self._source_factory is not None:
                self._source = self._source_factory()
            for name, target in (("bucket-intake", self._intake_loop), ("bucket-release", self._release_loop)):
                t = threading.Thread(target=self._guard(target), name=name, daemon=True)
                t.start()
                self._threads.append(t)
        except BaseException:
            self.wake_if_input_closed()
            raise

    @property
    def runtime_input_closed(self) -> bool:
        """True once the runtime's consumer of the scheduling topic is closed: a scheduling message
        that still reaches process() is left to the broker, which redelivers it to the direct consumer."""
        return self.runtime_input is not None and self.runtime_input.closed

    def wake_if_input_closed(self) -> None:
        """After a failed start with the runtime's input closed: no redelivery of the message that
        started it calls process() again, so have `on_failure` (a wake tick) do it."""
        if self.runtime_input_closed and self.on_failure is not None:
            try:
                self.on_failure()
            except Exception as exc:  # the start's own error is what the caller sees
                log.warning("event=scheduler_failure_hook_failed error=%r", exc)

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced through .failure; process() rebuilds the service
                first = self.failure is None
                self.failure = exc
                self._stop.set()
                if first and self.on_failure is not None:
                    try:
                        self.on_failure()
                    except Exception as hexc:  # the failure below is what matters
                        log.warning("event=scheduler_failure_hook_failed error=%r", hexc)
                disk = persist_failure(exc)
                if disk is not None:
                    # Nothing of the failed batch was acked: it is redelivered once storage works.
                    log.error("event=scheduler_persist_failed thread=%s path=%s errno=%s acked=false error=%s",
                              threading.current_thread().name, disk.path, disk.errno, disk)
                    try:
                        self.record_metric(PERSIST_FAILURES_METRIC, 1.0)
                    except Exception as mexc:  # a metrics failure must not hide the real one
                        log.debug("event=metric_record_failed error=%r", mexc)
                    return
                if isinstance(exc, pulsar.AlreadyClosed):  # only its runtime closes the client: a stop
                    log.info("event=scheduler_thread_stopped thread=%s reason='the client was closed: the runtime "
                             "is stopping'", threading.current_thread().name)
                    return
                log.exception("event=scheduler_thread_failed thread=%s error=%r", threading.current_thread().name, exc)
        return run

    def fence(self, exc: BaseException) -> None:
        """The partition's lease was taken over (LeaseKeeper): stop as after a failed thread, so
        the owner stops this service (its producers close) and waits for the lease, instead of
        finding out at the next write or release round, which an idle partition may not have."""
        if self.failure is None:
            self.failure = exc
        self._halt()

    def _halt(self) -> None:
        """Tell both threads to stop, waking the release thread from its wait."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()

    @property
    def healthy(self) -> bool:
        """False once a worker thread died; the function then builds a new service."""
        return self.failure is None and not self._stop.is_set()

    def stop(self) -> None:
        """Stop both threads, flush the publisher and close the engine's storage."""
        self._halt()
        for t in self._threads:
            t.join(timeout=10)
        try:
            self._source.close()
        except Exception as exc:
            log.warning("event=scheduler_intake_close_failed error=%r", exc)
        try:
            self.publisher.flush()
            self._advance_commit()
        except Exception as exc:
            log.warning("event=scheduler_stop_flush_failed error=%r", exc)
        if self._opener is not None:
            self._opener.shutdown(wait=False)
        for dlq in self._dead.publishers():
            dlq.close()
        self.publisher.close()
        if self._invalid_producer is not None:
            try:
                self._invalid_producer.close()  # every producer closed before the client is
            except Exception as exc:
                log.debug("event=invalid_producer_close_failed error=%r", exc)
            self._invalid_producer = None
        closer = getattr(getattr(self.engine, "storage", None), "close", None)
        if callable(closer):
            closer()
        for res in self._resources:
            res.close()

    # -- intake ----------------------------------------------------------------------------------
    def submit(self, pending: Pending) -> None:
        """Queue one classified message (runtime intake, called from process()); blocks when full."""
        if not self._queue.submit(pending):
            raise RuntimeError("scheduler stopped") from self.failure

    def _intake_loop(self) -> None:
        while not self._stop.is_set():
            # Direct intake where the runtime's input of the scheduling topic could not be closed
            # (runtime_input.py): what reached process() is queued; take it first.
            batch = self._queue.take(0) if self._source is not self._queue else None
            if batch is None:
                batch = self._source.take()
            if batch is None or not len(batch):
                self.engine.maybe_seal(self.clock())
                continue
            adds, others = batch.split()
            if adds:
                self.engine.add(adds)  # durable when it returns
            replies: List[Tuple[int, Cancel, str]] = []
            for p in others:
                if isinstance(p.item, Cancel):
                    self._cancel(p.item, replies)
                elif isinstance(p.item, Invalid):
                    self._send_invalid(p)
            if replies:
                self._answer(replies)  # stored before the cancels are acked: a redelivery answers again
            batch.ack()
            self.received += len(batch)
            self.engine.maybe_seal(self.clock())
            with self._wake:
                self._wake.notify_all()

    def _cancel(self, item: Cancel, replies: List[Tuple[int, Cancel, str]]) -> None:
        """Apply one cancel; queue its answer when it asked for one on this service's reply topic."""
        result = self.engine.cancel(item.ledger_id, item.entry_id)
        outcome = cancel_outcome(result, self.engine.was_added(item.ledger_id, item.entry_id))
        shown = item.target or format_user_id(item.ledger_id, item.entry_id)
        seq = reply_sequence(item.source)
        answered = bool(item.reply_to) and item.reply_to == self.reply_topic and seq is not None
        log.info("event=cancel_request id=%s result=%s outcome=%s answered=%s", shown, getattr(result, "name", result),
                 outcome, str(answered).lower())
        if item.reply_to and not answered:
            log.warning("event=cancel_reply_refused id=%s reply_to=%s expected=%s reason='a cancel is answered only on "
                        "the reply topic of the scheduling topic it was sent to'", shown, item.reply_to,
                        self.reply_topic or "none")
        if answered and seq is not None:
            replies.append((seq, item, outcome))

    def _answer(self, replies: List[Tuple[int, Cancel, str]]) -> None:
        """Publish the answers (sequence id = the cancel's own position, so a redelivered cancel's
        answer is a duplicate the publisher drops) and wait until the broker stored them. A reply
        topic that cannot be opened (a cluster without topic auto-creation, a partitioned topic of
        that name) leaves the cancels applied and unanswered, with a warning: never a writer that
        fails on every redelivery of a cancel."""
        try:
            self.publisher.open(self.reply_topic)
        except Exception as exc:
            log.warning("event=cancel_reply_failed reply_to=%s cancels=%d error=%r reason='the cancels are applied; "
                        "`delayed cancel` reports no answer (create the topic, non-partitioned)'", self.reply_topic,
                        len(replies), exc)
            return
        out = []
        for seq, item, outcome in sorted(replies, key=lambda r: r[0]):
            ledger, entry, partition, batch = item.source
            props = {CANCEL_OUTCOME_PROP: outcome, CANCEL_PROP: item.target,
                     ORIGIN_MSG_ID_PROP: format_origin_msg_id(ledger, entry, partition, batch)}
            if outcome == "not_known_yet":
                props[CANCEL_KEPT_PROP] = str(self.config.unknown_cancel_retention_seconds)
            payload = json.dumps({"id": item.target, "outcome": outcome}).encode("utf-8")
            out.append(OutMessage(payload, seq, props, None, None))
        self.publisher.publish_many(self.reply_topic, out)
        self.publisher.wait_persisted(self.reply_topic, out[-1].sequence_id)

    def _send_invalid(self, p: Pending) -> None:
        # Bad input is kept, with its reason, before its source message is acked.
        if self._invalid_producer is None:
            self._invalid_producer = self.client.create_producer(self.invalid_topic, batching_enabled=False)
        props = dict(p.properties)
        props[ERROR_PROP] = p.item.reason
        self._invalid_producer.send(p.payload, properties=props)
        self.invalid += 1
        log.warning("event=invalid_scheduling_message topic=%s reason=%s", self.invalid_topic, p.item.reason)

    # -- release ---------------------------------------------------------------------------------
    def _release_loop(self) -> None:
        last_commit = time.monotonic()
        last_metrics = 0.0
        while not self._stop.is_set():
            # Popped only with room in the pipeline: a full one waits (bounded) for its oldest round.
            full = self._window_full()
            releases = self.engine.pop_due(self.clock(), self.config.release_batch_size) if not full else []
            if releases:
                self._publish_round(releases)
            if self._opening or self._health:
                self._tend_targets()
            if self._round_sent:
                self._in_flight.append(self._round_sent)
                self._round_sent = {}
            now = time.monotonic()
            if now - last_commit >= self.config.commit_interval_millis / 1000.0:
                self._advance_commit()
                last_commit = now
            if now - last_metrics >= self.config.metrics_interval_seconds:
                self._expire_unknown_cancels()
                self._record_metrics()
                last_metrics = now
            if full:
                self._wait_oldest_round()
                continue
            if releases:
                continue
            nxt = self.engine.next_release_time()
            wait = self.config.tick_time_millis / 1000.0
            if nxt is not None:
                # A due head that pop_due did not return is held back by an intake batch being
                # made durable: wait a moment instead of spinning.
                wait = min(wait, max(0.001, (nxt - self.clock()) / 1000.0))
            wait = min(wait, self.config.commit_interval_millis / 1000.0) if self._outstanding else wait
            retry_at = self._health.next_due_ms() if self._health else None
            if retry_at is not None:
                wait = min(wait, max(0.001, (retry_at - self.clock()) / 1000.0))
            if wait > 0:
                with self._wake:
                    self._wake.wait(wait)

    def _window_full(self) -> bool:
        """Drop the confirmed rounds from the pipeline's head; True while releaseRoundsInFlight
        rounds are still unconfirmed. A destination whose channel failed no longer counts: its
        unconfirmed releases are held (_hold_failed_sends) and sent again, a round of their own."""
        in_flight = self._in_flight
        if len(in_flight) < self.config.release_rounds_in_flight:
            return False
        failed: Optional[Dict[str, str]] = None
        while in_flight:
            head = in_flight[0]
            for dest in list(head):
                if self._persisted_of(dest) >= head[dest]:
                    del head[dest]
                    continue
                if failed is None:
                    failed = self.publisher.failed_topics()
                if dest in failed:
                    del head[dest]
            if head:
                break
            in_flight.popleft()
        return len(in_flight) >= self.config.release_rounds_in_flight

    def _wait_oldest_round(self) -> None:
        """Wait (at most one commit interval) for the oldest unconfirmed round's next destination.
        A failed send or the timeout ends the wait: the loop holds the failed target, commits and
        tends the held ones, then looks again."""
        self.window_waits += 1
        head = self._in_flight[0]
        dest = next(iter(head))
        if dest not in self.publisher.topics():  # closed for a re-open: held, sent again later
            del head[dest]
            return
        try:
            self.publisher.wait_persisted(dest, head[dest], timeout_s=self.config.commit_interval_millis / 1000.0)
        except LeaseLostError:
            raise
        except Exception as exc:  # TimeoutError, or the channel failed: handled by the loop
            log.debug("event=release_window_wait_ended dest=%s seq=%d rounds_in_flight=%d reason=%r", dest,
                      head[dest], len(self._in_flight), exc)

    def _publish_round(self, releases: List[Release]) -> None:
        """Publish one round of releases, grouped per target topic (seqs stay increasing per topic)."""
        by_topic: Dict[str, List[List[Any]]] = {}
        released_at = str(self.clock())  # a batch's publish_timestamp is when the batch opened, not this
        # Runs once per released message on the release thread, the writer's busiest: locals, and
        # the origin id formatted from the index id without intermediate objects.
        outstanding = self._outstanding
        default_target = self.default_target
        self.lateness.observe_round(int(released_at), [r.message.deliver_at for r in releases if not r.cancelled])
        for r in releases:
            if r.cancelled:
                outstanding.append((r.seq, None))
                self.cancelled += 1
                continue
            m = r.message
            target = m.target or default_target
            props = dict(m.properties)
            ident = m.entry_id  # index id: entry << BATCH_BITS | batch index (positions.decode)
            batch = ident & MAX_BATCH_INDEX
            # Index ids give batch index 0 to non-batched messages too; intake marks a real 0.
            if props.pop(BATCH_INDEX_PROP, None) is None and batch == 0:
                batch = -1
            props[ORIGIN_MSG_ID_PROP] = format_origin_msg_id(m.ledger_id, ident >> BATCH_BITS, m.partition, batch)
            props[RELEASED_AT_PROP] = released_at
            entry = [r.seq, target, OutMessage(m.payload, r.seq, props, m.key, m.event_time or None)]
            outstanding.append(entry)
            group = by_topic.get(target)
            if group is None:
                group = by_topic[target] = []
            group.append(entry)
        for target, entries in by_topic.items():
            self._release(target, entries)

    def _release(self, target: str, entries: List[List[Any]]) -> None:
        """Send one round's releases to `target`, or hold them behind its held ones."""
        mark = self._dead.mark(target)
        if mark[0] >= entries[0][0]:
            # Released before a crash and dead-lettered then: to the dead-letter topic again
            # (de-duplicated there), never to the target.
            n = sum(1 for e in entries if e[0] <= mark[0])
            self._replay_dead(target, entries[:n], mark[1])
            entries = entries[n:]
            if not entries:
                return
        if target not in self._ready and self._is_open(target):
            self._ready.add(target)
        if target in self._ready and self._health.held(target) is None:
            self._send(target, entries)
            return
        for e in entries:
            e[1] = HELD
        h = self._health.hold(target, [(e, None) for e in entries])
        if target not in self._ready and not h.busy and not h.failing:
            self._start_open(target)

    def _send(self, target: str, entries: List[List[Any]]) -> bool:
        """Publish `entries` to `target` (routed per partition when it is partitioned); on an error
        hold the ones not handed over and start the target's backoff. True when all went out."""
        out = [e[2] for e in entries]
        full = self._full(target)
        groups: List[Tuple[str, List[OutMessage]]] = []
        sent = 0
        try:
            # A plain topic (the usual case) skips the routing pass: one group, the target itself.
            partitioned = self.publisher.partitions(full) > 0
            groups = self.publisher.route(target, out) if partitioned else [(full, out)]
            by_seq = {e[0]: e for e in entries} if partitioned else None
            for dest, group in groups:
                self._dest_target[dest] = target
                if by_seq is not None:
                    for m in group:
                        by_seq[m.sequence_id][1] = dest
                elif entries[0][1] is not target:  # held ones: a plain topic's destination is itself
                    for e in entries:
                        e[1] = target
                # The properties dicts were built above, str -> str (validated when added, or a
                # decoded protobuf map): handed over, not copied and checked again.
                self.publisher.publish_many(dest, group, properties_owned=True)
                sent += 1
                self.released += len(group)
                self._round_sent[dest] = group[-1].sequence_id
            return True
        except LeaseLostError:
            raise
        except Exception as exc:
            if self._stop.is_set():
                raise
            left = {m.sequence_id for _, group in groups[sent:] for m in group} if groups else None
            held = [e for e in entries if left is None or e[0] in left]
            for e in held:
                e[1] = HELD
            self._health.requeue(target, [(e, None) for e in held])
            self._target_failed(target, f"publish failed: {exc!r}")
            return False

    def _full(self, target: str) -> str:
        full = self._norm.get(target)
        if full is None:
            full = self._norm[target] = normalize_topic(target)
        return full

    def _is_open(self, target: str) -> bool:
        """Whether the publisher has `target` (or its partitions) open already."""
        full = self._full(target)
        prefix = full + "-partition-"
        return any(t == full or t.startswith(prefix) for t in self.publisher.topics())

    # -- held targets ----------------------------------------------------------------------------
    def _start_open(self, target: str) -> None:
        """Open `target` on a background thread (after closing its failed channels): the release
        thread never waits on a target's lookup, recovery or producer creation."""
        if self._opener is None:
            self._opener = ThreadPoolExecutor(max_workers=4, thread_name_prefix="bucket-target-open")
        self._health.attempt(target)
        fut = self._opener.submit(self._open_target, target)
        self._opening[target] = fut

        def woke(_f: Any) -> None:
            with self._wake:
                self._wake.notify_all()
        fut.add_done_callback(woke)

    def _open_target(self, target: str) -> None:
        full = self._full(target)
        for dest in self.publisher.failed_topics():
            if dest == full or dest.startswith(full + "-partition-"):
                self.publisher.reset(dest)
                self._failed_seen.pop(dest, None)
        self.publisher.open(target)

    def _target_failed(self, target: str, reason: str) -> None:
        h = self._health.failed(target, reason, self.clock())
        log.warning("event=release_target_failed target=%s held=%d attempts=%d failing_ms=%d retry_in_ms=%d "
                    "dead_letter_after_s=%d error=%s", target, len(h.items), h.attempts,
                    self.clock() - (h.since_ms or 0), h.next_try_ms - self.clock(),
                    self.config.target_retry_seconds, reason)

    def _tend_targets(self) -> None:
        """Per round: finish the opens that completed, retry the held targets whose backoff ran
        out and dead-letter the ones failing for targetRetrySeconds."""
        for target, fut in list(self._opening.items()):
            if not fut.done():
                continue
            del self._opening[target]
            exc = fut.exception()
            if exc is not None:
                self._ready.discard(target)
                self._target_failed(target, f"open failed: {exc!r}")
                continue
            self._ready.add(target)
            h = self._health.held(target)
            was = (h.attempts, h.since_ms) if h is not None else (0, None)
            items = self._health.release(target)
            if items and self._send(target, [item[0] for item in items]) and was[1] is not None:
                log.info("event=release_target_recovered target=%s released=%d attempts=%d failing_ms=%d", target,
                         len(items), was[0], self.clock() - was[1])
        if not self._health:
            return
        for h, action in self._health.due(self.clock()):
            if action == DEAD_LETTER:
                self._dead_letter(h.target, h.reason)
            else:
                self._start_open(h.target)

    def _dead_letter(self, target: str, reason: str) -> None:
        """Send a held target's releases to the dead-letter topic (the highest id stored first)."""
        h = self._health.held(target)
        since = h.since_ms if h is not None and h.since_ms is not None else self.clock()
        items = self._health.take(target)
        keep = []
        for e, prev in items:
            # Sent before its channel failed and stored on the target after all: delivered.
            if prev is not None and self.publisher.persisted_seq(prev) >= e[0]:
                e[1] = prev
                continue
            keep.append(e)
        self._ready.discard(target)  # its next release tries the target afresh
        if not keep:
            return
        try:
            self._dead.store_mark(target, keep[-1][0], reason)
            self._dead.send(target, keep, reason)
        except LeaseLostError:
            raise
        except Exception as exc:
            for e in keep:
                e[1] = HELD
            self._health.requeue(target, [(e, None) for e in keep])
            self._target_failed(target, f"{reason}; dead-letter topic {self.dead_letter_topic} refused: {exc!r}")
            return
        log.error("event=release_dead_lettered target=%s count=%d dead_letter_topic=%s first_seq=%d last_seq=%d "
                  "failing_ms=%d reason=%s", target, len(keep), self.dead_letter_topic, keep[0][0], keep[-1][0],
                  self.clock() - since, reason)

    def _replay_dead(self, target: str, entries: List[List[Any]], reason: str) -> None:
        """Replayed releases at or below the target's dead-letter mark: to the dead-letter topic
        again unless the target's open channel already stored them."""
        again = []
        for e in entries:
            if target in self._ready:
                dest = self.publisher.destination(target, e[0], e[2].partition_key)
                if self.publisher.persisted_seq(dest) >= e[0]:
                    e[1] = dest
                    continue
            again.append(e)
        if again:
            self._dead.send(target, again, reason)
            self._dead.count -= len(again)  # counted when they were dead-lettered first

    def _hold_failed_sends(self) -> None:
        """Channels a failed send stopped: hold their target, with the releases sent there but not
        stored, to be sent again (after the channel re-opens) or dead-lettered."""
        failed = self.publisher.failed_topics()
        if not failed:
            return
        new = {dest: why for dest, why in failed.items() if dest not in self._failed_seen
               and dest in self._dest_target}
        if not new:
            return
        self._failed_seen.update(new)
        done = {dest: self.publisher.persisted_seq(dest) for dest in new}
        requeue: Dict[str, List[Tuple[List[Any], str]]] = {}
        for e in self._outstanding:
            dest = e[1]
            if type(dest) is not str or dest is HELD:
                continue
            full = self._full(dest)
            if full in done and e[0] > done[full]:
                e[1] = HELD
                requeue.setdefault(self._dest_target[full], []).append((e, full))
        for dest, why in new.items():
            target = self._dest_target[dest]
            self._health.requeue(target, requeue.get(target, []))
            self._ready.discard(target)
            self._target_failed(target, f"send to {dest} failed: {why}")

    def _persisted_of(self, dest: Any) -> int:
        if type(dest) is str:
            return -1 if dest == HELD else int(self.publisher.persisted_seq(dest))
        return int(dest.persisted())

    def _advance_commit(self) -> None:
        """Commit the release watermark: the longest prefix of releases the broker has stored (on
        their target, or dead-lettered); a held release stops it."""
        self._hold_failed_sends()
        persisted: Dict[Any, int] = {}
        upto = 0
        outstanding = self._outstanding
        while outstanding:
            entry = outstanding[0]
            dest = entry[1]
            if dest is not None:
                done = persisted.get(dest)
                if done is None:
                    done = persisted[dest] = self._persisted_of(dest)
                if entry[0] > done:
                    break
            upto = entry[0]
            outstanding.popleft()
        if upto > self._committed:
            self.engine.commit(upto)
            self._committed = upto
        self._health.confirmed(self._committed)

    @property
    def dead_lettered(self) -> int:
        """Releases sent to the dead-letter topic since the start."""
        return self._dead.count

    def status(self) -> Dict[str, Any]:
        """The release status `inspect writer` shows: held targets, dead-lettered releases."""
        return {"at_ms": self.clock(), "held_targets": self._health.status(),
                "held_releases": self._health.held_count(), "dead_lettered": self._dead.count,
                "dead_letter_topic": normalize_topic(self.dead_letter_topic)}

    def _write_status(self) -> None:
        """Store the status while a target is held, and once more when none is."""
        store = getattr(self.publisher, "state_store", None)
        if store is None or (not self._health and not self._status_written):
            return
        status = self.status()
        text = json.dumps(status, sort_keys=True)
        try:
            store.put(STATUS_KEY, text.encode("utf-8"))
        except Exception as exc:  # status only: the releases do not depend on it
            log.warning("event=writer_status_write_failed error=%r", exc)
            return
        self._status_written = text if self._health else ""

    def _expire_unknown_cancels(self) -> None:
        expire = getattr(self.engine, "expire_unknown_cancels", None)
        if expire is not None:
            expire(self.config.unknown_cancel_retention_seconds * 1000)

    def _record_metrics(self) -> None:
        stats = self.engine.stats()
        values = metric_values(stats) + self.counter_values() + self.lateness.values()
        values.append((PENDING_METRIC, float(getattr(stats, "pending", 0))))
        values.append((HELD_TARGETS_METRIC, float(len(self._health.targets()))))
        values.append((HELD_RELEASES_METRIC, float(self._health.held_count())))
        for name, value in values:
            self.record_metric(name, value)
        self._write_status()

    def counter_values(self) -> List[Tuple[str, float]]:
        """This writer's own counters (no Pulsar equivalent): intake, releases, cancels, refusals."""
        return [
            ("pulsar_lifecycle_scheduler_received_total", float(self.received)),
            ("pulsar_lifecycle_scheduler_released_total", float(self.released)),
            ("pulsar_lifecycle_scheduler_cancelled_total", float(self.cancelled)),
            ("pulsar_lifecycle_scheduler_invalid_total", float(self.invalid)),
            (DEAD_LETTERED_METRIC, float(self.dead_lettered)),
        ]


class LatenessHistogram:
    """Release lateness counts per LATENESS_BUCKETS_MS bound (release thread writes, the metrics
    recording on the same thread reads)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BUCKETS_MS) + 1)  # per bucket, the last one over every bound
        self.sum_ms = 0
        self.count = 0

    def observe_round(self, released_at_ms: int, deliver_at_ms: List[int]) -> None:
        """One release round: every message released at `released_at_ms`. Runs on the release
        thread once per round: the deliver-at times sorted once and cut at each bound (a lateness
        <= B is a deliver-at >= released_at - B), not a bucket search per message."""
        n = len(deliver_at_ms)
        if not n:
            return
        ds = sorted(deliver_at_ms)
        counts = self.counts
        above = n  # messages with lateness > the previous bound: deliver-at < released_at - bound
        for i, bound in enumerate(LATENESS_BUCKETS_MS):
            later = bisect.bisect_left(ds, released_at_ms - bound)  # lateness > bound
            counts[i] += above - later if i else n - later
            above = later
        counts[-1] += above
        early = bisect.bisect_right(ds, released_at_ms)  # deliver-at <= release: lateness >= 0
        self.sum_ms += released_at_ms * early - sum(ds[:early])  # a deliver-at after the release counts 0
        self.count += n

    def values(self) -> List[Tuple[str, float]]:
        """The histogram's series as (name, value): cumulative buckets, +Inf, sum and count."""
        out: List[Tuple[str, float]] = []
        running = 0
        for bound, n in zip(LATENESS_BUCKETS_MS, self.counts):
            running += n
            out.append((f"{LATENESS_METRIC}_bucket{{le={bound}}}", float(running)))
        out.append((f"{LATENESS_METRIC}_bucket{{le=+Inf}}", float(self.count)))
        out.append((f"{LATENESS_METRIC}_sum", float(self.sum_ms)))
        out.append((f"{LATENESS_METRIC}_count", float(self.count)))
        return out


def cancel_outcome(result: Any, seen: bool) -> str:
    """What a cancel's answer says (CANCEL_OUTCOMES) from engine.cancel's result. A repeated
    cancel (ALREADY_CANCELLED: a redelivery, or the same id cancelled twice) answers as the first
    did: cancelled when the message is indexed, not known yet otherwise."""
    name = getattr(result, "name", str(result))
    if name == "ALREADY_RELEASED":
        return "already_released"
    if name == "CANCELLED":
        return "cancelled"
    if name == "CANCELLED_BEFORE_ADD":
        return "not_known_yet"
    return "cancelled" if seen else "not_known_yet"


def reply_sequence(source: Tuple[int, int, int, int]) -> Optional[int]:
    """The sequence id of a cancel's answer: its position on the scheduling topic (partition),
    increasing with it; None when the position is unknown or out of range."""
    ledger, entry, _partition, batch = source
    ident = encode(entry, max(batch, 0)) if ledger >= 0 and entry >= 0 else None
    if ident is None or ledger >= 1 << 30:
        return None
    return (ledger << 32 | ident) + 1


def metric_values(stats: Any) -> List[Tuple[str, float]]:
    """Pulsar's pulsar_delayed_message_index_* metrics from the engine's stats."""
    out: List[Tuple[str, float]] = [
        ("pulsar_delayed_message_index_bucket_total", float(getattr(stats, "bucket_total", 0))),
        ("pulsar_delayed_message_index_loaded", float(getattr(stats, "loaded", 0))),
        ("pulsar_delayed_message_index_bucket_snapshot_size_bytes", float(getattr(stats, "snapshot_size_bytes", 0))),
    ]
    for (typ, state), count in sorted(getattr(stats, "op_count", {}).items()):
        out.append((f"pulsar_delayed_message_index_bucket_op_count{{type={typ},state={state}}}", float(count)))
    for typ, counts in sorted(getattr(stats, "op_latency_ms", {}).items()):
        # Pulsar exports per-bucket (not cumulative) counts labelled by the bucket's upper bound.
        bounds = [str(b) for b in LATENCY_BUCKETS_MS] + ["overflow"]
        for bound, count in zip(bounds, counts):
            out.append((f"pulsar_delayed_message_index_bucket_op_latency_ms{{type={typ},quantile={bound}}}", float(count)))
    for typ, total in sorted(getattr(stats, "op_latency_sum_ms", {}).items()):
        out.append((f"pulsar_delayed_message_index_bucket_op_latency_ms_sum{{type={typ}}}", float(total)))
    return out
