"""Direct intake: the writer's own batch consumer of the scheduling topic.

The Python Functions runtime hands a function one message at a time through a queue of one
(python_instance.py), which caps any function at about 0.4 of a plain consume->produce pipe
(docs/benchmarks.md). With `schedulingTopic` set, the scheduling topic is not a function input;
the service subscribes to it through `context.get_pulsar_client()` (the runtime's own client)
and takes whole batches with `batch_receive`: a batch is classified, made durable in one journal
write and then acked, message by message, on the same consumer. The function's inputs are then
the tick topic, which wakes it after a restart, and optionally the scheduling topic itself, whose
first message starts a fresh deployment (the service closes the runtime's consumer of it before
this one subscribes: runtime_input.py).

A crash before the acks leaves the batch unacked on the subscription; it is redelivered and the
index drops what it already holds (duplicates by position), so nothing is lost or indexed twice.
The acks of a durable batch run on a thread of their own (acker.py), so the intake thread takes
the next batch meanwhile.

A stall watchdog (pulsar_lifecycle.pulsar_io.stall_watchdog) re-subscribes the consumer when it is idle
while the topic holds messages beyond the last one it received: on pulsar-lite a consumer killed
holding a batch entry larger than its queue leaves a permit deficit that can keep its successor
idle. It runs only between batches, when everything received is acked.

Messages a dead consumer of the subscription still holds (pulsar-lite keeps a reset
connection's consumers) never reach this one: `IntakeGaps` (intake_gaps.py) finds the gaps they
leave and reads them with a Reader, between batches. The consumer subscribes through
`subscribe_promptly`, so a consumer id the broker still holds for a dead process costs a retry
of ANSWER_S, not the client's operation timeout.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import pulsar

from ..bucket.records import DelayedMessage
from ..clock import wall_clock_ms
from ..pulsar_io import native_consumer
from ..pulsar_io.readers import HoldsMessages
from ..pulsar_io.stall_watchdog import StallWatchdog
from ..pulsar_io.subscribe import subscribe_promptly
from .acker import BackgroundAcker
from .intake import TargetCheck, classify
from .intake_gaps import Entry, IntakeGaps
from .service import IntakeBatch, Pending

log = logging.getLogger(__name__)

MAX_BATCH_BYTES = 16 * 1024 * 1024  # a bound for batch_receive besides the message count
IDLE_WAIT_MS = 200  # longest blocking receive while the topic is idle (stop is checked in between)
# Receiver queue: at least two default producer batch entries (1,000 messages each), so the broker
# sends the next entry while the intake works on one; a queue of one entry is refilled entry by
# entry (pulsar-lite: 20,000 messages in 1,000-message entries drained in 0.39 s with 2,000, 0.90 s
# with 1,000).
MIN_RECEIVER_QUEUE = 2000


@dataclass(frozen=True)
class SchedulingSubscription:
    """What the direct consumer subscribes to and how it classifies what it receives."""

    topic: str
    subscription: str
    batch_size: int
    batch_delay_ms: int
    max_delay_ms: int
    allowed_target_prefixes: Tuple[str, ...]
    target_check: Optional[TargetCheck] = None  # targetPermissionCheck (None: off)


class SchedulingConsumer:
    """An IntakeSource over a Shared batch consumer of the scheduling topic."""

    def __init__(self, client: pulsar.Client, sub: SchedulingSubscription, watchdog: bool = True,
                 gaps: Optional[IntakeGaps] = None) -> None:
        """`watchdog` False turns the stall watchdog off; `gaps` reads what a dead consumer of
        the subscription holds (None: not read)."""
        self.sub = sub
        self._client = client
        self.gaps = gaps
        queue = max(MIN_RECEIVER_QUEUE, 2 * sub.batch_size)
        self._consumer = self._subscribe(queue)
        self._acker = BackgroundAcker(f"bucket-ack-{sub.topic.rsplit('/', 1)[-1]}")
        # An idle topic that never held a message is not asked its end (readers.HoldsMessages).
        holds = gaps.holds if gaps is not None else HoldsMessages(client, sub.topic)
        self.watchdog: Optional[StallWatchdog] = StallWatchdog(
            sub.topic, self._subscribe, queue, holds_messages=holds) if watchdog else None

    def _subscribe(self, receiver_queue_size: int) -> pulsar.Consumer:
        # Shared like the runtime's own input consumers (and the only type pulsar-lite gets right);
        # Earliest so messages sent before the writer first ran are scheduled too.
        sub = self.sub
        consumer = subscribe_promptly(lambda: self._client.subscribe(
            sub.topic, sub.subscription,
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=receiver_queue_size,
            batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(sub.batch_size, MAX_BATCH_BYTES,
                                                                   max(1, sub.batch_delay_ms)),
        ), what=f"{sub.topic} ({sub.subscription})")
        log.info("event=scheduling_consumer_subscribed topic=%s subscription=%s batch_size=%d receiver_queue=%d",
                 sub.topic, sub.subscription, sub.batch_size, receiver_queue_size)
        return consumer

    def take(self) -> Optional[IntakeBatch]:
        """Up to batch_size messages (waiting batch_delay_ms to fill), or None when idle."""
        self._acker.raise_if_failed()
        consumer = self._consumer
        gaps = self.gaps
        if gaps is not None:
            # Between batches (everything received is durable by now): a gap, or a starved consumer.
            found = gaps.read_if_due(consumer, idle=False)
            if found is not None:
                return found
        # Through the native consumer where there is one (pulsar_lifecycle.pulsar_io.native_consumer): this
        # runs once per scheduling message on the intake thread; acks go through the public one.
        msgs = native_consumer.batch_receive(consumer)
        if not msgs:
            # Idle: block on one message instead of polling batch_receive every few ms.
            first = native_consumer.receive(consumer, IDLE_WAIT_MS)
            if first is None:
                if gaps is not None:
                    found = gaps.read_if_due(consumer, idle=True)
                    if found is not None:
                        return found
                    through = gaps.handled_through
                    if self.watchdog is not None and through is not None:
                        # Handled up to there (received, or read from a gap): nothing to wait for
                        # below it, so what a dead consumer holds there is no stall to re-subscribe for.
                        self.watchdog.seen(*through)
                # Idle, and once everything received is acked: the moment to look for a stall.
                if self.watchdog is not None and self._acker.idle:
                    new = self.watchdog.check(consumer)
                    if new is not None:
                        self._consumer = new
                return None
            msgs = [first]
        if gaps is not None and len(msgs) >= self.sub.batch_size:
            gaps.saturated()
        entries: List[Entry] = []
        adds, others = self._classify_all(msgs, wall_clock_ms(), entries)
        if self.watchdog is not None:
            self.watchdog.flowing()

        def ack() -> None:  # called once the batch is durable
            if gaps is not None:
                gaps.handled(entries)
            self._acker.submit(consumer, msgs)
        return IntakeBatch(others, ack, adds)

    def _classify_all(self, msgs: Sequence[Any], now: int,
                      entries: List[Entry]) -> Tuple[List[DelayedMessage], List[Pending]]:
        """A received batch classified: (its index items in order, its cancels and refusals in
        order, with their payload and properties). A plain loop with the lookups hoisted and no
        object per message beyond classify's own: it runs once per scheduling message. The
        watchdog sees the batch's furthest position; `entries` gets the batch's entries (ledger,
        entry) in the order they came."""
        sub = self.sub
        max_delay_ms, prefixes, target_check = sub.max_delay_ms, sub.allowed_target_prefixes, sub.target_check
        adds: List[DelayedMessage] = []
        others: List[Pending] = []
        add = adds.append
        last_ledger = last_entry = -1
        for msg in msgs:
            props = msg.properties()
            payload = msg.data()
            mid = msg.message_id()
            ledger, entry = mid.ledger_id(), mid.entry_id()  # each accessor is a call into the client
            if entry != last_entry or ledger != last_ledger:  # a batch entry's messages come together
                last_ledger, last_entry = ledger, entry
                entries.append((ledger, entry))
            item = classify(
                payload=payload, properties=props, key=msg.partition_key() or None,
                event_time=msg.event_timestamp(),
                position=(ledger, entry, mid.partition(), mid.batch_index()),
                now_ms=now, max_delay_ms=max_delay_ms, allowed_target_prefixes=prefixes, target_check=target_check,
            )
            if type(item) is DelayedMessage:
                add(item)
            else:
                others.append(Pending(item, None, payload, props))
        if self.watchdog is not None and entries:
            # Every message's (ledger, entry) is in `entries`: their maximum is the furthest.
            self.watchdog.seen(*max(entries))  # it keeps the furthest position seen
        return adds, others

    def close(self) -> None:
        """Ack what was handed to the acker, then close the consumer; what it received but did not
        ack is redelivered."""
        self._acker.close()
        if self.gaps is not None:
            self.gaps.close()
        try:
            self._consumer.close()
        except Exception as exc:  # closing during a broker outage must not hide the real error
            log.warning("event=scheduling_consumer_close_failed topic=%s error=%r", self.sub.topic, exc)

