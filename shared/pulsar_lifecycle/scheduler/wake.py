"""How BucketSnapshotWriter starts by itself and wakes after a restart (docs/architecture.md, "Clock").

Pulsar's Python runtime has no init hook or timer: an instance does nothing until a message of
one of its inputs arrives. The release thread (service.py) is the writer's clock once it runs;
this module only makes sure something calls process() after every start:

* the scheduling topic is an input (besides direct intake's own batch consumer on the same
  subscription), so the first scheduling message starts a fresh deployment;
* at each service start the writer sends one wake tick to `tickTopic` and keeps exactly one tick
  unacked (`WakeTickHolder`). Pulsar redelivers an unacked message to the next consumer of the
  subscription, so after a restart the held tick calls process() at once, with an idle
  scheduling topic and without deliver_after (which some brokers ignore);
* every other tick is acked when it arrives: extra or duplicated ticks never multiply, and
  nothing runs away on a broker that ignores deliver_after;
* with several instances (`TickPasser`), an instance that already holds its tick passes an extra
  one on instead of dropping it: the tick a dead sibling held is redelivered to a live sibling
  (Pulsar hands an unacked message to the next consumer with permits, and the moved instance
  subscribes only once a worker restarted it), and dropped there it would leave the restarted
  sibling without the one message that calls its process(). Passing on = acking it after sending
  a fresh tick `tickTimeMillis` later, which the broker gives to any instance with room, the
  restarted one included; each instance passes on at most one tick per sibling at a time (every
  further extra is acked) and a tick is passed on for `PASS_ON_SECONDS` from when it was first
  passed, so the ticks in flight stay bounded and die out;
* when the service fails (disk full, a failed release send) it sends one tick after
  tickTimeMillis (`wake_after_failure`), whose arrival calls process(), which rebuilds it: at
  most one rebuild per tickTimeMillis while the failure lasts, without deliver_after.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional, Tuple

from ..clock import wall_clock_ms
from ..scheduling_protocol import TICK_PROP

log = logging.getLogger(__name__)


Position = Tuple[int, int, int, int]  # (ledger, entry, partition, batch index) of a tick


class WakeTickHolder:
    """Decides per received tick: hold it unacked (the one wake-up token) or ack it (extra)."""

    def __init__(self) -> None:
        self._held: Optional[Position] = None

    @property
    def held(self) -> Optional[Position]:
        """The position of the tick kept unacked, if any."""
        return self._held

    def on_tick(self, position: Position) -> bool:
        """True: keep this tick unacked (the first one seen, or its redelivery); False: ack it."""
        if self._held is None or self._held == position:
            self._held = position
            return True
        return False


# How long an extra tick keeps being passed on between the instances: it must outlast the time a
# lost instance takes to be started again elsewhere (the workers' rescheduleTimeoutMs plus the
# instance's start; docs/scaling.md).
PASS_ON_SECONDS = 300
# On a passed-on tick: when it was first passed on (ms), so the hops end PASS_ON_SECONDS later.
PASS_SINCE_PROP = "__pl_tick_passed_since__"


class TickPasser:
    """Passes extra ticks on between the instances of a writer with several (module docstring)."""

    def __init__(self, window_s: float = PASS_ON_SECONDS) -> None:
        self.window_ms = int(window_s * 1000)
        self._lock = threading.Lock()
        self._passing = 0

    def pass_on(self, client: Any, tick_topic: str, properties: Any, ack: Any, delay_ms: int,
                limit: int = 1, now_ms: Optional[int] = None) -> bool:
        """Send a fresh tick after `delay_ms`, then call `ack` (of the extra tick); False (nothing
        done: the caller acks at once) while this instance passes `limit` others on (one per
        sibling that may be starting again), or once the tick has been passed on for the whole
        window."""
        now = wall_clock_ms() if now_ms is None else now_ms
        try:
            since = int((properties or {}).get(PASS_SINCE_PROP) or now)
        except ValueError:
            since = now
        if now - since >= self.window_ms:
            log.info("event=tick_pass_on_ended topic=%s passed_for_ms=%d", tick_topic, now - since)
            return False
        with self._lock:
            if self._passing >= limit:
                log.debug("event=tick_extra_acked topic=%s reason=passing_others_on passing=%d", tick_topic,
                         self._passing)
                return False
            self._passing += 1
        if since == now:
            log.info("event=tick_pass_on_started topic=%s delay_ms=%d", tick_topic, delay_ms)

        def fire() -> None:
            # Free before the send: the fresh tick may come straight back to this instance, and
            # must then be passed on again, not dropped as a second one.
            with self._lock:
                self._passing -= 1
            try:
                producer = client.create_producer(tick_topic, batching_enabled=False)
                try:
                    producer.send(b"tick", properties={TICK_PROP: str(wall_clock_ms()), PASS_SINCE_PROP: str(since)})
                finally:
                    producer.close()
                ack()
            except Exception as exc:  # not acked: the broker redelivers the extra tick later
                log.warning("event=tick_pass_on_failed topic=%s error=%r", tick_topic, exc)

        timer = threading.Timer(max(0, delay_ms) / 1000.0, fire)
        timer.daemon = True
        timer.start()
        return True


class WakeTicks:
    """What the writer does with each tick: hold one (WakeTickHolder), ack the others, passing
    them on first (TickPasser) when the function has `instances` > 1."""

    def __init__(self, window_s: float = PASS_ON_SECONDS) -> None:
        self.holder = WakeTickHolder()
        self.passer = TickPasser(window_s)

    @property
    def held(self) -> Optional[Position]:
        """The position of the tick kept unacked, if any."""
        return self.holder.held

    def on_tick(self, position: Position, properties: Any, ack: Any, *, client: Any, tick_topic: str,
                delay_ms: int, instances: int) -> bool:
        """True when this tick is the one held (unacked); otherwise it is acked, now or once passed on."""
        if self.holder.on_tick(position):
            return True
        if instances < 2 or not self.passer.pass_on(client, tick_topic, properties, ack, delay_ms,
                                                    limit=instances - 1):
            ack()
        return False


def position_of(message_id: Any) -> Position:
    """(ledger, entry, partition, batch index) of a pulsar.MessageId."""
    return (int(message_id.ledger_id()), int(message_id.entry_id()), int(message_id.partition()),
            int(message_id.batch_index()))


def send_wake_tick(client: Any, tick_topic: str) -> None:
    """Send one tick and wait for the broker's receipt: from then on a restart finds a tick to
    redeliver (the held one, or this one), before anything of this start is acked."""
    producer = client.create_producer(tick_topic, batching_enabled=False)
    try:
        producer.send(b"tick", properties={TICK_PROP: str(wall_clock_ms())})
    finally:
        producer.close()
    log.info("event=wake_tick_sent topic=%s", tick_topic)


def send_start_ticks(client: Any, tick_topic: str, count: int, interval_s: float = 0.2) -> int:
    """Send `count` ticks, each confirmed by the broker, `interval_s` apart: what starts the
    instances of a writer whose only input is the tick topic (a partitioned writer on a cluster).

    Spacing them lets each instance's queue-of-one consumer take one before the next is sent;
    a tick beyond the one an instance holds is acked by it, so extra ticks are harmless.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    producer = client.create_producer(tick_topic, batching_enabled=False)
    try:
        for i in range(count):
            if i:
                time.sleep(interval_s)
            producer.send(b"tick", properties={TICK_PROP: str(wall_clock_ms())})
    finally:
        producer.close()
    log.info("event=start_ticks_sent topic=%s count=%d", tick_topic, count)
    return count


def wake_after_failure(client: Any, tick_topic: str, delay_ms: int) -> None:
    """Send one tick `delay_ms` from now, from a daemon timer (the failed service's threads are
    ending; the tick's arrival calls process(), which rebuilds the service)."""
    def fire() -> None:
        try:
            send_wake_tick(client, tick_topic)
        except Exception as exc:  # the next message or restart still wakes it
            log.warning("event=wake_tick_failed topic=%s error=%r", tick_topic, exc)
    timer = threading.Timer(max(0, delay_ms) / 1000.0, fire)
    timer.daemon = True
    timer.start()


def arm_wake(service: Any, client: Any, tick_topic: str, tick_time_millis: int) -> None:
    """At a service start: send its wake tick and have a failure send one after tickTimeMillis
    (`service.on_failure`). If the send fails the service is stopped and the error raised: the
    message being processed is redelivered and the next call starts again."""
    if not tick_topic:
        return
    try:
        send_wake_tick(client, tick_topic)
    except BaseException:
        service.stop()
        raise
    service.on_failure = lambda: wake_after_failure(client, tick_topic, tick_time_millis)
