"""PartitionedWriter's claiming (busy leases retried, failed partitions rebuilt) and FencedPublisher."""
from __future__ import annotations

import threading
import time
from typing import Dict, List

import pytest

from pulsar_lifecycle.bucket.storage.lease import LeaseBusyError, LeaseLostError
from pulsar_lifecycle.scheduler.config import WriterConfig
from pulsar_lifecycle.scheduler.partitioned import FencedPublisher, PartitionedWriter
from support.helpers import wait_for


class _Service:
    """The part of SchedulerService the writer uses."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.failure = None
        self.stopped = False

    @property
    def healthy(self) -> bool:
        return self.failure is None and not self.stopped

    def stop(self) -> None:
        self.stopped = True


def test_busy_partitions_are_claimed_later_and_failed_ones_rebuilt():
    freed = threading.Event()  # partition 1's lease: held by another owner until set
    built: Dict[int, List[_Service]] = {}

    def build(k: int) -> _Service:
        if k == 1 and not freed.is_set():
            raise LeaseBusyError(f"partition {k} held by another owner")
        svc = _Service(k)
        built.setdefault(k, []).append(svc)
        return svc

    writer = PartitionedWriter(WriterConfig(), (0, 1), build, retry_s=0.05).start()
    try:
        assert sorted(writer.services) == [0]
        assert "held by another owner" in writer.waiting[1]
        time.sleep(0.2)  # claimed again a few times meanwhile, still busy
        assert sorted(writer.services) == [0]
        freed.set()
        assert wait_for(lambda: sorted(writer.services) == [0, 1], timeout=5)
        assert writer.waiting == {}
        # A partition whose service died is stopped and built again; the other is left alone.
        first = built[0][0]
        first.failure = RuntimeError("disk full")
        assert wait_for(lambda: len(built[0]) == 2, timeout=5)
        assert first.stopped and writer.services[0] is built[0][1]
        assert built[1] == [writer.services[1]]
        assert writer.healthy
    finally:
        writer.stop()
    assert all(s.stopped for svcs in built.values() for s in svcs)
    assert not writer.healthy


def test_no_partitions_owned_is_idle_not_an_error():
    writer = PartitionedWriter(WriterConfig(), (), lambda k: _Service(k), retry_s=0.05).start()
    time.sleep(0.1)
    assert writer.healthy and writer.services == {}
    writer.stop()


def test_fenced_publisher_checks_before_every_send():
    sent = []

    class Inner:
        def publish_many(self, topic, messages):
            sent.append((topic, list(messages)))
            return []

        def persisted_seq(self, topic):
            return 7

    lost = []

    def check() -> None:
        if lost:
            raise LeaseLostError("taken over")

    pub = FencedPublisher(Inner(), check)
    pub.publish_many("t", ["m1"])
    assert pub.persisted_seq("t") == 7  # everything else is the inner publisher's
    lost.append(True)
    with pytest.raises(LeaseLostError):
        pub.publish_many("t", ["m2"])
    assert sent == [("t", ["m1"])]
