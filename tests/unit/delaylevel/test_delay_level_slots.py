"""ForwardSlots (delaylevel/slots.py): at most n partitions forward at once, in arrival order."""
from __future__ import annotations

import threading
import time
from typing import List

import pytest

from pulsar_lifecycle.delaylevel.slots import ForwardSlots

TIMEOUT_S = 10.0


def wait_until(cond, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_at_most_n_hold_a_slot_at_once():
    slots, stop = ForwardSlots(2), threading.Event()
    lock = threading.Lock()
    busy, peak, done = [0], [0], [0]

    def work() -> None:
        for _ in range(20):
            assert slots.acquire(stop)
            try:
                with lock:
                    busy[0] += 1
                    peak[0] = max(peak[0], busy[0])
                time.sleep(0.001)
                with lock:
                    busy[0] -= 1
            finally:
                slots.release()
        with lock:
            done[0] += 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert done[0] == 6 and peak[0] == 2 and slots.waiting == 0


def test_slots_are_handed_over_in_arrival_order_and_a_returning_holder_queues_behind():
    slots, stop = ForwardSlots(1), threading.Event()
    assert slots.acquire(stop)
    order: List[str] = []

    def waiter(name: str) -> None:
        assert slots.acquire(stop)
        order.append(name)
        slots.release()

    threads = []
    for i, name in enumerate("bcd"):
        t = threading.Thread(target=waiter, args=(name,))
        t.start()
        threads.append(t)
        wait_until(lambda n=i + 1: slots.waiting == n)  # queued in this order
    slots.release()
    # The first holder asks again at once: it comes after b, c and d, however fast it is.
    assert slots.acquire(stop)
    order.append("a")
    slots.release()
    for t in threads:
        t.join(TIMEOUT_S)
    assert order == ["b", "c", "d", "a"]


def test_a_waiter_gives_up_on_stop_and_leaves_the_queue():
    slots, stop = ForwardSlots(1), threading.Event()
    assert slots.acquire(stop)
    got: List[bool] = []
    t = threading.Thread(target=lambda: got.append(slots.acquire(stop)))
    t.start()
    wait_until(lambda: slots.waiting == 1)
    stop.set()
    t.join(TIMEOUT_S)
    assert got == [False] and slots.waiting == 0
    slots.release()  # the slot went back to the pool, not to the departed waiter
    assert slots.acquire(threading.Event())


def test_slot_count_must_be_positive():
    with pytest.raises(ValueError, match="forward slots must be >= 1, got 0"):
        ForwardSlots(0)
