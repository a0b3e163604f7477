"""ledgersCache: TTL, stale rule, single-flight loading (seed 000)."""
from __future__ import annotations

import threading
import time

import pytest

from pulsar_lifecycle.deletion.cache import InUseSnapshot, InUseState, LedgersCache


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_verdicts_follow_the_seed_rule():
    snap = InUseSnapshot.of([3, 5, 9, -1])
    assert snap.verdict(5) is InUseState.IN_USE
    assert snap.verdict(4) is InUseState.NOT_IN_USE
    assert snap.verdict(10) is InUseState.STALE  # above the cached maximum: do not trust
    assert InUseSnapshot.of([]).verdict(1) is InUseState.STALE
    assert InUseSnapshot(topic_exists=False).verdict(10**9) is InUseState.NOT_IN_USE


def test_expire_after_write():
    clock, loads = FakeClock(), []
    cache = LedgersCache(loader=lambda t: loads.append(t) or InUseSnapshot.of([1]), ttl_seconds=600, clock=clock)
    assert cache.get("a")[1] is False
    clock.t += 599
    assert cache.get("a")[1] is True
    clock.t += 1
    assert cache.get("a")[1] is False
    assert loads == ["a", "a"]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.loads) == (1, 2, 2)


def test_single_flight_under_concurrency():
    calls = []
    gate = threading.Event()

    def loader(topic: str) -> InUseSnapshot:
        calls.append(topic)
        gate.wait(timeout=5)
        return InUseSnapshot.of([1, 2])

    cache = LedgersCache(loader=loader, ttl_seconds=600)
    threads = [threading.Thread(target=cache.get, args=("t",)) for _ in range(16)]
    for th in threads:
        th.start()
    time.sleep(0.2)
    gate.set()
    for th in threads:
        th.join(timeout=5)
    assert calls == ["t"]
    assert cache.stats.hits == 15


def test_loader_failure_is_not_cached():
    n = {"calls": 0}

    def loader(topic: str) -> InUseSnapshot:
        n["calls"] += 1
        if n["calls"] == 1:
            raise RuntimeError("admin down")
        return InUseSnapshot.of([1])

    cache = LedgersCache(loader=loader)
    with pytest.raises(RuntimeError):
        cache.get("t")
    assert cache.get("t")[0].ledger_ids == frozenset({1})
    assert cache.stats.load_failures == 1


def test_bounded_number_of_topics():
    clock = FakeClock()
    cache = LedgersCache(loader=lambda t: InUseSnapshot.of([1]), clock=clock, max_topics=10)
    for i in range(50):
        clock.t += 1
        cache.get(f"t{i}")
    assert len(cache) <= 10
