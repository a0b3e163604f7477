"""`IntakeGaps`: scheduling messages the writer's consumer is not given, read with a Reader.

A writer killed while its direct consumer held received, unacked messages leaves them with that
consumer. Apache Pulsar drops a closed connection's consumers and redelivers their messages to
the next consumer at once. pulsar-lite does so after a clean close, but when the connection
ended with a reset (a process SIGKILLed with unread data on its socket) it keeps the consumer
registered until the broker restarts, with everything dispatched to it: no re-subscription,
seek or redelivery request of another consumer brings those messages back (each is refused or
ignored: tests/integration/test_broker_quirks.py). Such a consumer also keeps its permits, so
the broker goes on choosing it for new messages, which then wait in its replay queue: the live
consumer gets a trickle of entries, out of order. A Reader reads all of them: it has a cursor of
its own.

So the direct consumer keeps track of which entries of the scheduling topic are handled (made
durable; the broker dispatches an entry whole) above a *floor*, and reads what it lacks:

* the floor is the last entry the index holds an item of when the service starts (or, when an
  earlier start left a gap unresolved, where that gap began: kept in the function state with the
  index id, `intake/unresolved`). What the previous process received and had not made durable
  lies above it; what it had made durable is in the index (`was_added`).
* a gap is the floor entry and what follows it until it is proven complete (at every start), and
  any entries below one received later (a hole). A hole still open HOLE_GRACE_S later is read,
  between batches, from the frontier to the entry that ends it (Apache Pulsar may hand a dead
  consumer's messages over just after later ones, and fills such a hole within milliseconds).
* every CHECK_MIN_S (backing off to CHECK_MAX_S while caught up) the topic's last entry is looked
  at. Beyond the frontier while the consumer is idle: read up to it. Beyond it while the
  consumer is starved (only partial batches, and what it delivered is not yet at the end the
  topic had LAG_S ago): a Reader *follows* the topic from the frontier, and between batches
  whatever it has is indexed, until the consumer catches up again (on pulsar-lite with dead
  consumers: until the writer restarts).
* every message read that the index has not seen becomes part of an intake batch: delayed
  messages are indexed, cancels applied (both idempotent). Their source messages cannot be acked
  (a dead consumer holds them, or the broker has not dispatched them): they stay on the
  subscription and are acked as duplicates when the broker hands them out (pulsar-lite: a dead
  consumer's after a broker restart). Refused (invalid) messages are left to the subscription
  (sending them to `-INVALID` again could duplicate one the previous process had sent).

A new index (nothing added, nothing handled) gets a floor at its first start, before its consumer
receives anything: the topic's last entry then, kept with the index id (`intake/start`), or the
topic's beginning when it held no message (a Reader from the earliest message got none within
START_LOOK_S: an empty topic is not asked its end, pulsar-lite logs an ERROR and a WARN for that).
Never the earliest message of a topic that holds some: what lies there may have been acked for
another index, and reading it would index it again; a Reader of this index never reads at or
below that start entry. So a new index killed before its first durable batch has what it was
handed after its start read at its restart. What was on the topic before the index first started
and is held by a dead consumer still waits for the broker (pulsar-lite: until it restarts).
A partitioned writer keeps this per partition, in the state of the partition's one owner (its
lease), under the partition's index id.

Only for a writer whose index is the sole one fed by the subscription: with several
non-partitioned instances on one subscription, the others' messages would look like gaps. On Apache Pulsar
the reads find nothing (the broker redelivered everything already, and its consumer is not
starved); they cost one Reader per start and per ledger change of the topic.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Iterable, List, Optional, Sequence, Set, Tuple

import pulsar

from ..bucket.positions import encode
from ..clock import wall_clock_ms
from ..pulsar_io.readers import HoldsMessages, close_quietly, reader_at
from ..topics import TopicName
from .intake import Invalid, TargetCheck, classify
from .service import IntakeBatch, Pending

log = logging.getLogger(__name__)

Entry = Tuple[int, int]  # (ledger id, entry id) of the scheduling topic

STATE_KEY = "intake/unresolved"
# The entry through which everything was handled, kept when it is beyond the index's last added
# entry (the last entries were cancels or refusals, which add nothing): without it every start
# read those again from the index's last entry and applied them again.
HANDLED_KEY = "intake/handled"
# A new index's floor, taken at its first start before anything was received: the topic's last
# entry then (nothing at or below it is read by a Reader), or EMPTY for a topic without messages.
START_KEY = "intake/start"
EMPTY: Entry = (-1, -1)  # below every entry: the topic held no message when the index started
START_LOOK_S = 1.0  # a Reader from the earliest message that gets none this long: the topic is empty
CHECK_MIN_S, CHECK_MAX_S = 0.25, 5.0  # between looks at the topic's end (backing off while caught up)
LAG_S = 0.5  # not at the end the topic had this long ago, without a full batch since: starved
# A consumer starved this long is not a slow moment (a busy host delays a first delivery past
# LAG_S) but one the broker does not feed: the follower's start is logged as info, this as a warning.
STARVED_WARN_S = 10.0
IN_FLIGHT_MS = 5000  # a gap read's messages published this recently are in flight, not held
HOLE_GRACE_S = 0.25  # a hole open this long is read (Apache Pulsar fills one by redelivery within ms)
RETRY_MIN_S, RETRY_MAX_S = 0.5, 30.0  # after a read that stalled
READ_TIMEOUT_MS = 1000  # a Reader that gets nothing this long before the gap's end has stalled
FOLLOW_WAIT_MS = 5  # between batches the follower gives what it has, waiting at most this for more
MAX_READ = 20_000  # messages per gap read (the rest is read next time)


class IntakeFrontier:
    """Which entries of the scheduling topic are handled, above a floor. Pure (no I/O).

    `frontier`: every entry up to it is handled, its own entry included once `start_open` is
    False (at a start the floor entry may be only partly in the index). `holes`: handled entries
    beyond a gap."""

    def __init__(self, floor: Optional[Entry]) -> None:
        self.frontier = floor
        self.start_open = floor is not None
        self._above: Set[Entry] = set()

    @property
    def unresolved(self) -> bool:
        """True while a gap is open: the start gap, or a hole below a handled entry."""
        return self.start_open or bool(self._above)

    @property
    def holes(self) -> bool:
        """True when handled entries lie beyond a gap (read it now)."""
        return bool(self._above)

    def handled(self, entries: Iterable[Entry]) -> None:
        """Entries received and made durable (a batch may hold part of an entry: the broker
        dispatches an entry whole, so the rest follows in the next batch of the same consumer)."""
        f = self.frontier
        if f is None:
            return
        for e in entries:
            if e <= f:
                if e == f:
                    self.start_open = False  # the floor entry itself came: it is complete
                continue
            self._above.add(e)
        self._advance()

    def gap(self) -> Optional[Tuple[Entry, Optional[Entry]]]:
        """(first entry to read, inclusive; the handled entry that ends the gap, or None for the
        topic's end), or None when no gap is open."""
        if self.frontier is None or not self.unresolved:
            return None
        return self.frontier, (min(self._above) if self._above else None)

    def read_up_to(self, last: Entry, reached: bool) -> None:
        """A Reader read every message from the gap's first entry: through entry `last`
        (`reached` False), or up to the handled entry `last` that ends the gap (`reached`)."""
        f = self.frontier
        if f is None or last < f:
            return
        self.start_open = False
        if reached:
            self._above.discard(last)
        self.frontier = last
        self._above = {e for e in self._above if e > last}
        self._advance()

    def _advance(self) -> None:
        f = self.frontier
        if f is None or self.start_open:
            return
        while self._above:
            nxt = (f[0], f[1] + 1)  # the next entry of the same ledger; a new ledger needs a Reader
            if nxt not in self._above:
                break
            self._above.discard(nxt)
            f = nxt
        self.frontier = f


@dataclass(frozen=True)
class GapClassifier:
    """How a read message is classified: the direct consumer's own rules."""

    max_delay_ms: int
    allowed_target_prefixes: Tuple[str, ...]
    target_check: Optional[TargetCheck] = None  # targetPermissionCheck (None: off)


class IntakeGaps:
    """Reads what the direct consumer of one scheduling topic (partition) lacks; see the module
    docstring."""

    def __init__(self, client: pulsar.Client, topic: str, engine: Any, state: Any, index_id: str,
                 rules: GapClassifier) -> None:
        self.topic = topic
        self._client = client
        self._engine = engine
        self._state = state
        self._index_id = index_id
        self._rules = rules
        self._partition = TopicName.from_client(topic).partition_index
        floor = engine.last_added_entry()
        handled = self._kept(HANDLED_KEY)
        complete = handled is not None and (floor is None or handled > floor)
        if complete:
            floor = handled  # every entry up to it, its own included, is handled
        kept = self._kept()
        if floor is not None and kept is not None and kept < floor:
            floor, complete = kept, False
        start = self._kept(START_KEY)
        if floor is None and start is not None:
            floor, complete = start, True  # a new index killed before its first durable batch
        # The start entry bounds every read from below while the floor is still there (module docstring).
        self._start: Optional[Entry] = start if start is not None and floor == start else None
        # Asked before a topic that may be empty is asked its end; shared with the stall watchdog.
        self.holds = HoldsMessages(client, topic, found=floor is not None and floor != EMPTY)
        # A new index: whether the topic is empty is looked at here, before the consumer subscribes
        # (a message that comes later is above the floor); its end is asked before the first receive.
        self._start_due = floor is None
        if self._start_due:
            self.holds.found = HoldsMessages(client, topic, wait_s=START_LOOK_S)()
        self.frontier = IntakeFrontier(floor)
        if complete:
            self.frontier.start_open = False
        self._persisted: Optional[Entry] = kept
        self._persisted_handled: Optional[Entry] = handled
        self._next_check = time.monotonic() + CHECK_MIN_S
        self._check_s = CHECK_MIN_S
        self._ends: Deque[Tuple[float, Entry]] = deque()  # (when, the topic's last entry then)
        self._last_full = 0.0  # when the consumer last gave a full batch
        self._delivered: Optional[Entry] = None  # the furthest entry the consumer itself delivered
        self._retry_s = RETRY_MIN_S
        self._retry_at = 0.0
        self._hole_since: Optional[float] = None  # when the open hole was first seen
        self._follower: Any = None  # a Reader following the topic while the consumer is starved
        self._follow_entry: Optional[Entry] = None  # the entry the follower is in
        self._follow_read_at = 0.0  # when the follower last gave a message
        self._starved_since: Optional[float] = None  # when this starvation's first follower started
        self._starved_warned = False
        self.reads = 0
        self.found = 0
        if floor is not None:
            self._persist()
            log.info("event=intake_gaps_floor topic=%s floor=%s kept=%s", topic, floor, kept)

    # -- the function state: where an unresolved gap began, with the index it belongs to ---------
    def _kept(self, key: str = STATE_KEY) -> Optional[Entry]:
        try:
            raw = self._state.get(key)
        except Exception as exc:  # without it the floor is the index's last entry
            log.warning("event=intake_gaps_state_unreadable topic=%s error=%r", self.topic, exc)
            return None
        parts = (raw or b"").decode("ascii", "replace").split()
        if len(parts) != 2 or parts[0] != self._index_id:
            return None  # none, or another index's (a replaced index must not read old positions)
        ledger, _, entry = parts[1].partition(":")
        try:
            return int(ledger), int(entry)
        except ValueError:
            return None

    def _persist(self) -> None:
        self._persist_handled()
        want = self.frontier.frontier if self.frontier.unresolved else None
        if want == self._persisted:
            return
        value = f"{self._index_id} {want[0]}:{want[1]}" if want is not None else ""
        try:
            self._state.put(STATE_KEY, value.encode("ascii"))
            self._persisted = want
        except Exception as exc:  # the next change writes it again; a restart reads from a lower floor
            log.warning("event=intake_gaps_state_write_failed topic=%s error=%r", self.topic, exc)

    def _persist_handled(self) -> None:
        """Keep the frontier when everything up to it is handled and it lies beyond the index's last
        added entry (a state write only after a batch that ends in cancels or refusals)."""
        f = self.frontier.frontier
        if f is None:
            # No floor (a new index) tracks no gaps: the furthest entry delivered is as good a
            # floor for the next start as the index's last added entry, which is one too.
            f = self._delivered
        elif self.frontier.unresolved:
            return
        if f is None or f == self._persisted_handled:
            return
        last = self._engine.last_added_entry()
        if last is not None and f <= last:
            return
        try:
            self._state.put(HANDLED_KEY, f"{self._index_id} {f[0]}:{f[1]}".encode("ascii"))
            self._persisted_handled = f
        except Exception as exc:  # a restart then reads those entries again (idempotent)
            log.warning("event=intake_gaps_state_write_failed topic=%s key=%s error=%r", self.topic, HANDLED_KEY, exc)

    def _take_start(self, consumer: Any) -> None:
        """A new index, before its consumer received anything: the topic's end now becomes its
        floor, kept in the state (module docstring). Not known (the topic may hold messages but
        could not be asked): no floor, as before."""
        self._start_due = False
        start = _last_entry(consumer) if self.holds.found else EMPTY
        if start is None:
            log.info("event=intake_gaps_no_start topic=%s reason='the topic holds messages but its end is not "
                     "known: a new index has no floor until its first durable batch'", self.topic)
            return
        try:
            self._state.put(START_KEY, f"{self._index_id} {start[0]}:{start[1]}".encode("ascii"))
        except Exception as exc:  # without it a restart before the first durable batch has no floor
            log.warning("event=intake_gaps_state_write_failed topic=%s key=%s error=%r", self.topic, START_KEY, exc)
            return
        self._start = start
        self.frontier = IntakeFrontier(start)
        self.frontier.start_open = False
        log.info("event=intake_gaps_floor topic=%s floor=%s start=true", self.topic,
                 "empty" if start == EMPTY else start)

    @property
    def handled_through(self) -> Optional[Entry]:
        """The entry through which everything is handled (None: not known; the start floor of a
        new index counts as none: what lies below it was not received)."""
        f = self.frontier.frontier
        if f is None or (self._start is not None and f <= self._start):
            return None
        return f

    # -- driven by the direct consumer (intake thread) -------------------------------------------
    def handled(self, entries: Sequence[Entry]) -> None:
        """Entries the consumer delivered, in a batch that is durable now."""
        furthest = max(entries, default=None)
        if furthest is not None and (self._delivered is None or furthest > self._delivered):
            self._delivered = furthest
            self.holds.found = True
        self.frontier.handled(entries)
        self._persist()

    def saturated(self) -> None:
        """The consumer gave a full batch: it delivers as fast as the intake takes (not starved)."""
        self._last_full = time.monotonic()

    def read_if_due(self, consumer: Any, idle: bool) -> Optional[IntakeBatch]:
        """Between batches: what the follower has, a hole, or what lies beyond the frontier when
        the consumer is idle or starved (module docstring). Returns the unseen messages read as
        an intake batch (its `ack` records the read once they are durable), or None."""
        if self._start_due:
            self._take_start(consumer)
        frontier = self.frontier.frontier
        now = time.monotonic()
        if frontier is None:
            return None
        if self._follower is not None:
            if now >= self._next_check:
                self._check_follower(consumer, now)
            if self._follower is not None:
                return self._follow()
        if now < self._retry_at:
            return None
        gap = self.frontier.gap()
        if gap is not None and gap[1] is not None:
            if self._hole_since is None:
                self._hole_since = now
            if now - self._hole_since >= HOLE_GRACE_S:
                self._hole_since = None
                return self._read_range(gap[0], gap[1], None)
        else:
            self._hole_since = None
        if now < self._next_check:
            return None
        end = self._look(consumer, now)
        if end is None or not (end > frontier or (end == frontier and self.frontier.start_open)):
            return None
        if idle:
            return self._read_range(frontier, None, end)
        if self._starved(now):
            self._start_follower(frontier, end)
            return self._follow()
        return None

    def close(self) -> None:
        """Close the follower, if any (the consumer is closing)."""
        self._stop_follower("closing")

    # -- looking at the topic's end -----------------------------------------------------------------
    def _look(self, consumer: Any, now: float) -> Optional[Entry]:
        """The topic's last entry now (remembered for `_starved`); schedules the next look."""
        # A topic that was empty at the index's start is asked only once it holds a message.
        end = _last_entry(consumer) if self.frontier.frontier != EMPTY or self.holds() else None
        frontier = self.frontier.frontier
        beyond = end is not None and frontier is not None and end > frontier
        self._check_s = CHECK_MIN_S if beyond or self._follower is not None else min(CHECK_MAX_S, self._check_s * 2)
        self._next_check = now + self._check_s
        if end is not None:
            ends = self._ends
            ends.append((now, end))
            while len(ends) > 1 and ends[1][0] <= now - LAG_S:
                ends.popleft()  # keep the newest look that is at least LAG_S old
        return end

    def _starved(self, now: float) -> bool:
        """Partial batches only for LAG_S, and the consumer has not delivered up to the end the
        topic had LAG_S ago."""
        if not self._ends or self._ends[0][0] > now - LAG_S or now - self._last_full < LAG_S:
            return False
        then = self._ends[0][1]
        return self._delivered is None or self._delivered < then

    # -- one gap, read with a Reader of its own --------------------------------------------------------
    def _read_range(self, start: Entry, stop: Optional[Entry], end: Optional[Entry]) -> Optional[IntakeBatch]:
        """Read from `start` (inclusive) up to the handled entry `stop`, or through the topic's
        last entry `end`."""
        t0 = time.monotonic()
        self.reads += 1
        reader = self._reader_at(start)
        try:
            taken = _Taken(start)
            self._take(reader, taken, stop=stop, end=end, wait_ms=READ_TIMEOUT_MS)
        finally:
            close_quietly(reader, self.topic)
        last_complete = taken.last_complete
        if taken.reached:
            last_complete = stop
        elif end is not None and taken.current == end:
            last_complete = end  # nothing came after the topic's last message: its entry was read whole
        complete = taken.reached or (end is not None and last_complete == end)
        if complete:
            self._retry_s = RETRY_MIN_S
        else:
            self._retry_at = time.monotonic() + self._retry_s
            self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)
        self._log_read("gap", start, stop or end, taken, complete, time.monotonic() - t0)
        return self._batch(taken.found, last_complete, taken.reached)

    # -- the follower: a Reader kept open while the consumer is starved --------------------------------
    def _start_follower(self, frontier: Entry, end: Entry) -> None:
        self._follower = self._reader_at(frontier)
        self._follow_entry = None
        self._follow_read_at = time.monotonic()
        if self._starved_since is None:
            self._starved_since = self._follow_read_at
        log.info("event=intake_follower_started topic=%s from=%s topic_end=%s delivered=%s reason='the consumer "
                 "delivers only part of what the topic holds; a Reader follows the topic until it catches up'",
                 self.topic, frontier, end, self._delivered)

    def _stop_follower(self, why: str) -> None:
        if self._follower is None:
            return
        close_quietly(self._follower, self.topic)
        self._follower = None
        log.info("event=intake_follower_stopped topic=%s frontier=%s reason=%s", self.topic,
                 self.frontier.frontier, why)

    def _check_follower(self, consumer: Any, now: float) -> None:
        """Stop following once the consumer delivers what the topic held LAG_S ago again; start
        over from the frontier when the follower gave nothing for LAG_S while the topic holds
        more (a stalled Reader)."""
        end = self._look(consumer, now)
        if not self._starved(now):
            self._stop_follower("'the consumer delivers again'")
            self._starved_since, self._starved_warned = None, False
            return
        since = self._starved_since
        if since is not None and not self._starved_warned and now - since >= STARVED_WARN_S:
            self._starved_warned = True
            log.warning("event=intake_consumer_starved topic=%s seconds=%.1f frontier=%s delivered=%s reason='the "
                        "broker does not feed the consumer what the topic holds (pulsar-lite: dead consumers of "
                        "the subscription keep their permits until the broker restarts); a Reader follows the "
                        "topic, so nothing waits, and the source messages are acked when the broker hands them "
                        "out'", self.topic, now - since, self.frontier.frontier, self._delivered)
        frontier = self.frontier.frontier
        if (end is not None and frontier is not None and end > frontier
                and now - self._follow_read_at >= LAG_S):
            self._stop_follower("'the Reader stalled; a new one starts at the frontier'")
            self._start_follower(frontier, end)

    def _follow(self) -> Optional[IntakeBatch]:
        t0 = time.monotonic()
        taken = _Taken(self.frontier.frontier or (0, 0), self._follow_entry)
        self._take(self._follower, taken, stop=None, end=None, wait_ms=FOLLOW_WAIT_MS)
        self._follow_entry = taken.current
        if taken.drained and taken.current is not None and self._ends and taken.current >= self._ends[-1][1]:
            taken.last_complete = taken.current  # the topic's last entry, and nothing after it: read whole
        if taken.read:
            self._follow_read_at = time.monotonic()
        if not taken.found and taken.last_complete is None:
            return None
        self.reads += 1
        self._log_read("follow", taken.first or taken.start, taken.current, taken, True, time.monotonic() - t0)
        return self._batch(taken.found, taken.last_complete, False)

    # -- shared ----------------------------------------------------------------------------------------
    def _reader_at(self, start: Entry) -> Any:
        # EMPTY: the topic held nothing when the index started, so all of it came after.
        return reader_at(self._client, self.topic, None if start == EMPTY else start, partition=self._partition)

    def _take(self, reader: Any, taken: "_Taken", stop: Optional[Entry], end: Optional[Entry], wait_ms: int) -> None:
        """Read from `reader` until the handled entry `stop`, past the topic's last entry `end`,
        MAX_READ messages, or `wait_ms` without a message; unseen messages go to `taken.found`."""
        start = taken.start
        now = wall_clock_ms()
        while taken.read < MAX_READ:
            try:
                msg = reader.read_next(timeout_millis=wait_ms)
            except pulsar.Timeout:
                taken.drained = True
                return  # stalled, at the topic's end, or (following) nothing new yet
            mid = msg.message_id()
            ledger, entry = mid.ledger_id(), mid.entry_id()
            here = (ledger, entry)
            current = taken.current
            if here < start or (current is not None and here < current):
                continue  # a copy of one read before (pulsar-lite's Reader re-sends after a reconnect)
            if self._start is not None and here <= self._start:
                continue  # on the topic before the index started: the subscription's to hand out
            if here != current:
                if current is not None:
                    taken.last_complete = current  # the Reader moved on: that entry was read whole
                taken.current = here
                if stop is not None and here >= stop:
                    taken.reached = here == stop
                    return
                if end is not None and here > end:
                    return
            taken.read += 1
            batch = mid.batch_index()
            ident = encode(entry, batch)
            if ident is None or (ledger, ident) in taken.seen or self._engine.was_added(ledger, ident):
                continue
            taken.seen.add((ledger, ident))
            props = msg.properties()
            payload = msg.data()
            item = classify(payload=payload, properties=props, key=msg.partition_key() or None,
                            event_time=msg.event_timestamp(), position=(ledger, entry, mid.partition(), batch),
                            now_ms=now, max_delay_ms=self._rules.max_delay_ms,
                            allowed_target_prefixes=self._rules.allowed_target_prefixes,
                            target_check=self._rules.target_check)
            if isinstance(item, Invalid):
                taken.invalid += 1  # left to the subscription (see the module docstring)
                continue
            if taken.first is None:
                taken.first = here
            taken.found.append(Pending(item, None, payload, props))
            taken.oldest_ms = min(taken.oldest_ms or now, msg.publish_timestamp() or now)

    def _batch(self, found: List[Pending], last_complete: Optional[Entry], reached: bool) -> Optional[IntakeBatch]:
        """The messages found as an intake batch whose ack records the read (at once when none)."""
        self.found += len(found)

        def record() -> None:
            if last_complete is not None:
                self.frontier.read_up_to(last_complete, reached)
                self._persist()

        if not found:
            record()
            return None
        return IntakeBatch(found, record)

    def _log_read(self, how: str, start: Entry, to: Optional[Entry], taken: "_Taken", complete: bool,
                  seconds: float) -> None:
        # A follower reads between every batch: its reads are logged at DEBUG, its start and stop above.
        # Messages published moments ago are on their way to the consumer (a new topic's first
        # message, one handed back by the runtime's input): only older ones mean a consumer holds them.
        held = taken.oldest_ms is not None and wall_clock_ms() - taken.oldest_ms > IN_FLIGHT_MS
        log_at = log.debug if how == "follow" else log.warning if held else log.info
        log_at("event=intake_gap_read how=%s topic=%s from=%s to=%s read=%d found=%d invalid_left=%d complete=%s "
               "seconds=%.2f reason='%s'", how, self.topic, start, to, taken.read, len(taken.found), taken.invalid,
               str(complete).lower(), seconds,
               ("messages the subscription has not given this consumer; indexed from a Reader, acked when the broker "
                "hands them out" if held else "messages published moments ago, not handed to the consumer yet; indexed "
                "from a Reader, acked when the broker hands them out") if taken.found else "checked: nothing missing")


@dataclass
class _Taken:
    """What one pass of `_take` read."""

    start: Entry
    current: Optional[Entry] = None  # the entry being read
    last_complete: Optional[Entry] = None  # the last entry read whole
    reached: bool = False  # the pass stopped at the handled entry that ends a gap
    drained: bool = False  # the pass stopped because the Reader had nothing more
    first: Optional[Entry] = None  # the first entry with an unseen message
    read: int = 0
    invalid: int = 0
    found: List[Pending] = field(default_factory=list)
    seen: Set[Tuple[int, int]] = field(default_factory=set)
    oldest_ms: Optional[int] = None  # the publish time of the oldest message found


def _last_entry(consumer: Any) -> Optional[Entry]:
    """(ledger, entry) of the topic's last message, or None (empty topic; pulsar-lite answers an
    empty topic with an error)."""
    try:
        last = consumer.get_last_message_id()
    except pulsar.PulsarException:
        return None
    if last.ledger_id() < 0 or last.entry_id() < 0:
        return None
    return last.ledger_id(), last.entry_id()


def intake_gaps_for(client: pulsar.Client, topic: str, engine: Any, state: Any, index_id: str,
                    rules: GapClassifier, sole_consumer: bool) -> Optional[IntakeGaps]:
    """An IntakeGaps for the direct consumer of `topic`, or None where gaps cannot be told from
    another consumer's share (`sole_consumer` False: several instances on one subscription)."""
    if not sole_consumer:
        log.info("event=intake_gaps_off topic=%s reason='several instances share the subscription: a gap may be "
                 "another instance's share'", topic)
        return None
    return IntakeGaps(client, topic, engine, state, index_id, rules)

