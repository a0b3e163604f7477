"""`ForwardSlots`: at most n partitions of a syncer forward at once, in turn. Pure (threads only).

Why: a forward is GIL-bound Python, and pulsar-client releases the GIL inside every
`send_async` and `acknowledge`, twice per message. With a busy thread per partition, every
release wakes another thread that finds the GIL taken again a microsecond later: one futile
context switch per release. Measured on the 2-core bench machine (docs/benchmarks.md, forward
rate), ten partitions forwarding at once ran at about three quarters of the rate that two at a
time reached. A thread waiting here sleeps on its own lock, not on the GIL, so it is not woken
by those releases.

Slots are handed over in arrival order (a releasing thread that asks again queues behind the
ones already waiting), so a partition with a long backlog cannot starve the others: with all
partitions due, they forward one batch each in turn. Only forwarding holds a slot; waiting for a
head's forward time, for a gap or for back-pressure does not.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Deque

__all__ = ["ForwardSlots"]

WAIT_STEP_S = 0.2  # a waiter checks its stop event this often


class ForwardSlots:
    """A fair counting semaphore with a stop-aware acquire."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"forward slots must be >= 1, got {n}")
        self.size = n
        self._free = n
        self._lock = threading.Lock()
        self._waiters: Deque[threading.Lock] = deque()

    def acquire(self, stop: threading.Event) -> bool:
        """Take a slot (True), waiting behind earlier callers; False if `stop` is set first."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            handoff = threading.Lock()
            handoff.acquire()
            self._waiters.append(handoff)
        while not handoff.acquire(timeout=WAIT_STEP_S):
            if stop.is_set():
                with self._lock:
                    if handoff in self._waiters:
                        self._waiters.remove(handoff)
                        return False
                # A slot was handed over just now: it is ours (and released by the caller).
                handoff.acquire()
                return True
        return True

    def release(self) -> None:
        """Give the slot to the longest waiter, or back to the pool."""
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._free += 1

    @property
    def waiting(self) -> int:
        """Threads waiting for a slot now."""
        with self._lock:
            return len(self._waiters)
