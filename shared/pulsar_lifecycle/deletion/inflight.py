"""A bounded number of deletions in flight, never two of the same ledger at once.

The runtime hands process() one message at a time. The worker submits each message here and
returns, so up to `limit` deletions wait on storage together instead of one.

- `submit()` blocks while `limit` jobs are accepted and unfinished. That stalls the runtime's
  thread, which then takes no more messages: memory and the work redone after a crash stay
  bounded by `limit`.
- Jobs with the same key run one after another. A second job for a busy key waits in that key's
  queue (holding a slot but no thread) and runs on the thread that finished the first. The
  worker keys jobs by ledger, so a duplicate request, or a redelivery after the input's ack
  timeout, never races the deletion already running.
- Jobs settle their own messages (ack or nack). A job that raises anyway is logged and its slot
  freed; its message stays unacked and comes back.

Threads only, no Pulsar: unit-tested directly (tests/unit/deletion/test_deletion_inflight.py).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Deque, Dict, Hashable, Optional

log = logging.getLogger(__name__)

Job = Callable[[], None]


class InFlightLimiter:
    """Runs up to `limit` jobs at once on its own threads; jobs sharing a key run in turn."""

    def __init__(self, limit: int, name: str = "deletion") -> None:
        """Args:
            limit: jobs accepted and not finished, at most (>= 1); also the number of threads.
            name: prefix of the threads' names.
        """
        if limit < 1:
            raise ValueError(f"in-flight limit must be >= 1, got {limit}")
        self.limit = limit
        self._slots = threading.Semaphore(limit)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._waiting: Dict[Hashable, Deque[Job]] = {}  # busy key -> jobs queued behind it
        self._accepted = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix=name)

    @property
    def in_flight(self) -> int:
        """Jobs accepted and not finished (running or queued behind their key)."""
        with self._lock:
            return self._accepted

    def submit(self, key: Optional[Hashable], job: Job) -> None:
        """Run `job` once a slot is free and no job of `key` runs; None keys never wait for each other.

        Blocks while `limit` jobs are in flight. RuntimeError once closed.
        """
        self._slots.acquire()
        with self._lock:
            if self._closed:
                self._slots.release()
                raise RuntimeError("the in-flight limiter is closed")
            self._accepted += 1
            if key is not None:
                queued = self._waiting.get(key)
                if queued is not None:
                    queued.append(job)
                    return
                self._waiting[key] = deque()
        self._pool.submit(self._run, key, job)

    def _run(self, key: Optional[Hashable], job: Job) -> None:
        while True:
            try:
                job()
            except Exception:  # a job settles its own message; this one left it unacked, it comes back
                log.exception("event=inflight_job_failed key=%s", key)
            finally:
                self._finished()
            if key is None:
                return
            with self._lock:
                queued = self._waiting[key]
                if not queued:
                    del self._waiting[key]
                    return
                job = queued.popleft()

    def _finished(self) -> None:
        with self._lock:
            self._accepted -= 1
            if self._accepted == 0:
                self._settled.notify_all()
        self._slots.release()

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until nothing is in flight; True if so."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._accepted:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settled.wait(left)
            return True

    def close(self, timeout: float) -> bool:
        """Refuse new jobs, wait up to `timeout` seconds for the accepted ones; True if all finished.

        Jobs still running after that run to their end (bounded by the storage timeouts); what
        they cannot settle any more stays unacked and is redelivered.
        """
        with self._lock:
            self._closed = True
        drained = self.drain(timeout)
        self._pool.shutdown(wait=False)
        return drained
