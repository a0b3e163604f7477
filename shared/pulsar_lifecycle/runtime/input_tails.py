"""Input tail reads of the local runner: what a dead consumer holds is read with a Reader.

pulsar-lite keeps the consumers of a connection that ended with a reset (a process SIGKILLed
with unread data on its socket) until it restarts, with every message dispatched to them; a
successor on the same Shared subscription never receives those (docs/operations.md, "pulsar-lite
0.2.0"). Apache Pulsar hands them to the next consumer at once, and there this reads nothing new.

Per input topic of one runner (all its instances), `InputTail` tracks the positions it handled
above a *floor*: a position at and below which every message of the topic was acked through this
subscription (kept in `<data-dir>/input-floors/`, so a restarted runner starts from its
predecessor's). While no message arrived for IDLE_S and the topic's last message lies beyond the
floor, a Reader reads from the floor to the end; a message no consumer of this runner received is
handed to an instance's process() like a received one and acked through the subscription (an ack
of a message id the consumer never received acks it on pulsar-lite too). The copy the broker hands
out later is a handled position: acked, not processed again. The floor moves over a read prefix
once all of it is acked; a nacked message stops it and is left to the broker's redelivery.

Without a floor file (a first run) the floor is the topic's end at the start (or, for a topic
empty then, at its first idle check with everything received acked): what a dead consumer held
before that stays with it. Not for topics addressed as partitioned (their messages carry a
partition): those are left alone. Off where the runner runs a share of a function's instances
(another process's messages would look held).
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pulsar

from ..pulsar_io.readers import HoldsMessages

log = logging.getLogger(__name__)

Pos = Tuple[int, int, int]  # (ledger, entry, batch index); -1 batch index for an unbatched entry
IDLE_S = 2.0  # no message for this long before the end is compared with the floor
CHECK_MAX_S = 30.0  # the check interval backs off to this while the floor is at the end
READ_WAIT_MS = 500  # a Reader that gives nothing for this long has read all there is
END_WAIT_MS = 50  # once the measured last entry is reached
READ_CAP = 2000  # messages handed out per pass (the next check reads on)

_INFLIGHT, _ACKED, _NACKED = 0, 1, 2


def position(mid: Any) -> Pos:
    """(ledger, entry, batch index) of a message id."""
    return (mid.ledger_id(), mid.entry_id(), mid.batch_index())


def after(pos: Pos, floor: Pos) -> bool:
    """`pos` lies beyond `floor`; a floor without a batch index covers its whole entry."""
    return pos[:2] > floor[:2] if floor[2] < 0 else pos > floor


class TrackedConsumer:
    """A consumer whose acks and nacks are reported to its topic's `InputTail` (the runtime's,
    the context's and the function's acks all go through it)."""

    def __init__(self, consumer: pulsar.Consumer, tail: "InputTail") -> None:
        self._consumer = consumer
        self._tail = tail

    def acknowledge(self, message: Any) -> None:
        """Ack a message or message id and mark its position acked."""
        mid = message.message_id() if hasattr(message, "message_id") else message
        self._consumer.acknowledge(mid)  # a Reader's message id acks through the subscription
        self._tail.acked(position(mid))

    def acknowledge_cumulative(self, message: Any) -> None:
        """Cumulative ack (EFFECTIVELY_ONCE): the position is acked."""
        self._consumer.acknowledge_cumulative(message)
        mid = message.message_id() if hasattr(message, "message_id") else message
        self._tail.acked(position(mid))

    def negative_acknowledge(self, message: Any) -> None:
        """Nack: the floor stops below it and the broker's redelivery brings it back."""
        self._consumer.negative_acknowledge(message)
        mid = message.message_id() if hasattr(message, "message_id") else message
        self._tail.nacked(position(mid))

    def close(self) -> None:
        """Close the consumer; its topic's tail reads stop with its last consumer (a function that
        closes a runtime input, as the bucket writer does, takes that topic over)."""
        self._tail.remove_consumer(self)
        self._consumer.close()

    @property
    def tail_topic(self) -> str:
        """The input topic this consumer reads."""
        return self._tail.topic

    def tail_received(self, mid: Any) -> str:
        """What the topic's tail says about a received message (InputTail.received)."""
        return self._tail.received(mid)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class InputTail:
    """One input topic of a runner: handled positions, the floor and the tail reads."""

    def __init__(self, client: pulsar.Client, topic: str, floors: "InputFloors", start_floor: Optional[Pos]) -> None:
        self.topic = topic
        self._client = client
        self._floors = floors
        self._lock = threading.Lock()
        self._handled: Dict[Pos, int] = {}
        self.floor: Optional[Pos] = start_floor  # None: not known yet (set at the first idle check)
        self._last_activity = time.monotonic()
        self._interval = IDLE_S
        self._next_check = time.monotonic() + IDLE_S
        self._feeds: List[Tuple[TrackedConsumer, Callable[[pulsar.Message, TrackedConsumer], None]]] = []
        self.partitioned = False
        self.read_total = 0
        # Asked for its last message id only once known to hold one (pulsar-lite logs an ERROR and
        # a WARN for an empty topic's request: readers.HoldsMessages).
        self._holds = HoldsMessages(client, topic, found=start_floor is not None)

    def add_consumer(self, consumer: TrackedConsumer, feed: Callable[[pulsar.Message, TrackedConsumer], None]) -> None:
        """An instance's consumer of this topic, and how to hand it a message read by a Reader."""
        self._feeds.append((consumer, feed))

    def remove_consumer(self, consumer: TrackedConsumer) -> None:
        """A consumer of this topic was closed: nothing more is handed to it."""
        with self._lock:
            self._feeds = [(c, f) for c, f in self._feeds if c is not consumer]

    def received(self, mid: Any) -> str:
        """A consumer received `mid`: "new" (process it), or "inflight" / "acked" for a copy of a
        handled one (a Reader's copy is being processed, or was acked)."""
        if mid.partition() >= 0:
            self.partitioned = True
        pos = position(mid)
        with self._lock:
            self._last_activity = time.monotonic()
            self._interval = IDLE_S
            self._holds.found = True
            state = self._handled.get(pos)
            if state == _INFLIGHT:
                return "inflight"
            if state == _ACKED:
                return "acked"
            self._handled[pos] = _INFLIGHT
            return "new"

    def acked(self, pos: Pos) -> None:
        """`pos` was acked through the subscription."""
        with self._lock:
            if pos in self._handled or self.floor is None or after(pos, self.floor):
                self._handled[pos] = _ACKED

    def nacked(self, pos: Pos) -> None:
        """`pos` was nacked: the broker redelivers it to a live consumer."""
        with self._lock:
            self._handled[pos] = _NACKED

    def check(self, now: float) -> None:
        """Read the tail if the topic was idle for IDLE_S with its end beyond the floor."""
        with self._lock:
            if now < self._next_check or now - self._last_activity < IDLE_S or not self._feeds or self.partitioned:
                return
            floor = self.floor
        feeds = self._feeds
        if not feeds:
            return
        if not self._holds():
            self._backoff(now)
            return
        try:
            end = feeds[0][0].get_last_message_id()
        except pulsar.PulsarException:
            end = None  # an empty topic (pulsar-lite: UnknownError): nothing to read
        if end is None or end.ledger_id() < 0:
            self._backoff(now)
            return
        if floor is None:
            self._first_floor((end.ledger_id(), end.entry_id(), -1), now)
            return
        if (end.ledger_id(), end.entry_id()) < floor[:2] or \
                ((end.ledger_id(), end.entry_id()) == floor[:2] and floor[2] < 0):
            self._backoff(now)
            return
        self._read(floor, (end.ledger_id(), end.entry_id()))

    def _first_floor(self, end: Pos, now: float) -> None:
        """No floor was kept (a first run): the topic's end, once nothing received is unacked
        (what a dead consumer held before this stays with it)."""
        with self._lock:
            if any(s != _ACKED for s in self._handled.values()):
                self._next_check = now + IDLE_S
                return
            self.floor = end
            self._handled = {p: s for p, s in self._handled.items() if after(p, end)}
        self._floors.save(self.topic, end)
        log.info("event=input_tail_floor_set topic=%s floor=%s", self.topic, end)

    def _backoff(self, now: float) -> None:
        with self._lock:
            self._next_check = now + self._interval
            self._interval = min(self._interval * 2, CHECK_MAX_S)

    def _read(self, floor: Pos, end: Tuple[int, int]) -> None:
        started = time.monotonic()
        start = pulsar.MessageId(-1, *floor)
        reader = self._client.create_reader(self.topic, start)
        fed, seen, new_floor, contiguous = 0, 0, floor, True
        wait_ms = READ_WAIT_MS
        try:
            while seen < READ_CAP:
                try:
                    msg = reader.read_next(timeout_millis=wait_ms)
                except pulsar.Timeout:
                    break
                pos = position(msg.message_id())
                if pos[:2] >= end:
                    wait_ms = END_WAIT_MS  # in the last entry: the rest of its batch comes at once
                if not after(pos, floor):
                    continue
                seen += 1
                with self._lock:
                    state = self._handled.get(pos)
                    if state is None:
                        self._handled[pos] = _INFLIGHT
                    if contiguous and state == _ACKED:
                        new_floor = pos
                    else:
                        contiguous = False
                if state is None:
                    feeds = self._feeds
                    if not feeds:
                        break  # the input was closed meanwhile
                    consumer, feed = feeds[fed % len(feeds)]
                    feed(msg, consumer)
                    fed += 1
        finally:
            reader.close()
        self.read_total += fed
        with self._lock:
            if new_floor != floor:
                self.floor = new_floor
                for pos in [p for p in self._handled if p <= new_floor]:
                    del self._handled[pos]
            self._next_check = time.monotonic() + (0 if fed or new_floor != floor else self._interval)
            if not fed and new_floor == floor:
                self._interval = min(self._interval * 2, CHECK_MAX_S)
        if new_floor != floor:
            self._floors.save(self.topic, new_floor)
        if fed:
            log.warning("event=input_tail_read topic=%s floor=%s read=%d handed=%d seconds=%.2f reason='messages "
                        "after the floor no consumer of this runner received (a dead consumer holds them on "
                        "pulsar-lite): read with a Reader'", self.topic, floor, seen, fed, time.monotonic() - started)
        else:
            log.debug("event=input_tail_read topic=%s floor=%s new_floor=%s read=%d handed=0", self.topic, floor,
                      new_floor, seen)


def _end_now(client: pulsar.Client, topic: str, consumer: pulsar.Consumer) -> Optional[Pos]:
    """The topic's last entry, or None when not known (empty: asking would log an ERROR on
    pulsar-lite; or its first message came slowly): the first idle check sets it then."""
    if not HoldsMessages(client, topic)():
        return None
    try:
        end = consumer.get_last_message_id()
    except pulsar.PulsarException:
        return None
    if end.ledger_id() < 0:
        return None
    return (end.ledger_id(), end.entry_id(), -1)  # the whole last entry


class InputFloors:
    """The floors of one function's subscription, one small JSON file under the data dir."""

    def __init__(self, data_dir: Path, fqfn: str, subscription: str) -> None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{fqfn}.{subscription}")
        self.path = data_dir / "input-floors" / f"{name}.json"
        self._lock = threading.Lock()
        try:
            self._floors: Dict[str, Pos] = {t: tuple(p) for t, p in json.loads(self.path.read_text()).items()}  # type: ignore[misc]
        except FileNotFoundError:
            self._floors = {}
        except (ValueError, TypeError) as exc:
            log.warning("event=input_floors_unreadable path=%s error=%r", self.path, exc)
            self._floors = {}

    def get(self, topic: str) -> Optional[Pos]:
        """The floor kept for `topic` (None: never kept)."""
        return self._floors.get(topic)

    def save(self, topic: str, floor: Pos) -> None:
        """Keep `floor` for `topic` (written atomically)."""
        with self._lock:
            self._floors[topic] = floor
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({t: list(p) for t, p in self._floors.items()}))
            os.replace(tmp, self.path)


class InputTails:
    """The input tails of one runner and the thread that checks them."""

    def __init__(self, client: pulsar.Client, data_dir: Path, fqfn: str, subscription: str) -> None:
        self._client = client
        self._floors = InputFloors(data_dir, fqfn, subscription)
        self._tails: Dict[str, InputTail] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def tail(self, topic: str, consumer: pulsar.Consumer) -> InputTail:
        """The tail of `topic`, created at its first subscription (`consumer`'s): its floor is the
        kept one, else the topic's end now."""
        with self._lock:
            if topic not in self._tails:
                floor = self._floors.get(topic)
                if floor is None:
                    floor = _end_now(self._client, topic, consumer)
                    if floor is not None:
                        self._floors.save(topic, floor)
                self._tails[topic] = InputTail(self._client, topic, self._floors, floor)
            return self._tails[topic]

    def start(self) -> None:
        """Start the checking thread."""
        self._thread = threading.Thread(target=self._run, name="localrun-input-tails", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for tail in list(self._tails.values()):
                try:
                    tail.check(time.monotonic())
                except Exception as exc:  # a broker hiccup: the next check tries again
                    log.warning("event=input_tail_check_failed topic=%s error=%r", tail.topic, exc)

    def stop(self) -> None:
        """Stop the checking thread (before the instances close their consumers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
