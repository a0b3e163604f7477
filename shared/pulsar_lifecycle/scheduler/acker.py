"""`BackgroundAcker`: acknowledges durable intake batches on its own thread.

pulsar-client's Python `acknowledge` is synchronous: it releases the GIL, waits for the client and
takes the GIL back, which behind the busy release thread costs ~18 us per message. Done on the
intake thread that was a quarter of its time (docs/benchmarks.md), time in which it could take and
journal the next batch. So the intake thread hands a batch that is durable to this thread and goes
on. Nothing changes for correctness: only batches already durable are handed over, and whatever
is not acked when the process dies is redelivered and dropped by the index as a duplicate.

The queue is bounded (backpressure on the intake thread). `drain()` waits until everything
handed over is acked (the stall watchdog re-subscribes only then); a failed ack is raised to the
intake thread by the next `submit()`/`raise_if_failed()`, which stops the service like a failed
inline ack did.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

MAX_QUEUED_BATCHES = 4


class BackgroundAcker:
    """One thread acking (consumer, messages) jobs in the order they were submitted."""

    def __init__(self, name: str = "bucket-ack", max_queued: int = MAX_QUEUED_BATCHES) -> None:
        self._jobs: "queue.Queue[Optional[Tuple[Any, Sequence[Any]]]]" = queue.Queue(maxsize=max_queued)
        self._cond = threading.Condition()
        self._unfinished = 0  # jobs submitted and not yet done
        self._error: Optional[BaseException] = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, consumer: Any, messages: Sequence[Any]) -> None:
        """Ack `messages` on `consumer` soon (they must be durable already); blocks while full."""
        self.raise_if_failed()
        if self._closed:
            raise RuntimeError("acker closed")
        with self._cond:
            self._unfinished += 1
        self._jobs.put((consumer, messages))

    def raise_if_failed(self) -> None:
        """Raise the first ack failure (the service then stops and is rebuilt)."""
        if self._error is not None:
            raise RuntimeError(f"acknowledging durable scheduling messages failed: {self._error!r}") from self._error

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted is acked (or failed); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._unfinished:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    @property
    def idle(self) -> bool:
        """Nothing submitted is waiting to be acked."""
        return self._unfinished == 0

    def close(self, timeout_s: float = 30.0) -> None:
        """Ack what was submitted, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        if not self.drain(timeout_s):
            log.warning("event=intake_acks_not_drained pending_batches=%d reason='left unacked: redelivered and "
                        "dropped as duplicates'", self._unfinished)
        self._jobs.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            consumer, messages = job
            try:
                if self._error is None:
                    ack = consumer.acknowledge
                    for m in messages:
                        ack(m)
            except Exception as exc:  # raised to the intake thread; the messages are redelivered
                self._error = exc
                log.error("event=intake_ack_failed messages=%d error=%r", len(messages), exc)
            finally:
                with self._cond:
                    self._unfinished -= 1
                    if self._unfinished == 0:
                        self._cond.notify_all()
