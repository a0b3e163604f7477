"""InFlightLimiter: at most `limit` jobs at once, one at a time per key, back-pressure on submit."""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Dict, List

import pytest

from pulsar_lifecycle.deletion.inflight import InFlightLimiter
from support.helpers import wait_for


class Tracker:
    """Counts jobs running at once, overall and per key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.per_key: Dict[object, int] = defaultdict(int)
        self.key_overlaps: List[object] = []
        self.order: Dict[object, List[int]] = defaultdict(list)
        self.done = 0

    def job(self, key: object, n: int, gate: threading.Event):
        def run() -> None:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
                if self.per_key[key]:
                    self.key_overlaps.append(key)
                self.per_key[key] += 1
                self.order[key].append(n)
            gate.wait(10)
            with self.lock:
                self.running -= 1
                self.per_key[key] -= 1
                self.done += 1
        return run


def test_at_most_limit_jobs_run_and_submit_blocks_when_full():
    limiter = InFlightLimiter(3)
    t = Tracker()
    gate = threading.Event()
    for i in range(3):
        limiter.submit(f"k{i}", t.job(f"k{i}", i, gate))
    assert wait_for(lambda: t.running == 3, timeout=10)
    fourth_in = threading.Event()

    def submit_fourth() -> None:
        limiter.submit("k3", t.job("k3", 3, gate))
        fourth_in.set()

    threading.Thread(target=submit_fourth, daemon=True).start()
    assert not fourth_in.wait(0.3), "submit() accepted a job beyond the limit"
    assert limiter.in_flight == 3
    gate.set()
    assert fourth_in.wait(10)
    assert limiter.drain(10) and t.done == 4 and t.most == 3
    limiter.close(1)


def test_jobs_of_one_key_never_overlap_and_keep_their_order():
    limiter = InFlightLimiter(8)
    t = Tracker()
    # 5 keys x 20 jobs, interleaved. The first jobs hold until the gate opens, so the next ones
    # queue behind their busy keys and submit() blocks; then everything flows.
    gate = threading.Event()
    threading.Timer(0.2, gate.set).start()
    for n in range(20):
        for k in range(5):
            limiter.submit(k, t.job(k, n, gate))
    assert limiter.drain(30)
    assert t.done == 100
    assert t.key_overlaps == []
    assert all(t.order[k] == list(range(20)) for k in range(5))
    limiter.close(1)


def test_keyless_jobs_run_side_by_side():
    limiter = InFlightLimiter(4)
    t = Tracker()
    gate = threading.Event()
    for i in range(4):
        limiter.submit(None, t.job(None, i, gate))
    assert wait_for(lambda: t.running == 4, timeout=10)  # None keys never wait for each other
    gate.set()
    assert limiter.drain(10)
    limiter.close(1)


def test_a_waiting_duplicate_holds_a_slot_but_not_a_thread():
    limiter = InFlightLimiter(2)
    t = Tracker()
    first, other = threading.Event(), threading.Event()
    limiter.submit("a", t.job("a", 0, first))
    limiter.submit("a", t.job("a", 1, first))  # queued behind the first "a"
    assert limiter.in_flight == 2
    blocked = threading.Event()

    def third() -> None:
        limiter.submit("b", t.job("b", 0, other))
        blocked.set()

    threading.Thread(target=third, daemon=True).start()
    assert not blocked.wait(0.3), "the queued duplicate must count against the limit"
    first.set()
    other.set()
    assert blocked.wait(10) and limiter.drain(10)
    assert t.order["a"] == [0, 1] and t.key_overlaps == []
    limiter.close(1)


def test_a_failing_job_frees_its_slot_and_its_key():
    limiter = InFlightLimiter(1)
    ran: List[str] = []

    def boom() -> None:
        raise RuntimeError("storage client bug")

    limiter.submit("k", boom)
    limiter.submit("k", lambda: ran.append("after"))
    assert limiter.drain(10)
    assert ran == ["after"] and limiter.in_flight == 0
    limiter.close(1)


def test_close_waits_for_accepted_jobs_then_refuses():
    limiter = InFlightLimiter(2)
    gate = threading.Event()
    finished: List[int] = []
    limiter.submit(1, lambda: (gate.wait(10), finished.append(1)))
    assert not limiter.drain(0.05)  # still running: a bounded wait says so
    threading.Timer(0.1, gate.set).start()
    assert limiter.close(10)
    assert finished == [1]
    with pytest.raises(RuntimeError, match="closed"):
        limiter.submit(2, lambda: None)


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match=">= 1"):
        InFlightLimiter(0)
