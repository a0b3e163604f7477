"""IntakeFrontier and IntakeGaps: which entries of the scheduling topic the direct consumer has
handled, which gaps a Reader reads, what it indexes, and what the function state keeps. No broker:
a fake Reader serves a list of messages."""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Set, Tuple

import pulsar
import pytest

from pulsar_lifecycle.bucket.positions import encode
from pulsar_lifecycle.bucket.records import DelayedMessage
from pulsar_lifecycle.clock import wall_clock_ms
from pulsar_lifecycle.scheduler import intake_gaps as ig
from pulsar_lifecycle.scheduler.intake import Cancel
from pulsar_lifecycle.scheduler.intake_gaps import GapClassifier, IntakeFrontier, IntakeGaps
from pulsar_lifecycle.scheduling_protocol import CANCEL_PROP, DELIVER_AT_PROP

TOPIC = "persistent://public/default/sched"
DUE = str(wall_clock_ms() + 3_600_000)  # an hour from now: indexed, not refused


# -- IntakeFrontier (pure) ---------------------------------------------------------------------------

def test_no_floor_means_no_gaps():
    f = IntakeFrontier(None)
    f.handled([(1, 5), (1, 9)])
    assert f.gap() is None and not f.unresolved


def test_the_start_gap_stays_open_until_the_floor_entry_is_proven_complete():
    f = IntakeFrontier((1, 10))
    assert f.gap() == ((1, 10), None) and f.unresolved
    f.handled([(1, 11), (1, 12)])  # later entries arrive: the floor entry's rest may be held elsewhere
    assert f.gap() == ((1, 10), (1, 11)) and f.holes
    f.read_up_to((1, 11), reached=True)  # a Reader read from the floor entry up to (1, 11)
    assert f.gap() is None and f.frontier == (1, 12)


def test_receiving_the_floor_entry_itself_closes_the_start_gap():
    f = IntakeFrontier((1, 10))
    f.handled([(1, 10), (1, 11), (1, 12)])
    assert f.gap() is None and f.frontier == (1, 12)


def test_a_hole_below_a_received_entry_is_a_gap_until_read():
    f = IntakeFrontier((1, 10))
    f.handled([(1, 10), (1, 11), (1, 15), (1, 16)])
    assert f.frontier == (1, 11) and f.gap() == ((1, 11), (1, 15))
    f.handled([(1, 12), (1, 13), (1, 14)])  # the hole filled by itself (a late redelivery)
    assert f.gap() is None and f.frontier == (1, 16)


def test_a_new_ledger_is_a_gap_a_reader_closes():
    f = IntakeFrontier((3, 99))
    f.handled([(3, 99), (7, 0), (7, 1)])
    assert f.gap() == ((3, 99), (7, 0))
    f.read_up_to((7, 0), reached=True)
    assert f.gap() is None and f.frontier == (7, 1)


def test_redeliveries_at_or_below_the_frontier_change_nothing():
    f = IntakeFrontier((1, 10))
    f.handled([(1, 10), (1, 11)])
    f.handled([(1, 5), (1, 11)])
    assert f.frontier == (1, 11) and f.gap() is None


def test_a_partial_read_moves_the_frontier_to_the_last_complete_entry():
    f = IntakeFrontier((1, 10))
    f.handled([(1, 20)])
    f.read_up_to((1, 14), reached=False)  # the Reader stalled in entry 15
    assert f.frontier == (1, 14) and f.gap() == ((1, 14), (1, 20)) and not f.start_open


# -- IntakeGaps with a fake Reader -------------------------------------------------------------------

class FakeId:
    def __init__(self, ledger: int, entry: int, batch: int = -1, partition: int = -1) -> None:
        self.ledger, self.entry, self.batch, self.part = ledger, entry, batch, partition

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch

    def partition(self) -> int:
        return self.part


class FakeMessage:
    def __init__(self, ledger: int, entry: int, batch: int = -1, props: Optional[Dict[str, str]] = None) -> None:
        self._id = FakeId(ledger, entry, batch)
        self._props = props if props is not None else {DELIVER_AT_PROP: DUE}

    def message_id(self) -> FakeId:
        return self._id

    def properties(self) -> Dict[str, str]:
        return self._props

    def data(self) -> bytes:
        return f"{self._id.ledger}:{self._id.entry}:{self._id.batch}".encode()

    def partition_key(self) -> str:
        return ""

    def event_timestamp(self) -> int:
        return 0

    def publish_timestamp(self) -> int:
        return 0  # unknown: the gap read logs it as just published


class FakeReader:
    def __init__(self, messages: List[FakeMessage], start: Tuple[int, int]) -> None:
        self.queue = [m for m in messages if (m.message_id().ledger, m.message_id().entry) >= start]
        self.closed = False

    def read_next(self, timeout_millis: int) -> FakeMessage:
        if not self.queue:
            raise pulsar.Timeout()
        return self.queue.pop(0)

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, messages: List[FakeMessage]) -> None:
        self.messages = messages
        self.readers: List[FakeReader] = []

    def create_reader(self, topic: str, start: Any, **kwargs: Any) -> FakeReader:
        assert kwargs.get("start_message_id_inclusive") is True
        r = FakeReader(self.messages, (start.ledger_id(), start.entry_id()))
        self.readers.append(r)
        return r


class FakeEngine:
    def __init__(self, added: Set[Tuple[int, int]], last: Optional[Tuple[int, int]]) -> None:
        self.added = added  # (ledger, index id)
        self.last = last

    def last_added_entry(self) -> Optional[Tuple[int, int]]:
        return self.last

    def was_added(self, ledger: int, ident: int) -> bool:
        return (ledger, ident) in self.added


class FakeState:
    def __init__(self) -> None:
        self.data: Dict[str, bytes] = {}
        self.writes = 0

    def get(self, key: str) -> Optional[bytes]:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self.writes += 1


class FakeConsumer:
    def __init__(self, last: Tuple[int, int]) -> None:
        self.last = last

    def get_last_message_id(self) -> FakeId:
        return FakeId(*self.last)


RULES = GapClassifier(max_delay_ms=10**12, allowed_target_prefixes=("persistent://public/default/",))


def batch_entry(ledger: int, entry: int, size: int, **props: str) -> List[FakeMessage]:
    return [FakeMessage(ledger, entry, b, dict({DELIVER_AT_PROP: DUE}, **props)) for b in range(size)]


@pytest.fixture(autouse=True)
def no_idle_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ig, "CHECK_MIN_S", 0.0)
    monkeypatch.setattr(ig, "HOLE_GRACE_S", 0.0)


def gaps_over(messages: List[FakeMessage], added: Set[Tuple[int, int]], last: Optional[Tuple[int, int]],
              state: Optional[FakeState] = None) -> Tuple[IntakeGaps, FakeClient, FakeState]:
    client, st = FakeClient(messages), state or FakeState()
    g = IntakeGaps(client, TOPIC, FakeEngine(added, last), st, "idx1", RULES)  # type: ignore[arg-type]
    return g, client, st


def test_the_start_gap_read_indexes_what_the_dead_consumer_held_and_skips_what_the_index_has():
    # Entry 10 (batch of 4) was half made durable before the kill; 11 and 12 were received, not
    # made durable; the restarted consumer's first batch starts at 13.
    msgs = batch_entry(1, 10, 4) + batch_entry(1, 11, 2) + batch_entry(1, 12, 2) + batch_entry(1, 13, 2)
    added = {(1, encode(10, 0)), (1, encode(10, 1))}
    g, client, state = gaps_over(msgs, added, last=(1, 10))
    assert state.data[ig.STATE_KEY] == b"idx1 1:10"  # kept at once: a kill now must not lose the gap
    g.handled([(1, 13)])
    batch = g.read_if_due(FakeConsumer((1, 13)), idle=False)
    assert batch is not None
    assert [p.item.entry_id for p in batch.items] == [encode(10, 2), encode(10, 3), encode(11, 0), encode(11, 1),
                                                     encode(12, 0), encode(12, 1)]
    assert all(isinstance(p.item, DelayedMessage) for p in batch.items)
    assert g.frontier.gap() is not None  # recorded only once the batch is durable
    batch.ack()
    assert g.frontier.gap() is None and g.frontier.frontier == (1, 13)
    assert state.data[ig.STATE_KEY] == b"" and client.readers[0].closed


def test_an_idle_consumer_reads_what_lies_beyond_the_frontier_up_to_the_topic_end():
    msgs = batch_entry(1, 10, 1) + batch_entry(1, 11, 3)
    g, _client, _state = gaps_over(msgs, {(1, encode(10, 0))}, last=(1, 10))
    batch = g.read_if_due(FakeConsumer((1, 11)), idle=True)
    assert batch is not None and len(batch.items) == 3
    batch.ack()
    assert g.frontier.frontier == (1, 11) and not g.frontier.unresolved
    assert g.read_if_due(FakeConsumer((1, 11)), idle=True) is None  # nothing beyond it now


def test_nothing_found_records_the_read_at_once():
    msgs = batch_entry(1, 10, 2) + batch_entry(1, 11, 1)
    added = {(1, encode(10, 0)), (1, encode(10, 1))}
    g, _client, state = gaps_over(msgs, added, last=(1, 10))
    g.handled([(1, 11)])
    assert g.read_if_due(FakeConsumer((1, 11)), idle=False) is None
    assert g.frontier.gap() is None and g.found == 0 and g.reads == 1
    assert state.data[ig.STATE_KEY] == b""


def test_cancels_are_applied_and_invalid_messages_left_to_the_subscription():
    msgs = (batch_entry(1, 10, 1) + [FakeMessage(1, 11, -1, {CANCEL_PROP: "1:10"})]
            + [FakeMessage(1, 12, -1, {})] + batch_entry(1, 13, 1))
    g, _client, _state = gaps_over(msgs, {(1, encode(10, 0))}, last=(1, 10))
    g.handled([(1, 13)])
    batch = g.read_if_due(FakeConsumer((1, 13)), idle=False)
    assert batch is not None and [type(p.item) for p in batch.items] == [Cancel]


def test_a_stalled_read_is_retried_later_from_the_last_complete_entry():
    msgs = batch_entry(1, 10, 1) + batch_entry(1, 11, 1) + batch_entry(1, 12, 1)  # entry 13 never comes
    g, _client, _state = gaps_over(msgs, {(1, encode(10, 0))}, last=(1, 10))
    g.handled([(1, 14)])
    batch = g.read_if_due(FakeConsumer((1, 14)), idle=False)
    assert batch is not None and len(batch.items) == 2
    batch.ack()
    assert g.frontier.frontier == (1, 11) and g.frontier.gap() == ((1, 11), (1, 14))
    assert g.read_if_due(FakeConsumer((1, 14)), idle=False) is None  # backing off


def test_a_gap_left_open_by_a_killed_process_is_read_by_the_next_one():
    state = FakeState()
    msgs = batch_entry(1, 10, 1) + batch_entry(1, 11, 1) + batch_entry(1, 20, 1)
    first, _c, _s = gaps_over(msgs, {(1, encode(10, 0))}, last=(1, 10), state=state)
    first.handled([(1, 20)])  # killed before reading the gap; meanwhile entry 20 is in the index
    later, client, _s = gaps_over(msgs, {(1, encode(10, 0)), (1, encode(20, 0))}, last=(1, 20), state=state)
    assert later.frontier.frontier == (1, 10)  # where the unresolved gap began, not the index's last entry
    batch = later.read_if_due(FakeConsumer((1, 20)), idle=True)
    assert batch is not None and [p.item.entry_id for p in batch.items] == [encode(11, 0)]


def test_a_gap_kept_for_another_index_is_ignored():
    state = FakeState()
    state.data[ig.STATE_KEY] = b"old-index 1:3"
    g, _client, _state = gaps_over([], {(1, encode(10, 0))}, last=(1, 10), state=state)
    assert g.frontier.frontier == (1, 10)


def test_a_new_index_takes_the_topics_end_at_its_start_as_its_floor():
    # Entries 0-4 were on the topic before the index started (acked for another index, say).
    old = batch_entry(1, 0, 5)
    g, client, state = gaps_over(old, set(), last=None)
    assert len(client.readers) == 1  # the look whether the topic holds a message, before subscribing
    assert g.read_if_due(FakeConsumer((1, 4)), idle=True) is None  # before the first receive
    assert state.data[ig.START_KEY] == b"idx1 1:4" and g.frontier.frontier == (1, 4)
    assert g.handled_through is None  # nothing below the start floor was received
    # Killed before its first durable batch, with entries 5 and 6 held by its dead consumer.
    held = old + batch_entry(1, 5, 2) + batch_entry(1, 6, 1)
    again, client, _ = gaps_over(held, set(), last=None, state=state)
    assert again.frontier.frontier == (1, 4) and not again.frontier.unresolved
    batch = again.read_if_due(FakeConsumer((1, 6)), idle=True)
    assert batch is not None
    assert [p.payload for p in batch.items] == [b"1:5:0", b"1:5:1", b"1:6:0"]  # nothing at or below (1, 4)
    batch.ack()
    assert again.frontier.frontier == (1, 6) and again.handled_through == (1, 6)


def test_a_new_index_on_an_empty_topic_reads_from_its_beginning_after_a_restart():
    g, client, state = gaps_over([], set(), last=None)
    assert g.read_if_due(FakeConsumer((1, 0)), idle=True) is None
    assert state.data[ig.START_KEY] == b"idx1 -1:-1" and g.frontier.frontier == ig.EMPTY
    held = batch_entry(3, 0, 2)
    again, client, _ = gaps_over(held, set(), last=None, state=state)
    batch = again.read_if_due(FakeConsumer((3, 0)), idle=True)
    assert batch is not None and len(batch.items) == 2
    other = FakeState()
    other.data[ig.START_KEY] = b"idx0 -1:-1"  # another index's start: a new start is taken
    fresh, _, st = gaps_over(held, set(), last=None, state=other)
    assert fresh.read_if_due(FakeConsumer((3, 0)), idle=True) is None and st.data[ig.START_KEY] == b"idx1 3:0"


def test_an_index_with_a_floor_takes_no_start():
    g, client, state = gaps_over(batch_entry(1, 10, 1), {(1, encode(10, 0))}, last=(1, 10))
    g.read_if_due(FakeConsumer((1, 10)), idle=True)
    assert ig.START_KEY not in state.data


def test_a_restart_reads_nothing_the_last_run_handled_beyond_its_last_add():
    # Entry 10 added, entries 11 and 12 cancels: handled and acked, nothing in the index.
    msgs = batch_entry(1, 10, 1) + batch_entry(1, 11, 1) + batch_entry(1, 12, 1)
    added = {(1, encode(10, 0))}
    g, _client, state = gaps_over(msgs, added, last=(1, 10))
    g.handled([(1, 10)])
    g.handled([(1, 11), (1, 12)])
    assert state.data[ig.HANDLED_KEY] == b"idx1 1:12"
    again, client, _ = gaps_over(msgs, added, last=(1, 10), state=state)
    assert again.frontier.frontier == (1, 12) and not again.frontier.unresolved
    assert again.read_if_due(FakeConsumer((1, 12)), idle=True) is None and not client.readers
    other = FakeState()
    other.data[ig.HANDLED_KEY] = b"idx0 1:12"  # another index's: ignored
    fresh, _, _ = gaps_over(msgs, added, last=(1, 10), state=other)
    assert fresh.frontier.frontier == (1, 10) and fresh.frontier.start_open


def _looked_once(monkeypatch: pytest.MonkeyPatch, msgs: list, consumer_last: Tuple[int, int]):
    """Gaps over `msgs` with the floor entry (1, 10) handled, after a first look at the topic's end
    and LAG_S (shortened) later: (gaps, client, consumer)."""
    monkeypatch.setattr(ig, "LAG_S", 0.05)
    g, client, _state = gaps_over(msgs, {(1, encode(10, 0))}, last=(1, 10))
    g.handled([(1, 10)])  # the floor entry itself came: no start gap
    consumer = FakeConsumer(consumer_last)
    assert g.read_if_due(consumer, idle=False) is None  # the first look at the end: nothing to compare
    time.sleep(0.06)
    return g, client, consumer


def test_a_starved_consumer_has_the_topic_read_beyond_its_frontier(monkeypatch: pytest.MonkeyPatch):
    # pulsar-lite: dead consumers that keep their permits make the live one's dispatch a trickle.
    g, _client, consumer = _looked_once(monkeypatch, batch_entry(1, 10, 1) + batch_entry(1, 11, 2)
                                        + batch_entry(1, 12, 2), (1, 12))
    batch = g.read_if_due(consumer, idle=False)  # still not at the end seen LAG_S ago: starved
    assert batch is not None and len(batch.items) == 4


def test_a_consumer_giving_full_batches_is_not_starved(monkeypatch: pytest.MonkeyPatch):
    g, client, consumer = _looked_once(monkeypatch, batch_entry(1, 10, 1) + batch_entry(1, 11, 2), (1, 11))
    g.saturated()  # the intake is the bottleneck, not the broker's dispatch
    assert g.read_if_due(consumer, idle=False) is None and not client.readers


def test_a_follower_keeps_reading_while_the_consumer_stays_starved_and_stops_when_it_catches_up(
        monkeypatch: pytest.MonkeyPatch):
    g, client, consumer = _looked_once(monkeypatch, batch_entry(1, 10, 1) + batch_entry(1, 11, 2), (1, 11))
    first = g.read_if_due(consumer, idle=False)
    assert first is not None and len(first.items) == 2 and len(client.readers) == 1
    first.ack()
    follower = client.readers[0]
    assert not follower.closed  # kept open: the topic grows while the consumer trickles
    follower.queue.extend(batch_entry(1, 12, 3))
    consumer.last = (1, 12)
    more = g.read_if_due(consumer, idle=False)
    assert more is not None and len(more.items) == 3 and len(client.readers) == 1
    more.ack()
    g.handled([(1, 12)])  # the consumer delivers up to the end again
    time.sleep(0.06)
    assert g.read_if_due(consumer, idle=False) is None
    assert follower.closed


def test_a_brief_starvation_is_info_and_only_a_lasting_one_warns(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture):
    # A busy host delays a first delivery past LAG_S: the follower covers it without a warning.
    monkeypatch.setattr(ig, "STARVED_WARN_S", 0.2)
    g, _client, consumer = _looked_once(monkeypatch, batch_entry(1, 10, 1) + batch_entry(1, 11, 2), (1, 11))
    with caplog.at_level(logging.INFO, logger=ig.log.name):
        first = g.read_if_due(consumer, idle=False)
        assert first is not None
        first.ack()
        assert "event=intake_follower_started" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        time.sleep(0.25)  # still starved past STARVED_WARN_S: the broker does not feed the consumer
        for _ in range(3):
            g.read_if_due(consumer, idle=False)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "event=intake_consumer_starved" in warned[0], warned


def test_a_hole_is_read_only_once_it_stayed_open_for_the_grace(monkeypatch: pytest.MonkeyPatch):
    # Apache Pulsar may hand a dead consumer's messages over just after later ones: no Reader for that.
    monkeypatch.setattr(ig, "HOLE_GRACE_S", 60.0)
    msgs = batch_entry(1, 10, 1) + batch_entry(1, 11, 1) + batch_entry(1, 12, 1)
    g, client, _state = gaps_over(msgs, {(1, encode(10, 0))}, last=(1, 10))
    g.handled([(1, 10), (1, 12)])
    assert g.read_if_due(FakeConsumer((1, 12)), idle=False) is None and not client.readers
    g.handled([(1, 11)])  # the broker filled it
    assert g.frontier.gap() is None
