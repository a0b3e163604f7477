"""One writer instance over its share of a partitioned scheduling topic (docs/scaling.md).

The instance owns the partitions `partition_assignment.assign_partitions` gives it. Each owned
partition runs its own SchedulerService (index, snapshot namespace, dedup producer, watermark,
direct consumer of `<topic>-partition-<k>`), built only once the partition's lease is taken. A
partition whose lease another owner still holds (a previous owner that is paused, or still
running during a parallelism change) is claimed again every `retry_s` until it is free; a
partition whose service fails (disk full, a lost lease, a failed send) is stopped and built
again the same way. The instance keeps running while any of this happens: one partition's
trouble never stops the others.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from ..bucket.storage.lease import LeaseBusyError
from ..dedup.publisher import DedupPublisher
from .config import WriterConfig
from .service import Pending, SchedulerService

log = logging.getLogger(__name__)


class FencedPublisher:
    """A DedupPublisher whose sends happen only while the partition's lease is current.

    `check` raises LeaseLostError once another owner took the partition; the release thread then
    dies before sending and the service is rebuilt (and waits for the lease). Everything but the
    sends is the inner publisher's.
    """

    def __init__(self, inner: DedupPublisher, check: Callable[[], None]) -> None:
        self.inner = inner
        self._check = check

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def publish_many(self, topic: str, messages: Any, **kwargs: Any) -> Any:
        """Check the lease, then DedupPublisher.publish_many."""
        self._check()
        return self.inner.publish_many(topic, messages, **kwargs)

    def publish(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        """Check the lease, then DedupPublisher.publish."""
        self._check()
        return self.inner.publish(topic, *args, **kwargs)


class PartitionedWriter:
    """SchedulerService's surface (config, healthy, failure, on_failure, stop) over owned partitions."""

    def __init__(self, config: WriterConfig, owned: Tuple[int, ...],
                 build_partition: Callable[[int], SchedulerService], *, retry_s: float = 1.0) -> None:
        self.config = config
        self.owned = owned
        self._build = build_partition
        self._retry_s = retry_s
        self._services: Dict[int, SchedulerService] = {}
        self._waiting: Dict[int, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.failure: Optional[BaseException] = None
        self.on_failure: Optional[Callable[[], None]] = None

    def start(self) -> "PartitionedWriter":
        """Claim every owned partition once now, then keep claiming in the background."""
        if not self.owned:
            log.warning("event=writer_owns_no_partition reason=more_instances_than_partitions")
        self._claim_round()
        self._thread = threading.Thread(target=self._run, name="partition-claimer", daemon=True)
        self._thread.start()
        return self

    @property
    def services(self) -> Dict[int, SchedulerService]:
        """The running partition services, by partition index (a copy)."""
        with self._lock:
            return dict(self._services)

    @property
    def waiting(self) -> Dict[int, str]:
        """Partitions not running yet, with the reason (a copy)."""
        with self._lock:
            return dict(self._waiting)

    @property
    def healthy(self) -> bool:
        """False only when the claimer itself died; partition failures are retried inside."""
        return self.failure is None and not self._stop.is_set()

    def _claim_round(self) -> None:
        for k in self.owned:
            if self._stop.is_set():
                return
            with self._lock:
                svc = self._services.get(k)
            if svc is not None and svc.healthy:
                continue
            if svc is not None:
                log.error("event=partition_restart partition=%d reason=%r", k, svc.failure)
                with self._lock:
                    del self._services[k]
                svc.stop()
            try:
                built = self._build(k)
            except LeaseBusyError as exc:
                with self._lock:
                    first = k not in self._waiting
                    self._waiting[k] = str(exc)
                if first:
                    log.info("event=partition_lease_wait partition=%d reason=%s", k, exc)
                continue
            except Exception as exc:  # retried next round; the error names the problem
                with self._lock:
                    self._waiting[k] = repr(exc)
                log.error("event=partition_start_failed partition=%d error=%r", k, exc)
                continue
            with self._lock:
                if self._stop.is_set():
                    stop_now = True
                else:
                    stop_now = False
                    self._services[k] = built
                    self._waiting.pop(k, None)
            if stop_now:
                built.stop()
                return
            log.info("event=partition_started partition=%d", k)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._retry_s):
                self._claim_round()
        except BaseException as exc:  # surfaced through .failure: the function rebuilds the writer
            self.failure = exc
            log.exception("event=partition_claimer_failed error=%r", exc)
            if self.on_failure is not None:
                self.on_failure()

    def submit(self, pending: Pending) -> None:
        """Runtime intake is not available with a partitioned scheduling topic."""
        raise ValueError("schedulingTopicPartitions > 0: the scheduling topic must not be a function input "
                         "(each partition's direct consumer takes its messages); remove it from inputs")

    def stop(self) -> None:
        """Stop claiming, then stop every partition service (each releases its lease)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._lock:
            services = list(self._services.values())
            self._services.clear()
        for svc in services:
            svc.stop()
