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
* every other tick is acked when it arrives: extra or duplicated ticks never multiply, and no
  tick is ever re-sent by a tick, so nothing runs away on a broker that ignores deliver_after;
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
