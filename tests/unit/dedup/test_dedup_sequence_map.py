"""Unit tests of the pure PIP-6 sequence map (no broker)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsar_lifecycle.dedup import (
    NO_SEQUENCE,
    CapacityError,
    DedupSnapshot,
    Position,
    SequenceError,
    SequenceMap,
    SnapshotFormatError,
)

T = "persistent://public/default/t"


def test_defaults_are_pulsars():
    m = SequenceMap(T)
    assert m.snapshot_interval == 1000  # brokerDeduplicationEntriesInterval
    assert m.max_producers == 10000  # brokerDeduplicationMaxNumberOfProducers


def test_should_publish_drops_at_or_below_highest_pushed():
    m = SequenceMap(T)
    assert m.highest_pushed("p") == NO_SEQUENCE
    assert m.should_publish("p", 1)
    m.mark_pushed("p", 5)
    assert not m.should_publish("p", 5)
    assert not m.should_publish("p", 3)
    assert m.should_publish("p", 6)
    assert m.should_publish("other", 1)
    # Pushed is not persisted until confirmed.
    assert m.highest_persisted("p") == NO_SEQUENCE


def test_mark_pushed_rejects_non_monotonic_ids():
    m = SequenceMap(T)
    m.mark_pushed("p", 10)
    with pytest.raises(SequenceError, match="not above the highest pushed 10"):
        m.mark_pushed("p", 10)
    with pytest.raises(SequenceError):
        m.mark_pushed("p", 2)


@pytest.mark.parametrize("bad", [-1, 2**63, 1.5, "3", True, None])
def test_invalid_sequence_ids_are_named(bad):
    m = SequenceMap(T)
    with pytest.raises(SequenceError, match="sequence id"):
        m.should_publish("p", bad)


def test_invalid_settings_are_named():
    with pytest.raises(ValueError, match="snapshot_interval"):
        SequenceMap(T, snapshot_interval=0)
    with pytest.raises(ValueError, match="max_producers"):
        SequenceMap(T, max_producers=0)
    with pytest.raises(ValueError, match="topic"):
        SequenceMap("")
    with pytest.raises(ValueError, match="producer name"):
        SequenceMap(T).mark_pushed("", 1)


def test_snapshot_every_interval_entries_with_position():
    m = SequenceMap(T, snapshot_interval=3)
    snaps = []
    for seq in range(1, 8):
        m.mark_pushed("p", seq)
        snap = m.mark_persisted("p", seq, Position(7, seq))
        if snap:
            snaps.append(snap)
    assert [s.producers["p"] for s in snaps] == [3, 6]
    assert [s.position for s in snaps] == [Position(7, 3), Position(7, 6)]
    assert snaps[-1].entries == 6
    assert m.entries_since_snapshot == 1


def test_broker_duplicate_receipt_keeps_last_position():
    m = SequenceMap(T, snapshot_interval=2)
    m.mark_persisted("p", 1, Position(1, 0))
    snap = m.mark_persisted("p", 2, None)  # -1:-1 receipt
    assert snap is not None and snap.position == Position(1, 0) and snap.producers["p"] == 2


def test_snapshot_round_trip_and_restore():
    m = SequenceMap(T)
    for p, seq in (("a", 4), ("b", 9)):
        m.mark_pushed(p, seq)
        m.mark_persisted(p, seq, Position(3, seq, 2, partition=-1))
    m.mark_pushed("a", 50)  # pushed only: not in the snapshot
    snap = m.take_snapshot()
    raw = snap.to_bytes()
    assert json.loads(raw)["producers"] == {"a": 4, "b": 9}
    again = DedupSnapshot.from_bytes(raw)
    assert again == snap
    r = SequenceMap(T)
    r.restore(again)
    assert r.highest_pushed("a") == 4 and r.highest_persisted("b") == 9
    assert r.position == Position(3, 9, 2)
    assert not r.is_active("a")  # restored producers start inactive, as in Pulsar
    with pytest.raises(ValueError, match="snapshot is for topic"):
        SequenceMap(T + "x").restore(again)


def test_replay_raises_to_max_and_advances_position():
    m = SequenceMap(T)
    m.restore(DedupSnapshot(T, Position(1, 5), {"p": 10}))
    m.replay("p", 8, Position(1, 6))  # re-read of an older message: max keeps 10
    assert m.highest_persisted("p") == 10
    m.replay("p", 12, Position(1, 7))
    m.replay("q", 3, Position(1, 8))
    assert (m.highest_pushed("p"), m.highest_persisted("p")) == (12, 12)
    assert m.highest_persisted("q") == 3
    m.advance_position(Position(1, 9))
    assert m.position == Position(1, 9)
    m.advance_position(Position(1, 2))  # never moves backwards
    assert m.position == Position(1, 9)
    assert not m.should_publish("p", 12)


def test_rollback_and_reset_pushed():
    m = SequenceMap(T)
    m.mark_pushed("p", 1)
    m.mark_persisted("p", 1)
    m.mark_pushed("p", 2)
    m.mark_pushed("p", 3)
    m.rollback_pushed("p", 3, 2)
    assert m.highest_pushed("p") == 2
    m.reset_pushed_to_persisted()
    assert m.highest_pushed("p") == 1


def test_cap_evicts_least_recently_used_inactive_producer():
    m = SequenceMap(T, max_producers=3)
    m.producer_added("active")
    m.mark_pushed("active", 1)
    m.mark_pushed("old", 1)
    m.mark_pushed("recent", 1)
    m.mark_pushed("old", 2)  # "old" is now more recent than "recent"
    m.mark_pushed("new", 1)
    assert "recent" not in m and {"active", "old", "new"} == set(m.producers())
    assert m.evicted == 1
    # Active producers are never evicted, even when least recently used.
    m.producer_added("old")
    m.producer_added("new")
    with pytest.raises(CapacityError, match="all active"):
        m.mark_pushed("fourth", 1)
    m.producer_removed("active")
    m.mark_pushed("fourth", 1)
    assert "active" not in m and m.highest_pushed("active") == NO_SEQUENCE


def test_restore_over_cap_keeps_the_most_advanced_producers():
    m = SequenceMap(T, max_producers=2)
    m.restore(DedupSnapshot(T, None, {"a": 5, "b": 1, "c": 9}))
    assert set(m.producers()) == {"a", "c"}


@pytest.mark.parametrize(
    "raw, msg",
    [
        (b"\xff", "not JSON"),
        (b"[]", "not a de-duplication snapshot"),
        (b'{"format":"pulsar-lifecycle/dedup-snapshot","version":9}', "version 9"),
        (b'{"format":"pulsar-lifecycle/dedup-snapshot","version":1,"topic":"t","producers":{"p":"x"}}', "producer 'p'"),
        (b'{"format":"pulsar-lifecycle/dedup-snapshot","version":1,"topic":"t","producers":{},"position":{"x":1}}', "ledger_id"),
    ],
)
def test_bad_snapshots_are_named(raw, msg):
    with pytest.raises(SnapshotFormatError, match=msg):
        DedupSnapshot.from_bytes(raw)


def test_position_order_puts_whole_entry_before_its_batch():
    assert Position(1, 2) < Position(1, 2, 0) < Position(1, 2, 5) < Position(1, 3) < Position(2, 0)
    assert Position(1, 2, 5).entry() == Position(1, 2)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 40), st.booleans()), max_size=80),
    crash_at=st.integers(0, 80),
    interval=st.integers(1, 7),
)
def test_recovery_from_snapshot_plus_tail_equals_full_history(ops, crash_at, interval):
    """Whatever the crash point, last snapshot + replay of later persisted entries == no crash."""
    live = SequenceMap(T, snapshot_interval=interval)
    log = []  # the topic: (producer, seq, position) of every persisted entry
    last_snap = None
    for _i, (p, seq, persisted) in enumerate(ops[:crash_at]):
        if not live.should_publish(p, seq):
            continue
        live.mark_pushed(p, seq)
        if persisted:  # sends are confirmed in order here; unconfirmed ones are lost by the crash
            pos = Position(1, len(log))
            log.append((p, seq, pos))
            snap = live.mark_persisted(p, seq, pos)
            if snap is not None:
                last_snap = DedupSnapshot.from_bytes(snap.to_bytes())
    rec = SequenceMap(T, snapshot_interval=interval)
    if last_snap is not None:
        rec.restore(last_snap)
    start = rec.position
    for p, seq, pos in log:
        if start is None or pos.entry() >= start.entry():
            rec.replay(p, seq, pos)
    for p in ("a", "b", "c"):
        expected = max((s for q, s, _ in log if q == p), default=NO_SEQUENCE)
        assert rec.highest_persisted(p) == expected
        assert live.highest_persisted(p) == expected


@given(st.lists(st.integers(min_value=0, max_value=50), max_size=30), st.integers(min_value=-1, max_value=20))
@settings(max_examples=200, deadline=None)
def test_push_increasing_matches_should_publish_then_mark_pushed(seqs, start):
    """The burst form (publish_many) decides and records exactly what the per-message calls do."""
    one, burst = SequenceMap(T), SequenceMap(T)
    if start >= 0:
        one.mark_pushed("p", start)
        burst.mark_pushed("p", start)
    expected = []
    for s in seqs:
        ok = one.should_publish("p", s)
        if ok:
            one.mark_pushed("p", s)
        expected.append(ok)
    assert burst.push_increasing("p", seqs) == expected
    assert burst.highest_pushed("p") == one.highest_pushed("p")


def test_push_increasing_rejects_a_bad_id_and_records_nothing():
    m = SequenceMap(T)
    with pytest.raises(SequenceError, match="out of range"):
        m.push_increasing("p", [1, 2, -5])
    assert m.highest_pushed("p") == NO_SEQUENCE
    with pytest.raises(SequenceError, match="must be an int"):
        m.push_increasing("p", [True])
