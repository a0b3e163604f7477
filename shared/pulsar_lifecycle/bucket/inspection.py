"""A read-only view of a bucket index's store: what `pulsar-lifecycle inspect writer` shows.

It reads what recovery reads, with recovery's own readers (`recovery.py`): the journal, the
manifest, the release cursor and, per bucket, its metadata and first unreleased segment. It
writes nothing (the journal is read with `journal_peek`, which never repairs a torn tail), so
it is safe while the writer runs. A writer that seals or merges meanwhile may delete a
snapshot the view is about to read; the view then starts over (at most `attempts` times).

The journal is read before the manifest: a seal writes its snapshot, then the manifest (with
the journal cut), then truncates the journal, so items a concurrent seal moves are found in the
snapshot or in the journal, and never counted twice (the replay skips records at or below the
cut). The cursor is read last, so nothing released before the view ends counts as pending.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .bitmap import LedgerBitmaps
from .positions import decode
from .recovery import RecoveryCounters, read_cursor, read_manifest, recover_bucket, replay_journal
from .storage.base import BucketSnapshotStorage, JournalPeek, SnapshotNotFoundError, StorageError

log = logging.getLogger(__name__)

__all__ = ["BucketView", "IndexView", "MessagePosition", "view_index"]


@dataclass(frozen=True)
class MessagePosition:
    """A scheduling message's position: ledger, entry and batch index."""

    ledger_id: int
    entry_id: int
    batch_index: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}"


@dataclass(frozen=True)
class BucketView:
    """One bucket: an immutable (sealed) one from a snapshot, or the mutable one (the journal)."""

    bucket_id: Optional[int]  # None for the mutable bucket
    key: str
    sealed: bool
    start_ledger: int  # ledger range of its items (-1: none)
    end_ledger: int
    indexes: int  # items written into the snapshot (the mutable bucket: items it holds)
    pending: int  # items not released yet
    snapshot_bytes: int  # 0 for the mutable bucket
    first_release_ms: Optional[int]  # earliest release time of its pending items
    last_release_ms: Optional[int]  # latest release time of its pending items


@dataclass(frozen=True)
class IndexView:
    """The whole index as its store holds it."""

    index_id: Optional[str]
    pending: int  # indexed, not released (cancelled ones included: they are skipped at release)
    cancelled: int  # pending items with a tombstone
    early_cancels: int  # tombstones of messages not indexed yet (a cancel that overtook its message)
    buckets: List[BucketView]
    next_release_ms: Optional[int]  # release time of the next item
    oldest_pending: Optional[MessagePosition]  # the pending message with the lowest position
    committed_seq: int  # sequence id of the last release made durable
    watermark_release_ms: Optional[int]  # release time of the last committed release
    journal_records: int
    pending_deletions: List[int] = field(default_factory=list)  # snapshots removed, deletion pending

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of every live snapshot."""
        return sum(b.snapshot_bytes for b in self.buckets)


def view_index(storage: BucketSnapshotStorage, attempts: int = 5) -> IndexView:
    """The view of `storage` (see the module docstring); StorageError when it keeps changing
    under the view or cannot be read."""
    last: Optional[Exception] = None
    for attempt in range(attempts):
        try:
            return _view_once(storage)
        except SnapshotNotFoundError as exc:  # sealed or merged meanwhile: read again
            last = exc
            log.info("event=index_view_retry attempt=%d reason=%s", attempt + 1, exc)
    raise StorageError(f"the index changed under every one of {attempts} reads (last: {last}); try again")


def _journal(storage: BucketSnapshotStorage) -> List[Tuple[int, bytes]]:
    if isinstance(storage, JournalPeek):
        return storage.journal_peek()
    raise StorageError(f"{storage!r} cannot read its journal without writing; it cannot be inspected")


def _view_once(storage: BucketSnapshotStorage) -> IndexView:
    counters = RecoveryCounters()
    records = _journal(storage)
    manifest = read_manifest(storage, counters)
    cursor = read_cursor(storage, counters)
    watermark = cursor.committed_key if cursor is not None else None
    pending = LedgerBitmaps()
    buckets: List[BucketView] = []
    heads: List[int] = []
    for ref in manifest.refs:
        before = len(pending)
        bucket = recover_bucket(storage, ref, watermark, pending, counters)
        if bucket is None:
            continue  # exhausted: every item released (the writer deletes it)
        first = bucket.head()[0] if bucket.seg is not None else int(bucket.seg_min[bucket.cur])
        heads.append(first)
        buckets.append(BucketView(
            bucket_id=bucket.bucket_id, key=bucket.key, sealed=True, start_ledger=bucket.start_ledger,
            end_ledger=bucket.end_ledger, indexes=bucket.index_count, pending=len(pending) - before,
            snapshot_bytes=bucket.snapshot_length, first_release_ms=first,
            last_release_ms=int(bucket.seg_max[bucket.nseg - 1]) if bucket.nseg else None))
    seen = manifest.seen
    tombstones = manifest.tombstones
    journal = replay_journal(records, manifest.journal_cut, watermark, seen, pending, tombstones, counters)
    times = [item[0] for item in journal.items]
    if times:
        heads.append(min(times))
    buckets.append(BucketView(
        bucket_id=None, key="mutable", sealed=False, start_ledger=journal.start, end_ledger=journal.end,
        indexes=len(journal.items), pending=len(journal.items), snapshot_bytes=0,
        first_release_ms=min(times) if times else None, last_release_ms=max(times) if times else None))
    oldest = next(iter(pending.items()), None)
    return IndexView(
        index_id=storage.get_index_id(),
        pending=len(pending),
        cancelled=len(tombstones.intersection(pending)),
        early_cancels=len(tombstones.difference(seen)),
        buckets=buckets,
        next_release_ms=min(heads) if heads else None,
        oldest_pending=MessagePosition(oldest[0], *decode(oldest[1])) if oldest is not None else None,
        committed_seq=cursor.seq if cursor is not None else 0,
        watermark_release_ms=watermark[0] if watermark is not None else None,
        journal_records=journal.used,
        pending_deletions=sorted(manifest.pending_delete),
    )
