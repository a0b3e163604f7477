"""bucket/inspection.py: the read-only view of an index's store agrees with the engine, and
reading it changes nothing (a torn journal tail is left as it is)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, MemorySnapshotStorage
from pulsar_lifecycle.bucket.inspection import view_index
from pulsar_lifecycle.bucket.records import index_id
from pulsar_lifecycle.bucket.storage.directory import DirectorySnapshotStorage


def msg(ledger: int, entry: int, at: int) -> DelayedMessage:
    """Message `entry` of `ledger`, unbatched (index id = entry << 10, records.index_id)."""
    return DelayedMessage(ledger_id=ledger, entry_id=index_id(entry, 0), partition=-1, deliver_at=at,
                          payload=b"p%d" % entry)


def fill(storage) -> BucketIndex:
    """Six messages in two sealed buckets and the mutable one, two released and committed, one cancelled."""
    ix = BucketIndex(storage, BucketConfig(max_unacked_per_bucket=2))
    ix.recover()
    ix.add([msg(1, 1, 100), msg(1, 2, 500)])
    ix.add([msg(2, 1, 200), msg(2, 2, 600)])
    ix.add([msg(3, 1, 300), msg(3, 2, 700)])
    released = ix.pop_due(250, 10)
    assert [r.release_ts for r in released] == [100, 200]
    ix.commit(released[-1].seq)
    ix.cancel(3, index_id(2, 0))
    return ix


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["memory", "directory"])
def test_the_view_agrees_with_the_engine(tmp_path, kind):
    storage = MemorySnapshotStorage() if kind == "memory" else DirectorySnapshotStorage(tmp_path / "store")
    ix = fill(storage)
    stats = ix.stats()
    view = view_index(storage)
    assert view.pending == stats.pending == 4
    assert view.cancelled == 1 and view.early_cancels == 0
    assert view.next_release_ms == 300
    assert str(view.oldest_pending) == "1:2:0"
    assert view.committed_seq == stats.committed_seq
    assert view.watermark_release_ms == 200
    sealed = [b for b in view.buckets if b.sealed]
    assert len(sealed) == stats.immutable_buckets and view.snapshot_bytes == stats.snapshot_size_bytes
    assert sum(b.pending for b in view.buckets) == 4
    assert view.index_id == storage.get_index_id()


def test_reading_writes_nothing_not_even_a_torn_journal_tail(tmp_path):
    root = tmp_path / "store"
    storage = DirectorySnapshotStorage(root)
    fill(storage)
    storage.journal_append(b"")  # one more record, then a torn one (an append in progress)
    with open(root / "journal.log", "ab") as fh:
        fh.write(b"\x10\x00\x00\x00torn")
    before = tree(root)
    reader = DirectorySnapshotStorage(root)
    view_index(reader)
    assert tree(root) == before
    assert len(reader.journal_peek()) == len(DirectorySnapshotStorage(root).journal_peek())
