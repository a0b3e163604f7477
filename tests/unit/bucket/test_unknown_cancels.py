"""A cancel of a position never added (an unknown id, or one whose message has not come) keeps its
tombstone for the retention the writer gives, then expires: a message arriving later is indexed."""
from __future__ import annotations

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, CancelResult, DelayedMessage, MemorySnapshotStorage
from pulsar_lifecycle.clock import FakeClock

T0 = 1_700_000_000_000
DAY_MS = 86_400_000


def msg(ledger: int, entry: int) -> DelayedMessage:
    return DelayedMessage(ledger, entry, -1, T0 + 10 * DAY_MS, b"p")


def test_an_unknown_cancel_drops_its_message_within_the_retention_and_expires_after_it():
    clock = FakeClock(T0)
    storage = MemorySnapshotStorage()
    engine = BucketIndex(storage, BucketConfig(), clock=clock)
    engine.recover()
    assert engine.cancel(3, 7) is CancelResult.CANCELLED_BEFORE_ADD
    assert engine.cancel(3, 9) is CancelResult.CANCELLED_BEFORE_ADD
    engine.add([msg(3, 7)])  # its message came in time: dropped, and the tombstone stays
    assert not engine.was_added(3, 7) and engine.unknown_cancels() == 1
    clock.advance(DAY_MS - 1)
    assert engine.expire_unknown_cancels(DAY_MS) == []
    clock.advance(1)
    assert engine.expire_unknown_cancels(DAY_MS) == [(3, 9)]
    assert engine.unknown_cancels() == 0
    engine.add([msg(3, 9), msg(3, 7)])  # after the retention: indexed; the matched one still dropped
    assert engine.was_added(3, 9) and not engine.was_added(3, 7)


def test_a_restart_starts_the_retention_of_recovered_unknown_cancels_again():
    clock = FakeClock(T0)
    storage = MemorySnapshotStorage()
    engine = BucketIndex(storage, BucketConfig(), clock=clock)
    engine.recover()
    engine.cancel(4, 1)
    clock.advance(DAY_MS - 10)
    again = BucketIndex(storage, BucketConfig(), clock=clock)
    again.recover()
    assert again.unknown_cancels() == 1
    clock.advance(10)
    assert again.expire_unknown_cancels(DAY_MS) == []  # recovered 10 ms ago
    clock.advance(DAY_MS)
    assert again.expire_unknown_cancels(DAY_MS) == [(4, 1)]
