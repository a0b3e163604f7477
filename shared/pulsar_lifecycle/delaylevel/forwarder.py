"""`PartitionForwarder`: one delay-level partition -> the near-term path, exactly once.

One thread per partition (at most `forwardConcurrency` of them forwarding at once: slots.py). It
holds the partition's head message and sleeps until the head's forward time (no polling: the
embedded broker has neither delayed delivery nor seek on live consumers, and none is needed,
since forward times are monotone within a partition). When the head is due it takes the
following messages that are due too (up to `forward_batch_size`), publishes them through its own
DedupPublisher (producer `<prefix>-p<k>`, sequence ids from the source positions), waits until
the broker confirmed them, and only then acks them.

Memory: the consumer's receiver queue (bounded) plus one held head; never the backlog.
A crash anywhere leaves the unacked messages on the subscription; they come back in order and
the publisher drops what is already on the target topic (same names, same ids).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Tuple

import pulsar

from ..dedup.publisher import DedupPublisher, Outcome, OutMessage
from ..dedup.sequence_map import DedupError
from ..pulsar_io import native_consumer
from ..pulsar_io.stall_watchdog import StallWatchdog
from ..scheduler.target_health import backoff_ms
from ..scheduling_protocol import ERROR_PROP, TARGET_PROP, format_message_ref
from .errors import ParkedMessageError
from .order import OrderGate, Pos, batch_size_of
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
from .slots import ForwardSlots

log = logging.getLogger(__name__)

__all__ = ["ERROR_PROP", "ForwardPolicy", "ForwarderStats", "PartitionForwarder", "Probe", "position_of"]

IDLE_WAIT_MS = 500  # longest blocking receive while the partition is empty (stop is checked in between)
MAX_SLEEP_S = 30.0  # re-read the clock at least this often while a head waits (wall-clock steps)
FLUSH_TIMEOUT_S = 120.0
GAP_PROBE_MIN_S, GAP_PROBE_MAX_S = 0.2, 5.0  # Reader probes while a message waits beyond a gap (backoff)
GAP_LOG_EVERY_S = 30.0
# A gap still open this long is read with a Reader: Apache Pulsar hands a dead consumer's messages
# to the live one within milliseconds, pulsar-lite may keep them with a consumer of a connection
# that ended with a reset until it restarts (subscribe.py). The gap is probed at once, then after
# GAP_PROBE_MIN_S, 3x and 7x that: equal to GAP_PROBE_MIN_S, the read comes with the second probe
# (0.5 s waited for the third, 0.6 s, after every restart on pulsar-lite).
GAP_READ_AFTER_S = 0.2
HANDLED_KEY_PREFIX = "delay-level/handled"  # /<producer name>: highest position handled without a forward
PROBLEM_KEY_PREFIX = "delay-level/forward-problem"  # /<k>: a forward being retried (JSON), "" once it is not
# /<producer name>: the dead-letter decision of a refused run (JSON {"why": ..., "seqs": [...]}),
# written before its dead letters are published and cleared once the handled position passes it:
# a message redelivered after a crash between its dead letter and its ack goes to the dead-letter
# topic again (dropped there as a duplicate), never to its target, even if the target accepts by then.
DEAD_LETTER_KEY_PREFIX = "delay-level/dead-letter-decision"
# What a refusing target raises: a send that failed (PublishError), a producer or lookup the broker
# refused (pulsar exceptions: authorization, schema, topic or namespace not found), a recovery that
# could not read the target (a lookup or producer that times out, pulsar.Timeout, counts too). Not a
# confirmation that times out (TimeoutError from wait_persisted): that is no answer (a broker
# outage), so the forwarder fails and is rebuilt as before, and nothing is dead-lettered for it.
FORWARD_REFUSALS = (DedupError, pulsar.PulsarException)


def position_of(mid: pulsar.MessageId, with_size: bool = False) -> Pos:
    """The source position of a message id (batch index -1, outside a batch, counts as 0, as in
    the sequence id); the batch size only `with_size` (else when the OrderGate needs it: it costs
    a serialization of the id)."""
    batch = mid.batch_index()
    if batch < 0:
        return Pos(mid.ledger_id(), mid.entry_id(), 0, 1)
    return Pos(mid.ledger_id(), mid.entry_id(), batch, batch_size_of(mid.serialize()) if with_size else 0)


def _batch_size(msg: pulsar.Message) -> int:
    return batch_size_of(msg.message_id().serialize())


# Looks for the first message of the partition after a position (None: from the start); returns
# its position (with batch size) or None when there is none. A Reader in the service (Pulsar I/O).
Probe = Callable[[Optional[Pos]], Optional[Pos]]
# Reads the partition's messages after a position (None: from the start) and before another, in
# order, with a Reader of its own (Pulsar I/O, in the service).
GapReader = Callable[[Optional[Pos], Pos], List[pulsar.Message]]
# Reads the partition's messages after a position (None: from the start) up to its end, in order,
# at most a given number, with a Reader of its own (Pulsar I/O, in the service); True when they
# reach the end (not stopped by the number or a Reader that gave nothing for a while).
TailReader = Callable[[Optional[Pos], int], Tuple[List[pulsar.Message], bool]]


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
    # How many partitions forward at once (forwardConcurrency); None = no limit.
    slots: Optional[ForwardSlots] = None
    # How long a forward the target refuses is retried (with backoff) before it is dead-lettered
    # with the reason (forwardRetrySeconds).
    retry_s: float = 60.0
    # targetPermissionCheck: why a forward to a target is refused (the roles that may produce to the
    # delay-level topic but not to it), None when allowed; None = no check. May raise
    # PermissionsUnavailable (the admin API cannot answer now): the forwarder fails, nothing is
    # acked, and the rebuilt syncer asks again.
    target_refusal: Optional[Callable[[str], Optional[str]]] = None


@dataclass
class ForwarderStats:
    """Counters and gauges of one partition (read by the metrics loop)."""

    forwarded: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    duplicates: int = 0
    next_forward_at: int = 0  # 0 = no head held
    forward_lag_ms: int = 0  # how late the last batch's head left compared with its forward time
    forward_retries: int = 0  # attempts at a forward the target refused
    forward_failed: int = 0  # forwards dead-lettered after forwardRetrySeconds of refusals
    stuck_target: str = ""  # the target a forward is being retried to ("" = none)
    stuck_since_ms: int = 0
    stuck_reason: str = ""


@dataclass(slots=True)
class _Held:
    """A received, not yet acked parked message with its properties and forward time."""

    msg: pulsar.Message
    props: Dict[str, str]
    due: int
    parked: Optional[Parked]  # None: malformed (`error` says why), dead-lettered
    seq: int  # the forward's sequence id (from the source position)
    ref: str  # the source position, "<ledger>:<entry>[:<batch>]"
    error: str = ""
    # Once built (`_out_message`): its target, its forward and its kind, and the strategy
    # properties the forward drops (restored on a dead letter).
    out: Optional[Tuple[str, OutMessage, str]] = None
    dropped_props: Optional[Dict[str, str]] = None


class _Stopped(Exception):
    """The syncer stops while a refused forward waits for its next attempt (nothing is acked)."""


@dataclass
class _InFlight:
    """A batch sent and not yet confirmed: acked once each destination's watermark passes its
    highest sequence id there (one destination, or partitions of a partitioned target)."""

    dests: List[Tuple[str, int]]  # (destination topic or partition, highest sequence id sent there)
    claimed: int  # the forwarder's claim when it was sent (`done` moves there once it is acked)
    held: List[_Held]
    kinds: List[str]  # per message "forward" | "dead-letter", counted once confirmed
    outcomes: List[Outcome]
    record: bool = False  # not on the near-term topic: record the handled position before the ack


@dataclass
class _Pending:
    """A cancel waiting for its target; `ack` acknowledges the cancel request."""

    ack: Callable[[], None]


class PartitionForwarder:
    """Forwards one partition's parked messages at their forward times (see module docstring)."""

    def __init__(self, k: int, topic: str, consumer: pulsar.Consumer, publisher: DedupPublisher,
                 policy: ForwardPolicy, stop: threading.Event,
                 resubscribe: Optional[Callable[[int], pulsar.Consumer]] = None, receiver_queue_size: int = 0,
                 probe: Optional[Probe] = None, read_gap: Optional[GapReader] = None,
                 read_tail: Optional[TailReader] = None, holds_messages: Optional[Callable[[], bool]] = None) -> None:
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
        self._handled_key = f"{HANDLED_KEY_PREFIX}/{publisher.producer_name}"
        raw = publisher.state_store.get(self._handled_key)
        # Everything up to the highest forward on the topics and the highest position handled
        # without one (cancelled, dead-lettered, broker backend; recorded before its ack) is
        # handled: positions are handled strictly in order (order.py).
        near = policy.near_term_topic
        # A plain near-term topic's watermark is a prefix of the forwards (one producer, in
        # order). Over a partitioned one it is not (partition 1 may hold seq 100 while seq 99,
        # routed to partition 2, was lost in a crash): there the handled position is recorded
        # before every ack, and the partitions' de-duplication drops what a replay sends again.
        self._near_plain: Optional[str] = near if near is not None and publisher.partitions(near) == 0 else None
        if self._near_plain is not None:
            self._near_plain = publisher.destination(self._near_plain, 1)  # its normalized name
        watermarks = [publisher.persisted_seq(self._near_plain)] if self._near_plain is not None else []
        self._claimed = max(watermarks + [int(raw) if raw else -1])
        self._problem_key = f"{PROBLEM_KEY_PREFIX}/{k}"
        self._in_slot = False  # holds one of the forward slots (released while a refused forward waits)
        self._known_persisted: Dict[str, int] = {}  # a discarded channel's last watermark
        self._done = self._claimed  # highest sequence id whose batch is published (or dropped) and acked
        self._recorded = self._claimed  # the handled position last written to the state store
        self._decision_key = f"{DEAD_LETTER_KEY_PREFIX}/{publisher.producer_name}"
        self._decided: Dict[int, str] = self._load_decision()  # seq -> reason of a dead-letter decision
        queue = receiver_queue_size or policy.receiver_queue_size or 200
        # Strict position order (order.py); `probe` (a Reader) resolves a gap the ids cannot.
        # Without a probe (tests of other parts), messages are taken in the order they come.
        self._probe = probe
        self._read_gap = read_gap
        self._read_tail_fn = read_tail
        self._tail_more = False  # the last tail read stopped at its limit: read on once idle
        self._gate: Optional[OrderGate[pulsar.Message]] = None
        if probe is not None:
            frontier = Pos(*source_position(self._claimed)) if self._claimed > 0 else None
            self._gate = OrderGate(frontier, cap=max(queue, policy.batch_size), sizer=_batch_size)
        self._next_probe = 0.0
        self._probe_interval = GAP_PROBE_MIN_S
        self._gap_since = 0.0
        self._gap_logged = 0.0
        self._cancels: Dict[int, _Pending] = {}
        self._inflight: Deque[_InFlight] = deque()  # sent, unconfirmed, unacked batches (oldest first)
        self._warned_batch = False
        # Stall watchdog (pulsar_lifecycle.pulsar_io.stall_watchdog): `resubscribe` opens a new consumer on
        # the partition's subscription; None turns the watchdog off.
        self._watchdog: Optional[StallWatchdog] = None
        if resubscribe is not None:
            # Messages waiting beyond a gap belong to the consumer being replaced: forgotten, not
            # acked; the broker hands them to the new one.
            # `holds_messages`: an idle partition that never held a message is not asked its end.
            self._watchdog = StallWatchdog(topic, resubscribe, queue, event="delay_level_partition_resubscribed",
                                           before_resubscribe=self._forget_waiting, holds_messages=holds_messages)
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
        except _Stopped:
            return  # unacked messages are redelivered to the next consumer
        except BaseException as exc:  # the service sees it through `failure` and is rebuilt
            self.failure = exc
            log.error("event=delay_level_forwarder_failed partition=%s error=%r", self.topic, exc)
            self.stop.set()

    def _take(self, msg: pulsar.Message) -> None:
        """Route a received message: into the ordered stream (`_held`), to wait beyond a gap
        (OrderGate), or, a copy of a position handled before, acked without a forward."""
        mid = msg.message_id()  # read once: each accessor is a call into the client
        self._take_at(msg, mid.ledger_id(), mid.entry_id(), mid.batch_index())

    def _take_all(self, msgs: List[pulsar.Message]) -> None:
        """`_take` for each of a batch_receive's messages, in order."""
        take_at = self._take_at
        for msg in msgs:
            mid = msg.message_id()  # read once: each accessor is a call into the client
            take_at(msg, mid.ledger_id(), mid.entry_id(), mid.batch_index())

    def _take_at(self, msg: pulsar.Message, ledger: int, entry: int, batch: int) -> None:
        if self._watchdog is not None:
            self._watchdog.seen(ledger, entry)
        gate = self._gate
        if gate is None or gate.offer_next(ledger, entry, batch, msg):
            # The common case: the next position (or no order kept): straight into the stream.
            self._hold_at(msg, ledger, entry, batch)
            return
        if gate.handled_at(ledger, entry, batch):
            # Handled before, so never forwarded again. Acked only when that is confirmed;
            # otherwise its original is held or in flight and is acked with it (same id).
            self.stats.duplicates += 1
            seq = sequence_id(ledger, entry, batch)
            if seq <= self._done:
                self.consumer.acknowledge(msg)
            log.debug("event=delay_level_redelivery partition=%s seq=%d done=%d", self.topic, seq, self._done)
            return
        waiting = len(gate)
        pos = Pos(ledger, entry, batch, 0) if batch >= 0 else Pos(ledger, entry, 0, 1)  # as position_of
        for m in gate.offer(pos, msg):
            self._hold(m)
        if len(gate) and not waiting:
            self._next_probe = 0.0  # a gap opened: ask a Reader right away
            self._gap_since = time.monotonic()
        elif waiting and not len(gate):
            self._gap_closed()  # the missing message came

    def _gap_closed(self) -> None:
        if self._probe_interval > GAP_PROBE_MIN_S:  # a Reader found it missing: say how long it took
            log.info("event=delay_level_partition_gap_filled partition=%s frontier=%s waited_s=%.1f", self.topic,
                     self._gate.frontier if self._gate is not None else None, time.monotonic() - self._gap_since)
        self._probe_interval = GAP_PROBE_MIN_S

    def _forget_waiting(self) -> None:
        if self._gate is not None:
            self._gate.clear()

    def _resolve_gap(self) -> None:
        """Messages wait beyond a gap: ask a Reader which message follows the frontier (with a
        backoff); if it is the first waiting one, the gap holds nothing and they are admitted.
        Otherwise the missing message is unacked (only the syncer acks, and only what it
        handled) and is held by another consumer of the subscription: it comes back."""
        gate = self._gate
        now = time.monotonic()
        if gate is None or not len(gate) or now < self._next_probe or self._probe is None:
            return
        nxt = self._probe(gate.frontier)
        admitted = gate.resolve(nxt)
        for m in admitted:
            self._hold(m)
        if not len(gate):
            self._gap_closed()
            return
        if self._read_gap is not None and now - self._gap_since >= GAP_READ_AFTER_S and nxt is not None:
            found = self._read_the_gap(gate)
            if not len(gate):
                self._gap_closed()
                return
            if found:
                # More wait beyond the next gap. pulsar-lite deals a subscription's messages to its
                # consumers in turn, so a dead consumer's share is spread over many gaps: read the
                # next one at once. Back off only while reads find nothing.
                self._next_probe = now
                return
        self._next_probe = now + self._probe_interval
        self._probe_interval = min(GAP_PROBE_MAX_S, 2 * self._probe_interval)
        if now - self._gap_logged >= GAP_LOG_EVERY_S:
            self._gap_logged = now
            log.warning("event=delay_level_partition_gap_wait partition=%s frontier=%s missing=%s first_waiting=%s "
                        "waiting=%d waited_s=%.1f reason='an earlier message is held by another consumer of the "
                        "subscription; later ones wait so that nothing is forwarded out of order'", self.topic,
                        gate.frontier, nxt, gate.first_waiting(), len(gate), now - self._gap_since)

    def _read_the_gap(self, gate: "OrderGate[pulsar.Message]") -> int:
        """Admit what a Reader finds between the frontier and the first waiting message: the
        messages a consumer of the subscription holds and does not hand over (pulsar-lite: a dead
        one). They are forwarded in order like received ones; their acks through this consumer
        may be ignored by the broker, and when it hands them out later they are redeliveries of
        handled positions (dropped, acked). Returns how many the Reader found."""
        first = gate.first_waiting()
        assert self._read_gap is not None and first is not None
        found = self._read_gap(gate.frontier, first)
        admitted = 0
        for m in gate.admit_read([(position_of(msg.message_id(), with_size=True), msg) for msg in found]):
            self._hold(m)
            admitted += 1
        log.warning("event=delay_level_partition_gap_read partition=%s read=%d admitted=%d waiting=%d "
                    "waited_s=%.1f reason='messages another consumer of the subscription holds and does not hand "
                    "over (pulsar-lite keeps a reset connection's consumers); read with a Reader'", self.topic,
                    len(found), admitted, len(gate), time.monotonic() - self._gap_since)
        return len(found)

    def _hold(self, msg: pulsar.Message) -> None:
        """`_hold_at` reading the message's position from its id."""
        mid = msg.message_id()
        self._hold_at(msg, mid.ledger_id(), mid.entry_id(), mid.batch_index())

    def _hold_at(self, msg: pulsar.Message, ledger: int, entry: int, batch: int) -> None:
        """Read a message's properties once and compute its forward time (its position is the
        one `_take` read from its id); a malformed parked message is due now (it is dead-lettered)."""
        seq = sequence_id(ledger, entry, batch)
        # format_message_ref's value, formatted here: the accessors give ints already.
        ref = f"{ledger}:{entry}:{batch}" if batch >= 0 else f"{ledger}:{entry}"
        if batch > 0 and not self._warned_batch and 0 < self.policy.receiver_queue_size <= 2 * batch:
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
            gate = self._gate
            if gate is not None and len(gate):
                self._resolve_gap()
                if self._held:
                    return
                if gate.full:  # memory bound: receive no more until the gap is filled
                    if self._inflight:
                        self._settle(0)
                        return
                    self._watch_for_stall()
                    self.stop.wait(0.1)
                    return
            elif self._tail_more and not self._inflight:
                self._read_tail()  # the rest of a held tail, without an idle receive first
                if self._held:
                    return
            # With a batch in flight, only look for more without waiting: an idle partition
            # confirms and acks what it sent first.
            msg = native_consumer.receive(self.consumer, 1 if self._inflight else IDLE_WAIT_MS)
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
            self._take(msg)
            if not self._held:
                return
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
        # The head is due: forward it, holding one of the syncer's forward slots (slots.py);
        # back-pressure is waited for first, holding none.
        self.policy.wait_for_room(self.stop)
        if self.stop.is_set():
            return  # unacked: redelivered to the next consumer
        slots = self.policy.slots
        if slots is None:
            self._forward_due(due)
        elif slots.acquire(self.stop):
            self._in_slot = True
            try:
                self._forward_due(due)
            finally:
                if self._in_slot:
                    self._in_slot = False
                    slots.release()

    def _forward_due(self, due: int) -> None:
        """Take the due head and the following due messages, up to a batch, and forward them.
        Messages received but not due stay held (at most one batch_receive's worth)."""
        batch: List[_Held] = []
        now = self.policy.clock()
        held, limit = self._held, self.policy.batch_size
        while len(batch) < limit:
            if not held:
                if self._gate is not None and self._gate.full:
                    break
                more = native_consumer.batch_receive(self.consumer)
                if not more:
                    break
                self._take_all(more)
                if not held:
                    break  # all of them wait beyond a gap (or were copies of handled ones)
            if held[0].due > now:
                break
            batch.append(held.popleft())
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
        see pulsar_lifecycle.pulsar_io.stall_watchdog and docs/delay-levels.md, "Lateness after a crash"."""
        if self._watchdog is None or self.stop.is_set():
            return
        new = self._watchdog.check(self.consumer)
        if new is not None:
            self.consumer = new
            # Idle while the partition holds more than was received: the new consumer outweighs
            # a permit deficit, but not a dead consumer that keeps what was dispatched to it
            # (pulsar-lite). Nothing later arrives to open a gap, so read the tail.
            self._read_tail()

    def _read_tail(self) -> None:
        """Admit what a Reader finds after the frontier, up to the partition's end (at most the
        gate's cap, the memory bound of messages waiting beyond a gap; `_step` reads on when it
        is reached): the partition's last messages, held by a consumer of the subscription that
        does not hand them over (pulsar-lite keeps a SIGKILLed syncer's consumers with what was
        dispatched to them). Forwarded in order like received ones; a copy the broker hands out
        later is a handled position (order.py)."""
        gate, read = self._gate, self._read_tail_fn
        if gate is None or read is None or self.stop.is_set():
            return
        started = time.monotonic()
        frontier = gate.frontier
        found, complete = read(frontier, gate.cap)
        admitted = 0
        for m in gate.admit_read([(position_of(msg.message_id(), with_size=True), msg) for msg in found]):
            self._hold(m)
            admitted += 1
        self._tail_more = len(found) >= gate.cap
        if not found:
            self._tail_more = False
            log.info("event=delay_level_partition_tail_read partition=%s frontier=%s read=0 seconds=%.2f",
                     self.topic, frontier, time.monotonic() - started)
            return
        if self._watchdog is not None:
            if complete:  # else the watchdog still sees the end beyond what was read, and reads again
                last = found[-1].message_id()
                self._watchdog.seen(last.ledger_id(), last.entry_id())
            self._watchdog.flowing()  # a dead consumer may be dealt more: look again at the next idle receive
        log.warning("event=delay_level_partition_tail_read partition=%s frontier=%s read=%d admitted=%d more=%s "
                    "complete=%s seconds=%.2f reason='the partition's last messages are held by another consumer of the "
                    "subscription that does not hand them over (pulsar-lite keeps a reset connection's consumers); "
                    "read with a Reader'", self.topic, frontier, len(found), admitted, str(self._tail_more).lower(),
                    str(complete).lower(), time.monotonic() - started)

    # -- one batch -------------------------------------------------------------------------

    def _forward(self, batch: List[_Held]) -> None:
        groups: List[Tuple[str, List[OutMessage]]] = []
        dropped: List[Tuple[pulsar.Message, _Pending]] = []
        kinds: List[str] = []
        not_found: List[_Pending] = []
        with self._lock:
            if not self._cancels:
                # The common case: nothing to cancel (none can be added while the lock is held).
                out_message = self._out_message
                for held in batch:
                    topic, out, kind = out_message(held, held.seq)
                    kinds.append(kind)
                    if groups and groups[-1][0] == topic:
                        groups[-1][1].append(out)
                    else:
                        groups.append((topic, [out]))
                if batch:
                    self._claimed = max(self._claimed, max([held.seq for held in batch]))
            else:
                for held in batch:
                    msg, seq = held.msg, held.seq
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
            # before it (pipelined); this one is acked once the publisher's watermarks pass it.
            topic, msgs = groups[0]
            try:
                outcomes, dests = self._publish(topic, msgs)
            except FORWARD_REFUSALS as exc:
                self._recover(exc, [h for h in batch])
                return
            # Not on the plain near-term topic (broker backend, dead-letter topic, partitions):
            # record the handled position before the ack.
            record = len(dests) != 1 or dests[0][0] != self._near_plain
            self._inflight.append(_InFlight(dests, self._claimed, batch, kinds, outcomes, record))
            self._settle(self.policy.pipeline_depth)
            return
        self._settle(0)  # keep `done` a prefix: older batches are acked first
        outcomes = []
        dropped_ids = {id(d) for d, _ in dropped}
        try:
            for topic, msgs in groups:
                outcomes += self._publish(topic, msgs)[0]
            # Ack only what the broker confirmed: flush raises if any send failed.
            self.publisher.flush(timeout_s=FLUSH_TIMEOUT_S)
        except FORWARD_REFUSALS as exc:
            self._recover(exc, [h for h in batch if id(h.msg) not in dropped_ids])
            outcomes, kinds = [], []
            batch = []  # acked by `_recover`
        self._record_handled(self._claimed)  # cancels leave no forward behind
        for msg, cancel in dropped:
            self.consumer.acknowledge(msg)
            cancel.ack()
            self.stats.cancelled += 1
            log.info("event=delay_level_cancelled partition=%s msg_id=%s", self.topic, _ref(msg))
        ack = self.consumer.acknowledge
        if dropped:
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

    def _publish(self, topic: str, msgs: List[OutMessage]) -> Tuple[List[Outcome], List[Tuple[str, int]]]:
        """Publish to `topic` (a partitioned one: each message to the partition the publisher
        routes it to); (outcomes in the order of `msgs`, [(destination, highest id sent there)])."""
        # The forwards' properties dicts are the parked messages' own (Message.properties(): str
        # -> str), built once by `_out_message`: handed over, not copied. The publisher writes its
        # two properties into them, replacing any a parked message carried.
        publisher = self.publisher
        routed = publisher.route(topic, msgs)
        if len(routed) == 1:
            dest, part = routed[0]
            # The highest id, not the last: a message redelivered out of order can end a batch.
            return publisher.publish_many(dest, part, properties_owned=True), [(dest, max([m.sequence_id for m in part]))]
        by_seq: Dict[int, Outcome] = {}
        dests: List[Tuple[str, int]] = []
        for dest, part in routed:
            for m, o in zip(part, publisher.publish_many(dest, part, properties_owned=True)):
                by_seq[m.sequence_id] = o
            dests.append((dest, max([m.sequence_id for m in part])))
        return [by_seq[m.sequence_id] for m in msgs], dests

    def _settle(self, keep: int) -> None:
        """Wait until all but the newest `keep` in-flight batches are persisted on their
        destinations, then ack them (oldest first). A send that failed is retried in order with
        every unacked batch (`_recover`); nothing is acked before it is confirmed."""
        ack = self.consumer.acknowledge
        while len(self._inflight) > keep:
            batch = self._inflight[0]
            try:
                for dest, last in batch.dests:
                    self.publisher.wait_persisted(dest, last, timeout_s=FLUSH_TIMEOUT_S)
            except FORWARD_REFUSALS as exc:
                self._recover(exc, [])
                return
            if batch.record:
                self._record_handled(batch.claimed)
            self._inflight.popleft()
            for held in batch.held:
                ack(held.msg)
            self._done = max(self._done, batch.claimed)
            self._count(batch.kinds, batch.outcomes)

    # -- refused forwards ------------------------------------------------------------------

    def _recover(self, exc: BaseException, current: List[_Held]) -> None:
        """A target refused a forward (`exc`): forward every unacked message again, in order (the
        in-flight batches, then `current`), one run of the same target after the other; a run the
        target keeps refusing is retried with backoff for `retry_s`, then dead-lettered with the
        reason. The partition waits meanwhile (order), the others forward on (the slot is given
        up while waiting). What reached a target before is dropped by its de-duplication."""
        held = [h for b in self._inflight for h in b.held] + current
        self._inflight.clear()
        log.warning("event=delay_level_forward_refused partition=%s unacked=%d error=%r", self.topic, len(held), exc)
        i = 0
        while i < len(held):
            first = held[i].out
            assert first is not None
            j = i
            while j < len(held) and held[j].out[0] == first[0]:  # type: ignore[index]
                j += 1
            self._forward_run(first[0], held[i:j])
            i = j

    def _forward_run(self, topic: str, run: List[_Held]) -> None:
        """Forward `run` (messages to `topic`, in order) until confirmed, retrying a refusal with
        backoff for `retry_s`, then dead-letter what did not reach it; record, ack, count."""
        msgs = [h.out[1] for h in run]  # type: ignore[index]
        kinds = [h.out[2] for h in run]  # type: ignore[index]
        started: Optional[float] = None
        attempts = 0
        while True:
            try:
                outcomes, dests = self._publish(topic, msgs)
                for dest, last in dests:
                    self.publisher.wait_persisted(dest, last, timeout_s=FLUSH_TIMEOUT_S)
                break
            except FORWARD_REFUSALS as exc:
                reason = f"{type(exc).__name__}: {exc}"
                self._discard(topic, msgs)
                now = time.monotonic()
                self.stats.forward_retries += 1
                if started is None:
                    started = now
                    self._set_problem(topic, reason, len(run))
                if now - started >= self.policy.retry_s:
                    outcomes, kinds = self._dead_letter_run(topic, run, reason)
                    break
                attempts += 1
                delay = backoff_ms(attempts) / 1000.0  # the writer's rule for a refusing target
                log.info("event=delay_level_forward_retry partition=%s target=%s messages=%d retry_in_s=%.1f "
                         "refused_for_s=%.1f error=%r", self.topic, topic, len(run), delay, now - started, reason)
                self._backoff(delay)
        if started is not None:
            self._clear_problem(topic, time.monotonic() - started)
        top = max(h.seq for h in run)
        self._record_handled(top)
        ack = self.consumer.acknowledge
        for h in run:
            ack(h.msg)
        self._done = max(self._done, top)
        self._count(kinds, outcomes)

    def _discard(self, topic: str, msgs: List[OutMessage]) -> None:
        """Drop the publisher's channels of `topic`'s destinations (a failed one refuses every
        later publish), remembering their watermarks: the next attempt opens them again."""
        try:
            dests = [d for d, _ in self.publisher.route(topic, msgs)]
        except FORWARD_REFUSALS:
            return  # the lookup itself is refused: no channel was opened
        for dest in dests:
            seen = self.publisher.persisted_seq(dest)
            self._known_persisted[dest] = max(self._known_persisted.get(dest, -1), seen)
            self.publisher.reset(dest)

    def _dead_letter_run(self, topic: str, run: List[_Held], reason: str) -> Tuple[List[Outcome], List[str]]:
        """Send the messages of `run` that did not reach `topic` to the dead-letter topic, with
        the reason and their original properties (the target, the strategy's); (outcomes, kinds)."""
        why = f"forward to {topic} refused for {self.policy.retry_s:g} s: {reason}"
        letters: List[OutMessage] = []
        outcomes: List[Outcome] = []
        kinds: List[str] = []
        for h in run:
            out = h.out[1]  # type: ignore[index]
            try:
                dest = self.publisher.destination(topic, out.sequence_id, out.partition_key)
            except FORWARD_REFUSALS:
                dest = ""
            if dest and out.sequence_id <= max(self._known_persisted.get(dest, -1), self.publisher.persisted_seq(dest)):
                outcomes.append(Outcome.DUPLICATE)  # it reached the target before the refusals
                kinds.append("forward")
                continue
            letters.append(self._letter(h, out, why))
            kinds.append("dead-letter")
        if letters:
            # Durable before the first letter is sent (a failed write raises: nothing is sent).
            self._record_decision({m.sequence_id: why for m in letters})
            outcomes += self.publisher.publish_many(self.policy.dead_letter_topic, letters)
            self.publisher.wait_persisted(self.policy.dead_letter_topic, max(m.sequence_id for m in letters),
                                          timeout_s=FLUSH_TIMEOUT_S)
            self.stats.forward_failed += len(letters)
        # outcomes: duplicates first, then the letters' (the order of `kinds` for counting)
        kinds = ["forward"] * (len(kinds) - len(letters)) + ["dead-letter"] * len(letters)
        log.error("event=delay_level_forward_dead_lettered partition=%s target=%s messages=%d dead_letter_topic=%s "
                  "reason=%r", self.topic, topic, len(letters), self.policy.dead_letter_topic, why)
        return outcomes, kinds

    def _letter(self, held: _Held, out: OutMessage, why: str) -> OutMessage:
        """The dead letter of `held` (whose forward is `out`): its payload, key, event time and
        original properties (the target, the strategy's), with the reason."""
        props = {k: v for k, v in (out.properties or {}).items() if k not in ("__pl_producer__", "__pl_seq__")}
        props.update(held.dropped_props or {})
        if held.parked is not None:
            props[TARGET_PROP] = held.parked.target
        props[ERROR_PROP] = why
        return OutMessage(out.payload, out.sequence_id, props, out.partition_key, out.event_timestamp)

    def _load_decision(self) -> Dict[int, str]:
        """The stored dead-letter decision not yet passed by the handled position ({} if none)."""
        raw = self.publisher.state_store.get(self._decision_key)
        if not raw:
            return {}
        try:
            data = json.loads(raw)
            decided = {int(s): str(data["why"]) for s in data["seqs"]}
        except (ValueError, TypeError, KeyError) as exc:
            # Not a reason to stop the partition: without it a redelivered dead letter may reach
            # its target too (the gap the record closes), which the log says.
            log.error("event=delay_level_dead_letter_decision_unreadable partition=%s key=%s error=%r", self.topic,
                      self._decision_key, exc)
            return {}
        if decided and max(decided) > self._claimed:
            log.warning("event=delay_level_dead_letter_decision_recovered partition=%s messages=%d", self.topic,
                        len(decided))
            return decided
        return {}

    def _record_decision(self, decided: Dict[int, str]) -> None:
        why = next(iter(decided.values()))
        self.publisher.state_store.put(self._decision_key,
                                       json.dumps({"why": why, "seqs": sorted(decided)}).encode())
        self._decided = decided

    def _backoff(self, delay: float) -> None:
        """Wait `delay` s without holding a forward slot (other partitions forward meanwhile)."""
        slots, held = self.policy.slots, self._in_slot
        if slots is not None and held:
            self._in_slot = False
            slots.release()
        self.stop.wait(delay)
        if self.stop.is_set():
            raise _Stopped()
        if slots is not None and held:
            if not slots.acquire(self.stop):
                raise _Stopped()
            self._in_slot = True

    def _set_problem(self, target: str, reason: str, messages: int) -> None:
        now = self.policy.clock()
        self.stats.stuck_target, self.stats.stuck_since_ms, self.stats.stuck_reason = target, now, reason
        log.warning("event=delay_level_forward_stuck partition=%s target=%s messages=%d retry_s=%g error=%r", self.topic,
                    target, messages, self.policy.retry_s, reason)
        self._put_problem(json.dumps({"target": target, "reason": reason, "since_ms": now,
                                      "retry_s": self.policy.retry_s, "dead_letter_topic": self.policy.dead_letter_topic}))

    def _clear_problem(self, target: str, seconds: float) -> None:
        self.stats.stuck_target, self.stats.stuck_since_ms, self.stats.stuck_reason = "", 0, ""
        log.info("event=delay_level_forward_unstuck partition=%s target=%s seconds=%.1f", self.topic, target, seconds)
        self._put_problem("")

    def _put_problem(self, value: str) -> None:
        try:
            self.publisher.state_store.put(self._problem_key, value.encode())
        except Exception as exc:  # only `inspect syncer` reads it; forwarding does not depend on it
            log.warning("event=delay_level_problem_unrecorded partition=%s error=%r", self.topic, exc)

    def _record_handled(self, seq: int) -> None:
        """Write the highest handled position before acking messages that leave no forward on
        the near-term topic (cancelled, dead-lettered, broker backend): a restart starts its
        order there (the forwards on the near-term topic are found by the publisher's recovery).
        A failed write raises, and nothing is acked."""
        if self._gate is not None and seq > self._recorded:
            self.publisher.state_store.put(self._handled_key, str(seq).encode())
            self._recorded = seq
        if self._decided and seq >= max(self._decided):
            # The decision is passed (handled, recorded above): every letter of it is on the
            # dead-letter topic and the acks follow.
            self.publisher.state_store.put(self._decision_key, b"")
            self._decided = {}

    def _count(self, kinds: List[str], outcomes: List[Outcome]) -> None:
        if "dead-letter" not in kinds:  # the common case, counted per batch
            duplicates = outcomes.count(Outcome.DUPLICATE)
            self.stats.duplicates += duplicates
            self.stats.forwarded += len(outcomes) - duplicates
            return
        for kind, outcome in zip(kinds, outcomes):
            if outcome.value == "duplicate":
                self.stats.duplicates += 1
            elif kind == "dead-letter":
                self.stats.dead_lettered += 1
            else:
                self.stats.forwarded += 1

    def _out_message(self, held: _Held, seq: int) -> Tuple[str, OutMessage, str]:
        """(topic, message, "forward" | "dead-letter") for one due parked message. Its properties
        dict becomes the forward's (once per message: a forward is built once, and the dict is
        handed to the publisher as it is; see `_publish`)."""
        out = self._build_out(held, seq)
        held.out = out
        return out

    def _build_out(self, held: _Held, seq: int) -> Tuple[str, OutMessage, str]:
        msg, parked = held.msg, held.parked
        props = held.props
        base, level = props.pop(BASE_PROP, None), props.pop(LEVEL_PROP, None)  # they only served the forward time
        held.dropped_props = {n: v for n, v in ((BASE_PROP, base), (LEVEL_PROP, level)) if v is not None}
        props[ORIGIN_PARTITION_PROP] = self.topic
        props[ORIGIN_MSG_ID_PROP] = held.ref
        key = msg.partition_key() or None
        event_time = msg.event_timestamp() or None
        if self._decided and seq in self._decided:
            # Dead-lettered before a crash (the decision is durable, the ack was not): the same
            # letter again, which the dead-letter topic's de-duplication drops; never the target.
            letter = self._letter(held, OutMessage(msg.data(), seq, props, key, event_time), self._decided[seq])
            log.warning("event=delay_level_dead_letter_replayed partition=%s msg_id=%s", self.topic, held.ref)
            return self.policy.dead_letter_topic, letter, "dead-letter"
        if parked is None:
            reason = f"malformed parked message: {held.error}"
        elif self.policy.target_exists is not None and not self.policy.target_exists(parked.target):
            reason = f"business topic {parked.target} does not exist (deleted while the message was parked)"
        elif self.policy.target_refusal is not None:
            reason = self.policy.target_refusal(parked.target) or ""
        else:
            reason = ""
        if reason:
            for name, value in ((BASE_PROP, base), (LEVEL_PROP, level)):
                if value is not None:
                    props[name] = value  # kept for diagnosis
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
