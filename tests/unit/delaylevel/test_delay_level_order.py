"""OrderGate (delaylevel/order.py): a partition's messages are admitted strictly in position order."""
from __future__ import annotations

from pulsar_lifecycle.delaylevel.order import OrderGate, Pos, batch_size_of


def test_batch_size_is_read_from_the_serialized_message_id():
    assert batch_size_of(bytes.fromhex("0800100120033005")) == 5  # ledger 0, entry 1, batch index 3 of 5
    assert batch_size_of(bytes.fromhex("08071002")) == 1  # outside a batch: no batch size
    assert batch_size_of(bytes.fromhex("0807100220033a020800")) == 1  # a length-delimited field is skipped
    assert batch_size_of(bytes.fromhex("08")) == 0  # truncated: unknown


def test_later_messages_wait_until_the_gap_is_filled_and_copies_count_as_handled():
    sizes = {"a": 3}
    gate: OrderGate[str] = OrderGate(Pos(1, 4, 1), cap=10, sizer=sizes.__getitem__)
    assert gate.offer(Pos(1, 4, 2), "a") == ["a"]  # next batch index: provable
    assert gate.offer(Pos(1, 6, 0), "c") == []  # entry 5 is missing: waits
    assert gate.offer(Pos(1, 5, 1), "b1") == []  # so does index 1 of entry 5
    assert gate.handled(Pos(1, 4, 0)) and not gate.handled(Pos(1, 5, 0))
    assert gate.first_waiting() == Pos(1, 5, 1)
    assert gate.resolve(Pos(1, 5, 0, 2)) == []  # a Reader finds (1, 5, 0) missing: still waiting
    # The missing one comes back ("a" was index 2 of 3, so entry 5 is next); the rest follow it
    # as far as the ids prove (index 1 of 2 is the last of entry 5 only once its size is known).
    sizes.update(b0=2, b1=2)
    assert gate.offer(Pos(1, 5, 0), "b0") == ["b0", "b1", "c"]
    assert len(gate) == 0 and gate.frontier == Pos(1, 6, 0)


def test_a_reader_proves_an_empty_gap_and_the_cap_and_clear_bound_what_waits():
    gate: OrderGate[str] = OrderGate(None, cap=2)  # nothing handled yet: even the first waits
    assert gate.offer(Pos(3, 0, 0), "x") == [] and gate.offer(Pos(3, 1, 0), "y") == []
    assert gate.full
    assert gate.resolve(None) == [] and gate.resolve(Pos(2, 9, 0, 1)) == []
    assert gate.resolve(Pos(3, 0, 0, 1)) == ["x", "y"]  # single-message entries: x then y
    assert gate.offer(Pos(4, 0, 0), "z") == []  # a new ledger is never provable from the ids
    assert gate.clear() == ["z"] and len(gate) == 0


def test_what_a_reader_read_from_the_frontier_is_admitted_with_what_waited_behind_it():
    # Nothing handled yet and the partition's head held elsewhere: the later messages wait.
    gate: OrderGate[str] = OrderGate(None, cap=10)
    assert gate.offer(Pos(3, 2, 0, 1), "c") == [] and gate.offer(Pos(3, 3, 0, 1), "d") == []
    # A Reader read the gap (everything before the first waiting one), in order.
    assert gate.admit_read([(Pos(3, 0, 0, 1), "a"), (Pos(3, 1, 0, 1), "b")]) == ["a", "b", "c", "d"]
    assert len(gate) == 0 and gate.frontier == Pos(3, 3, 0, 1)
    # Positions at or below the frontier are not admitted twice.
    assert gate.admit_read([(Pos(3, 3, 0, 1), "d again")]) == []
    later: OrderGate[str] = OrderGate(Pos(5, 0, 0, 1), cap=10)
    assert later.offer(Pos(5, 2, 0, 1), "y") == []
    assert later.admit_read([(Pos(5, 0, 0, 1), "old"), (Pos(5, 1, 0, 1), "x")]) == ["x", "y"]
