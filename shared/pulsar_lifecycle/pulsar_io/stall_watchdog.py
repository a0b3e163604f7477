"""`StallWatchdog`: re-subscribes a consumer that sits idle while its topic holds more (pulsar-lite).

pulsar-lite keeps the permit deficit of a consumer that died (or was closed, or paused) holding
more messages than its receiver queue (a batch entry is dispatched whole), and counts it against
the whole subscription; it also re-dispatches all of a dead consumer's messages to the next one
in one round. So after a SIGKILL (or while another consumer of the subscription holds a large
entry) a consumer can stay idle while messages wait (docs/delay-levels.md, "Lateness after a
crash"). Each new consumer adds its queue to the subscription's permits, so re-subscribing
unblocks it.

Apache Pulsar drops a dead consumer with its permits, so there a consumer that has received
messages is never stalled and the check finds nothing to do. A consumer that has received nothing
since its start cannot tell a stall from a topic whose last message was acked before it started:
it is re-subscribed blind, at most BLIND_RESUBSCRIBES times, on either broker (both shown by
tests/integration/test_broker_quirks.py). The owner cannot know which broker it talks to, so the
watchdog runs on both: on Apache Pulsar it costs one get_last_message_id per idle check (backing
off to STALL_CHECK_MAX_S) and those blind re-subscriptions. Until something was received, an
owner-given `holds_messages` look (a Reader from the earliest message) comes first, and a topic
without messages is not asked: pulsar-lite answers it with an error the client logs.

Used by the delay-level forwarders and the bucket writer's direct intake. The owner calls
`seen()` for what it receives, `flowing()` when messages arrive, and `check()` only while idle
with nothing held and nothing unacked, so re-subscribing reorders or duplicates nothing.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Tuple

import pulsar

log = logging.getLogger(__name__)

# The first check comes at the first idle receive after messages flowed, then with a backoff from
# STALL_CHECK_S to STALL_CHECK_MAX_S; before anything was received the first check is BLIND_WAIT_S
# after the start, and at most BLIND_RESUBSCRIBES re-subscriptions are made blind.
STALL_CHECK_S = 0.5
BLIND_WAIT_S = 2.0
STALL_CHECK_MAX_S = 60.0
BLIND_RESUBSCRIBES = 3
MAX_RESUBSCRIBE_QUEUE = 10_000  # receiver queue cap of a re-subscribed consumer


class StallWatchdog:
    """Decides when an idle consumer is stalled and replaces it (see module docstring)."""

    def __init__(self, topic: str, resubscribe: Callable[[int], pulsar.Consumer], queue_size: int,
                 before_resubscribe: Optional[Callable[[], None]] = None, event: str = "consumer_resubscribed",
                 holds_messages: Optional[Callable[[], bool]] = None) -> None:
        """`holds_messages` (readers.HoldsMessages): before anything was received, whether the
        topic holds a message at all; the last message id is asked only then (None: always asked)."""
        self.topic = topic
        self._holds = holds_messages
        self._event = event  # the log event of a re-subscription (operators grep for it)
        self._resubscribe = resubscribe  # opens a consumer on the same subscription with this receiver queue
        self._before = before_resubscribe  # e.g. hand back what another consumer of the subscription holds
        self.queue_size = queue_size  # the current consumer's receiver queue
        self.last_seen: Optional[Tuple[int, int]] = None  # (ledger, entry) of the furthest message received
        self._interval = STALL_CHECK_S
        self._next_check = time.monotonic() + BLIND_WAIT_S
        self._blind = 0
        self.resubscribed = 0
        self._unanswered = 0  # non-blind re-subscriptions since messages last flowed

    def seen(self, ledger: int, entry: int) -> None:
        """A message at (ledger, entry) was received."""
        pos = (ledger, entry)
        if self.last_seen is None or pos > self.last_seen:
            self.last_seen = pos

    def flowing(self) -> None:
        """Messages arrive: check at the first idle receive (a stalled topic's head is due now)."""
        self._unanswered = 0
        self._interval = STALL_CHECK_S
        self._next_check = 0.0

    def check(self, consumer: pulsar.Consumer) -> Optional[pulsar.Consumer]:
        """While idle: a new consumer (the old one closed) if the topic holds messages beyond the
        last one received, else None."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._interval = min(STALL_CHECK_MAX_S, self._interval * 2)
        self._next_check = now + self._interval
        if self.last_seen is None and self._holds is not None and not self._holds():
            # Nothing received and nothing on the topic: pulsar-lite would answer the request
            # below with an error the client logs at ERROR and WARN, and there is nothing held.
            return None
        try:
            last = consumer.get_last_message_id()
            end: Optional[Tuple[int, int]] = (last.ledger_id(), last.entry_id())
        except pulsar.PulsarException:  # pulsar-lite answers an empty topic with an error
            end = None
        if end is None or end[0] < 0 or end[1] < 0:
            return None  # nothing on the topic
        blind = self.last_seen is None
        if self.last_seen is not None:
            if end <= self.last_seen:
                return None  # drained: the last message is one we received
        elif self._blind >= BLIND_RESUBSCRIBES:
            return None  # nothing received since start: maybe all acked before; stop guessing
        else:
            self._blind += 1
        if self._before is not None:
            self._before()
        # pulsar-lite takes a closed idle consumer's permits out of the total but leaves a dead
        # one's deficit in it: only a larger queue outweighs the deficit, so each attempt doubles it.
        self.queue_size = min(MAX_RESUBSCRIBE_QUEUE, 2 * self.queue_size)
        new = self._resubscribe(self.queue_size)
        self.resubscribed += 1
        # A blind look cannot tell a stall from acked messages, and one re-subscription clears a
        # pulsar-lite permit stall (a closed consumer's deficit: the runtime's input after the
        # writer started, a predecessor's): a stall that outlasts a re-subscription is the fault.
        again = not blind and self._unanswered > 0
        self._unanswered += 0 if blind else 1
        (log.warning if again else log.info)(
            "event=%s topic=%s last_seen=%s topic_end=%s queue=%d blind=%s again=%s reason='%s'",
            self._event, self.topic, self.last_seen, end, self.queue_size, str(blind).lower(), str(again).lower(),
            "nothing received since the start; the topic may hold only acked messages" if blind
            else "idle with messages beyond the last received (a pulsar-lite permit stall)")
        try:
            consumer.close()
        except pulsar.PulsarException as exc:  # the new consumer already reads the topic
            log.warning("event=consumer_close_failed topic=%s error=%r", self.topic, exc)
        return new
