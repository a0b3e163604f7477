"""The writer's release-lateness histogram counts each release in the bucket of its lateness (the
release time minus its deliver-at, 0 for none), with Prometheus' cumulative `le` series."""
from __future__ import annotations

import bisect
import random

from pulsar_lifecycle.scheduler.service import LATENESS_BUCKETS_MS, LATENESS_METRIC, LatenessHistogram

EDGES = [0, 1, 9, 10, 11, 49, 50, 51, 999, 1000, 1001, 299_999, 300_000, 300_001, 500_000, -5]


def test_rounds_count_every_release_in_the_bucket_of_its_lateness():
    rng = random.Random(7)
    released_at = 10**12
    hist, counts, total, n = LatenessHistogram(), [0] * (len(LATENESS_BUCKETS_MS) + 1), 0, 0
    for _ in range(200):
        round_ = [released_at - rng.choice(EDGES) for _ in range(rng.randint(0, 30))]
        hist.observe_round(released_at, round_)
        for deliver_at in round_:
            late = max(0, released_at - deliver_at)
            counts[bisect.bisect_left(LATENESS_BUCKETS_MS, late)] += 1
            total += late
        n += len(round_)
    assert (hist.counts, hist.sum_ms, hist.count) == (counts, total, n)


def test_values_are_cumulative_buckets_then_inf_sum_and_count():
    hist = LatenessHistogram()
    hist.observe_round(100_000, [100_000, 99_990, 95_000])  # 0, 10 and 5000 ms late
    values = dict(hist.values())
    assert values[f"{LATENESS_METRIC}_bucket{{le=10}}"] == 2
    assert values[f"{LATENESS_METRIC}_bucket{{le=2500}}"] == 2
    assert values[f"{LATENESS_METRIC}_bucket{{le=5000}}"] == 3
    assert values[f"{LATENESS_METRIC}_bucket{{le=+Inf}}"] == 3
    assert (values[f"{LATENESS_METRIC}_sum"], values[f"{LATENESS_METRIC}_count"]) == (5010, 3)
