"""Operation counters and latency histograms with Pulsar's delayed-index metric semantics."""
from __future__ import annotations

import bisect
import threading
from typing import Dict, Tuple

from .records import LATENCY_BUCKETS_MS, OP_STATES, OP_TYPES


class OpMetrics:
    """Counts per (type, state) and latency per type (Pulsar's BucketDelayedMessageIndexStats)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: Dict[Tuple[str, str], int] = {(t, s): 0 for t in OP_TYPES for s in OP_STATES}
        self._latency: Dict[str, list] = {t: [0] * (len(LATENCY_BUCKETS_MS) + 1) for t in OP_TYPES}
        self._latency_sum: Dict[str, float] = {t: 0.0 for t in OP_TYPES}

    def record(self, op: str, succeeded: bool, latency_ms: float) -> None:
        """Count one operation of type `op` (create, load, delete, merge)."""
        if op not in self._latency:
            raise ValueError(f"unknown bucket operation type {op!r}; expected one of {OP_TYPES}")
        state = "succeed" if succeeded else "failed"
        # Pulsar's buckets are upper-inclusive: (0, 50], (50, 100], ...
        slot = bisect.bisect_left(LATENCY_BUCKETS_MS, latency_ms)
        with self._lock:
            self._count[(op, state)] += 1
            self._latency[op][slot] += 1
            self._latency_sum[op] += latency_ms

    def snapshot(self) -> Tuple[Dict[Tuple[str, str], int], Dict[str, Tuple[int, ...]], Dict[str, float]]:
        """Copies of (counts, latency bucket counts, latency sums)."""
        with self._lock:
            return (
                dict(self._count),
                {t: tuple(v) for t, v in self._latency.items()},
                dict(self._latency_sum),
            )
