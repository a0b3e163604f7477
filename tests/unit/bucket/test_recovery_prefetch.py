"""recover() reads the buckets' metadata with a bounded pool (prefetch_metadata): same result as
one read at a time, reads overlap, at most METADATA_READ_THREADS at once, errors surface."""
from __future__ import annotations

import threading
import time

import pytest

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, recovery
from pulsar_lifecycle.bucket.storage import StorageError
from pulsar_lifecycle.bucket.storage.memory import MemorySnapshotStorage

BASE = 1_900_000_000_000


def seeded(buckets: int = 12):
    st = MemorySnapshotStorage()
    ix = BucketIndex(st, BucketConfig(max_unacked_per_bucket=50))
    ix.recover()
    for b in range(buckets):
        ix.add([DelayedMessage(1 + b, e, 0, BASE + e * 1000 + b, b"x") for e in range(50)])
    ix.seal()
    assert len(ix.bucket_ids()) >= buckets
    return st, ix.pending_count()


class SlowReads:
    """Wraps a storage: each metadata read takes `delay` s; counts reads running at once."""

    def __init__(self, inner, delay: float = 0.02) -> None:
        self.inner, self.delay = inner, delay
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.fail = None

    def get_metadata(self, bucket_id: int) -> bytes:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.delay)
            if bucket_id == self.fail:
                raise StorageError(f"bucket {bucket_id}: read failed")
            return self.inner.get_metadata(bucket_id)
        finally:
            with self.lock:
                self.running -= 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_recovery_with_concurrent_metadata_reads_matches_and_is_bounded(monkeypatch):
    st, pending = seeded()
    monkeypatch.setattr(recovery, "METADATA_READ_THREADS", 4)
    slow = SlowReads(st)
    ix = BucketIndex(slow, BucketConfig(max_unacked_per_bucket=50))  # type: ignore[arg-type]
    t0 = time.monotonic()
    report = ix.recover()
    took = time.monotonic() - t0
    assert ix.pending_count() == pending and report.metadata_reads == report.buckets >= 12
    assert 2 <= slow.most <= 4  # overlapped, and bounded
    assert took < report.buckets * slow.delay  # one at a time would take at least this long
    popped = ix.pop_due(BASE + 10**9, 10**6)
    assert len(popped) == pending and [r.seq for r in popped] == sorted(r.seq for r in popped)


def test_a_failed_metadata_read_fails_recovery(monkeypatch):
    st, _ = seeded(6)
    slow = SlowReads(st, delay=0.005)
    slow.fail = sorted(st.list_snapshots())[3]
    with pytest.raises(StorageError, match="read failed"):
        BucketIndex(slow, BucketConfig(max_unacked_per_bucket=50)).recover()  # type: ignore[arg-type]
