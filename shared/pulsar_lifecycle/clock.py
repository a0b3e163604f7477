"""The one wall clock of the package (STYLE §10): inject a `Clock`, never call time.time() for it.

Deliver-at times, release times, tick stamps and dedup index bases are all milliseconds since
the epoch; engines and services take `clock: Clock = wall_clock_ms` so tests can pass a FakeClock.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["Clock", "FakeClock", "wall_clock_ms"]

Clock = Callable[[], int]  # milliseconds since the epoch


def wall_clock_ms() -> int:
    """Wall-clock milliseconds since the epoch (what deliver-at times are measured in)."""
    return int(time.time() * 1000)


class FakeClock:
    """A Clock for tests: stands still until advanced."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = int(start_ms)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> "FakeClock":
        """Move the clock forward by `ms` (never backward)."""
        if ms < 0:
            raise ValueError(f"a clock only moves forward, got {ms} ms")
        with self._lock:
            self._now += int(ms)
        return self
