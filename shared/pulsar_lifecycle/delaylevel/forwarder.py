"""`PartitionForwarder`: one delay-level partition -> the near-term path, exactly once.

One thread per partition. It holds the partition's head message and sleeps until the head's
forward time (no polling: the embedded broker has neither delayed delivery nor seek on live
consumers, and none is needed, since forward times are monotone within a partition). When the
head is due it takes the following messages that are due too (up to `forward_batch_size`),
publishes them through its own DedupPublisher (producer `<prefix>-p<k>`, sequence ids from the
source positions), waits until the broker confirmed them, and only then acks them.

Memory: the consumer's receiver queue (bounded) plus one held head; never the backlog.
A crash anywhere leaves the unacked messages on the subscription; they come back in order and
the publisher drops what is already on the target topic (same names, same ids).
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Tuple

import pulsar

from ..dedup.publisher import RESERVED_PROPERTIES, DedupPublisher, Outcome, OutMessage
from ..scheduling_protocol import ERROR_PROP, TARGET_PROP, format_message_ref
from ..stall_watchdog import StallWatchdog
from .errors import ParkedMessageError
from .rule import (
    BASE_PROP,
    LEVEL_PROP,
    ORIGIN_MSG_ID_PROP,
    ORIGIN_PARTITION_PROP,
    Parked,
    forward_at,
    parse_parked,
    sequence_id,
    source_position,
)

log = logging.getLogger(__name__)

__all__ = ["ERROR_PROP", "ForwardPolicy", "ForwarderStats", "PartitionForwarder"]

# Internal properties a forward does not carry: the dedup publisher adds its own; base and level
# only served the forward time.
_NOT_FORWARDED = frozenset(RESERVED_PROPERTIES) | {BASE_PROP, LEVEL_PROP}
IDLE_WAIT_MS = 500  # longest blocking receive while the partition is empty (stop is checked in between)
MAX_SLEEP_S = 30.0  # re-read the clock at least this often while a head waits (wall-clock steps)
FLUSH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ForwardPolicy:
    """What a forwarder needs to decide, shared by all partitions of one syncer."""

    unit_ms: int
    lookahead_ms: int
    batch_size: int
    near_term_topic: Optional[str]  # the scheduling topic; None = broker backend (the business topic, deliver_at)
    dead_letter_topic: str
    target_exists: Optional[Callable[[str], bool]]  # None = no check (no admin API / onMissingTarget=forward)
    wait_for_room: Callable[[threading.Event], None]  # back-pressure: returns when the writer can take more
    clock: Callable[[], int]
    receiver_queue_size: int = 0  # the partition consumers' queue (0: unknown; only for the batch-size warning)
    # Batches sent but not yet confirmed while the next one is taken and sent (each acked once
    # confirmed): hides the broker's round trip without acking anything early (forwardPipelineDepth).
    pipeline_depth: int = 0


@dataclass
class ForwarderStats:
    """Counters and gauges of one partition (read by the metrics loop)."""

    forwarded: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    duplicates: int = 0
    next_forward_at: int = 0  # 0 = no head held
    forward_lag_ms: int = 0  # how late the last batch's head left compared with its forward time


@dataclass
class _Held:
    """A received, not yet acked parked message with its properties and forward time."""

    msg: pulsar.Message
    props: Dict[str, str]
    due: int
    parked: Optional[Parked]  # None: malformed (`error` says why), dead-lettered
    seq: int  # the forward's sequence id (from the source position)
    ref: str  # the source position, "<ledger>:<entry>[:<batch>]"
    error: str = ""


@dataclass
class _InFlight:
    """A batch sent to one topic and not yet confirmed: acked once `last_seq` is persisted."""

    topic: str
    last_seq: int  # highest sequence id of the batch (the publisher's watermark must pass it)
    claimed: int  # the forwarder's claim when it was sent (`done` moves there once it is acked)
    held: List[_Held]
    kinds: List[str]  # per message "forward" | "dead-letter", counted once confirmed
    outcomes: List[Outcome]


@dataclass
class _Pending:
    """A cancel waiting for its target; `ack` acknowledges the cancel request."""

    ack: Callable[[], None]


class PartitionForwarder:
    """Forwards one partition's parked messages at their forward times (see module docstring)."""

    def __init__(self, k: int, topic: str, consumer: pulsar.Consumer, publisher: DedupPublisher,
                 policy: ForwardPolicy, stop: threading.Event,
                 resubscribe: Optional[Callable[[int], pulsar.Consumer]] = None, receiver_queue_size: int = 0) -> None:
        self.k = k
        self.topic = topic
        self.consumer = consumer
        self.publisher = publisher
        self.policy = policy
        self.stop = stop
        self.stats = ForwarderStats()
        self.failure: Optional[BaseException] = None
        self._held: Deque[_Held] = deque()
        self._lock = threading.Lock()
        self._claimed = max((publisher.persisted_seq(t) for t in publisher.topics()), default=-1)
        self._done = self._claimed  # highest sequence id whose batch is published (or dropped) and acked
        self._cancels: Dict[int, _Pending] = {}
        self._inflight: Deque[_InFlight] = deque()  # sent, unconfirmed, unacked batches (oldest first)
        self._warned_batch = False
        # Stall watchdog (pulsar_lifecycle.stall_watchdog): `resubscribe` opens a new consumer on
        # the partition's subscription; None turns the watchdog off.
        self._watchdog: Optional[StallWatchdog] = None
        if resubscribe is not None:
            self._watchdog = StallWatchdog(topic, resubscribe, receiver_queue_size or policy.receiver_queue_size or 200,
                                           event="delay_level_partition_resubscribed")
            if self._claimed > 0:
                # After a restart: the last forwarded position counts as seen (the publisher's
                # sequence id is the source position), so an idle consumer with unforwarded
                # messages behind it is re-subscribed without the blind attempts' limit.
                self._watchdog.seen(*source_position(self._claimed)[:2])
        self._thread = threading.Thread(target=self._run, name=f"delay-level-p{k}", daemon=True)

    # -- cancellation ------------------------------------------------------------------------

    def cancel(self, seq: int, ack: Callable[[], None]) -> str:
        """Register a cancel of the message with sequence id `seq`: "pending" (it is still parked;
        `ack` runs once it is dropped or found missing) or "too-late" (already forwarded)."""
        with self._lock:
            if seq <= self._claimed:
                return "too-late"
            self._cancels[seq] = _Pending(ack)
            return "pending"

    @property
    def claimed(self) -> int:
        """Highest sequence id taken for forwarding (a forward of a higher one is published later)."""
        with self._lock:
            return self._claimed

    @property
    def done(self) -> int:
        """Highest sequence id whose batch is published and acked (or dropped by a cancel)."""
        return self._done

    # -- the loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the partition's thread."""
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (after `stop` is set)."""
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self._step()
        except BaseException as exc:  # the service sees it through `failure` and is rebuilt
            self.failure = exc
            log.error("event=delay_level_forwarder_failed partition=%s error=%r", self.topic, exc)
            self.stop.set()

    def _receive(self, timeout_ms: int) -> Optional[pulsar.Message]:
        try:
            return self.consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return None

    def _hold(self, msg: pulsar.Message) -> None:
        """Read a message's properties once and compute its forward time; a malformed parked
        message is due now (it is dead-lettered)."""
        mid = msg.message_id()  # read once: each accessor is a call into the client
        ledger, entry, batch = mid.ledger_id(), mid.entry_id(), mid.batch_index()
        if self._watchdog is not None:
            self._watchdog.seen(ledger, entry)
        seq, ref = sequence_id(ledger, entry, batch), format_message_ref(ledger, entry, batch)
        if not self._warned_batch and 0 < self.policy.receiver_queue_size <= 2 * batch:
            # pulsar-lite keeps a killed consumer's negative permits: entries larger than half the
            # queue can leave the next syncer with nothing on this partition (producer.py).
            self._warned_batch = True
            log.warning("event=delay_level_batch_exceeds_half_queue partition=%s batch_index=%d receiver_queue=%d "
                        "hint='producers should batch at most receiverQueueSize/2 messages (pulsar-lite stalls "
                        "a restarted consumer otherwise)'", self.topic, batch,
                        self.policy.receiver_queue_size)
        props = msg.properties()
        try:
            p = parse_parked(props, self.k)
        except ParkedMessageError as exc:
            self._held.append(_Held(msg, props, 0, None, seq, ref, str(exc)))
            return
        due = forward_at(p.base, self.k, self.policy.unit_ms, p.deliver_at, self.policy.lookahead_ms)
        self._held.append(_Held(msg, props, due, p, seq, ref))

    def _step(self) -> None:
        if not self._held:
            # With a batch in flight, only look for more without waiting: an idle partition
            # confirms and acks what it sent first.
            msg = self._receive(1 if self._inflight else IDLE_WAIT_MS)
            if msg is None:
                if self._inflight:
                    self._settle(0)
                    return
                self.stats.next_forward_at = 0
                self._watch_for_stall()
                return
            # Once messages flow, a stall is checked for at the first idle receive: a stalled
            # partition is due (its head was), and the lookahead is the whole margin.
            if self._watchdog is not None:
                self._watchdog.flowing()
            self._hold(msg)
        due = self._held[0].due
        self.stats.next_forward_at = due
        wait_ms = due - self.policy.clock()
        if wait_ms > 0:
            if self._inflight:
                self._settle(0)  # nothing stays unconfirmed and unacked while the head waits
                return
            # Hold the head and sleep until it is due: later messages are due no earlier.
            self.stop.wait(min(wait_ms / 1000.0, MAX_SLEEP_S))
            return
        # The head is due: take it and the following due messages, up to a batch. Messages
        # received but not due stay held (at most one batch_receive's worth).
        batch: List[_Held] = []
        now = self.policy.clock()
        while len(batch) < self.policy.batch_size:
            if not self._held:
                more = self.consumer.batch_receive()
                if not more:
                    break
                for m in more:
                    self._hold(m)
            if self._held[0].due > now:
                break
            batch.append(self._held.popleft())
        self.policy.wait_for_room(self.stop)
        if self.stop.is_set():
            return  # unacked: redelivered to the next consumer
        self.stats.forward_lag_ms = max(0, self.policy.clock() - due)
        self._forward(batch)

    @property
    def resubscribed(self) -> int:
        """How often the stall watchdog replaced this partition's consumer."""
        return self._watchdog.resubscribed if self._watchdog is not None else 0

    def _watch_for_stall(self) -> None:
        """Checked only while idle, nothing held and nothing unacked (so nothing is reordered);
        see pulsar_lifecycle.stall_watchdog and docs/delay-levels.md, "Lateness after a crash"."""
        if self._watchdog is None or self.stop.is_set():
            return
        new = self._watchdog.check(self.consumer)
        if new is not None:
            self.consumer = new

    # -- one batch -------------------------------------------------------------------------

    def _forward(self, batch: List[_Held]) -> None:
        groups: List[Tuple[str, List[OutMessage]]] = []
        dropped: List[Tuple[pulsar.Message, _Pending]] = []
        kinds: List[str] = []
        not_found: List[_Pending] = []
        with self._lock:
            for held in batch:
                msg, seq = held.msg, held.seq
                cancel = None
                if self._cancels:
                    cancel = self._cancels.pop(seq, None)
                    # Cancels of positions this batch passes without meeting them: the target is gone.
                    for missing in [s for s in self._cancels if s < seq]:
                        log.info("event=delay_level_cancel_target_not_found partition=%s seq=%d", self.topic, missing)
                        not_found.append(self._cancels.pop(missing))
                if seq > self._claimed:
                    self._claimed = seq
                if cancel is not None:
                    dropped.append((msg, cancel))
                    continue
                topic, out, kind = self._out_message(held, seq)
                kinds.append(kind)
                if groups and groups[-1][0] == topic:
                    groups[-1][1].append(out)
                else:
                    groups.append((topic, [out]))
        if len(groups) == 1 and not dropped and not not_found:
            # The common case: one topic, nothing cancelled. Send it and confirm the batches
            # before it (pipelined); this one is acked once the publisher's watermark passes it.
            topic, msgs = groups[0]
            outcomes = self.publisher.publish_many(topic, msgs)
            # The highest id, not the last: a message redelivered out of order can end a batch.
            last = max(m.sequence_id for m in msgs)
            self._inflight.append(_InFlight(topic, last, self._claimed, batch, kinds, outcomes))
            self._settle(self.policy.pipeline_depth)
            return
        self._settle(0)  # keep `done` a prefix: older batches are acked first
        outcomes = []
        for topic, msgs in groups:
            outcomes += self.publisher.publish_many(topic, msgs)
        # Ack only what the broker confirmed: flush raises if any send failed.
        self.publisher.flush(timeout_s=FLUSH_TIMEOUT_S)
        for msg, cancel in dropped:
            self.consumer.acknowledge(msg)
            cancel.ack()
            self.stats.cancelled += 1
            log.info("event=delay_level_cancelled partition=%s msg_id=%s", self.topic, _ref(msg))
        ack = self.consumer.acknowledge
        if dropped:
            dropped_ids = {id(d) for d, _ in dropped}
            for held in batch:
                if id(held.msg) not in dropped_ids:
                    ack(held.msg)
        else:
            for held in batch:
                ack(held.msg)
        for pending in not_found:
            pending.ack()
        self._done = max(self._done, self._claimed)
        self._count(kinds, outcomes)

    def _settle(self, keep: int) -> None:
        """Wait until all but the newest `keep` in-flight batches are persisted on their topic,
        then ack them (oldest first; the publisher raises if a send failed, and nothing is acked)."""
        ack = self.consumer.acknowledge
        while len(self._inflight) > keep:
            batch = self._inflight[0]
            self.publisher.wait_persisted(batch.topic, batch.last_seq, timeout_s=FLUSH_TIMEOUT_S)
            self._inflight.popleft()
            for held in batch.held:
                ack(held.msg)
            self._done = max(self._done, batch.claimed)
            self._count(batch.kinds, batch.outcomes)

    def _count(self, kinds: List[str], outcomes: List[Outcome]) -> None:
        for kind, outcome in zip(kinds, outcomes):
            if outcome.value == "duplicate":
                self.stats.duplicates += 1
            elif kind == "dead-letter":
                self.stats.dead_lettered += 1
            else:
                self.stats.forwarded += 1

    def _out_message(self, held: _Held, seq: int) -> Tuple[str, OutMessage, str]:
        """(topic, message, "forward" | "dead-letter") for one due parked message."""
        msg, parked = held.msg, held.parked
        props = {k: v for k, v in held.props.items() if k not in _NOT_FORWARDED}
        props[ORIGIN_PARTITION_PROP] = self.topic
        props[ORIGIN_MSG_ID_PROP] = held.ref
        key = msg.partition_key() or None
        event_time = msg.event_timestamp() or None
        if parked is None:
            reason = f"malformed parked message: {held.error}"
        elif self.policy.target_exists is not None and not self.policy.target_exists(parked.target):
            reason = f"business topic {parked.target} does not exist (deleted while the message was parked)"
        else:
            reason = ""
        if reason:
            props.update({k: v for k, v in held.props.items() if k in (BASE_PROP, LEVEL_PROP)})  # kept for diagnosis
            props[ERROR_PROP] = reason
            log.warning("event=delay_level_dead_letter partition=%s msg_id=%s reason=%r", self.topic, held.ref, reason)
            return self.policy.dead_letter_topic, OutMessage(msg.data(), seq, props, key, event_time), "dead-letter"
        assert parked is not None
        if self.policy.near_term_topic is not None:
            return self.policy.near_term_topic, OutMessage(msg.data(), seq, props, key, event_time), "forward"
        del props[TARGET_PROP]
        return parked.target, OutMessage(msg.data(), seq, props, key, event_time, deliver_at=parked.deliver_at), "forward"

    def resolve_passed_cancels(self) -> None:
        """Ack cancels whose target position the partition has already passed (not found)."""
        with self._lock:
            passed = [s for s in self._cancels if s <= self._claimed]
            pend = [self._cancels.pop(s) for s in passed]
        for p in pend:
            p.ack()


def _ref(msg: pulsar.Message) -> str:
    mid = msg.message_id()
    return format_message_ref(mid.ledger_id(), mid.entry_id(), mid.batch_index())
