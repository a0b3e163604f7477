"""Recovery of a bucket index from its storage (Pulsar's recoverBucketSnapshot and
ImmutableBucket.asyncRecoverBucketSnapshotEntry): the release cursor, the manifest, per bucket its
metadata (entry 0) and the first segment with items after the committed watermark, and the
journal of the mutable bucket. Never reads the whole backlog.

Each step reads the storage and returns plain records; the index puts them together.
"""
from __future__ import annotations

import logging
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from pyroaring import BitMap

from .bitmap import LedgerBitmaps, deserialize_bitmap, union_bitmaps
from .codec import (
    Item,
    JournalRecord,
    Manifest,
    ReleaseCursor,
    SnapshotMetadata,
    frame,
    index_id_of,
    index_item,
    parse,
    parse_segment,
    upgrade_index,
)
from .immutable_bucket import ImmutableBucket
from .manifest import MANIFEST_FORMAT_VERSION, sets_are_packed
from .packed import PackedSegment
from .records import ReleaseKey
from .segments import packed_id_bitmaps
from .storage import BucketSnapshotStorage, StorageError

log = logging.getLogger(__name__)


@dataclass
class RecoveryCounters:
    """Storage reads made by a recovery (for the RecoveryReport)."""

    metadata: int = 0
    segments: int = 0
    loaded: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class CursorState:
    """The persisted release cursor: watermark (key, seq) and the release-time horizon."""

    committed_key: Optional[ReleaseKey]
    seq: int
    horizon: int

    @property
    def ts_floor(self) -> int:
        """New items get timestamps above this: nothing published before the crash can follow them."""
        return max(self.horizon, self.committed_key[0] if self.committed_key else 0)


@dataclass
class ManifestState:
    """The manifest: buckets in index order, item sets, journal cut, ids."""

    refs: List[Any]  # BucketRef
    pending_delete: Dict[int, str]  # id -> key ("" : unknown)
    seen: LedgerBitmaps = field(default_factory=LedgerBitmaps)
    tombstones: LedgerBitmaps = field(default_factory=LedgerBitmaps)
    journal_cut: int = 0
    max_bucket_id: int = 0


@dataclass
class JournalReplay:
    """The mutable bucket rebuilt from the journal."""

    items: List[Item]  # not yet released (after the watermark), unordered
    used: int  # records after the journal cut
    journal_last: int  # highest record id seen
    start: int = -1  # ledger range of `items`' ledgers (-1: none)
    end: int = -1


def read_cursor(storage: BucketSnapshotStorage, counters: RecoveryCounters) -> Optional[CursorState]:
    """The release cursor, or None for a storage that never had one."""
    raw = storage.get_cursor()
    if raw is None:
        return None
    counters.bytes += len(raw)
    cur = parse(ReleaseCursor, raw, "release cursor")
    key = (cur.ts, cur.ledger_id, cur.entry_id) if cur.has_watermark else None
    return CursorState(committed_key=key, seq=cur.seq, horizon=cur.horizon)


def read_manifest(storage: BucketSnapshotStorage, counters: RecoveryCounters) -> ManifestState:
    """The manifest (an empty one for a new storage)."""
    raw = storage.get_manifest()
    if raw is None:
        return ManifestState([], {})
    counters.bytes += len(raw)
    man = parse(Manifest, raw, "bucket manifest")
    if man.format_version > MANIFEST_FORMAT_VERSION:
        raise StorageError(f"bucket manifest format {man.format_version} is newer than supported "
                           f"({MANIFEST_FORMAT_VERSION})")
    packed = sets_are_packed(man)
    return ManifestState(
        refs=list(man.buckets),
        pending_delete={bid: "" for bid in man.pending_delete},
        seen=LedgerBitmaps.from_proto_map(man.seen, "manifest seen-set", packed=packed),
        tombstones=LedgerBitmaps.from_proto_map(man.tombstones, "manifest tombstones", packed=packed),
        journal_cut=man.journal_cut,
        max_bucket_id=man.max_bucket_id,
    )


# Metadata reads recovery keeps in flight: a BookKeeper table-service read is two round trips
# (info + entry 0), so 64 buckets read one by one cost 0.24-0.42 s before the first release. A
# few threads overlap them with the decoding of the buckets already read; the bound keeps the
# table service (and a small disk) from a burst of one read per bucket.
METADATA_READ_THREADS = 8


def prefetch_metadata(storage: BucketSnapshotStorage, refs: Sequence[Any],
                      threads: Optional[int] = None) -> Iterator[bytes]:
    """The metadata (entry 0) of each of `refs`' buckets, in order, read by up to `threads`
    threads at once while the caller decodes the earlier ones. A read's error is raised when its
    bucket's turn comes (the reads still running are cancelled or awaited first)."""
    threads = METADATA_READ_THREADS if threads is None else threads
    if len(refs) <= 1 or threads <= 1:
        for ref in refs:
            yield storage.get_metadata(ref.bucket_id)
        return
    pool = ThreadPoolExecutor(max_workers=min(threads, len(refs)), thread_name_prefix="recover-metadata")
    futures: List[Future] = []
    try:
        futures = [pool.submit(storage.get_metadata, ref.bucket_id) for ref in refs]
        for fut in futures:
            yield fut.result()
    finally:
        for fut in futures:
            fut.cancel()
        pool.shutdown(wait=True)


def recover_bucket(storage: BucketSnapshotStorage, ref: Any, watermark: Optional[ReleaseKey],
                   pending: LedgerBitmaps, counters: RecoveryCounters,
                   raw: Optional[bytes] = None) -> Optional[ImmutableBucket]:
    """One bucket of the manifest, positioned at its first item after `watermark`, its unreleased
    items added to `pending`; None when every item is at or before the watermark (exhausted).
    `raw` is its metadata when already read (prefetch_metadata)."""
    bid = ref.bucket_id
    if raw is None:
        raw = storage.get_metadata(bid)
    counters.metadata += 1
    counters.bytes += len(raw)
    meta = parse(SnapshotMetadata, raw, f"bucket {bid} metadata")
    seg_min = array("Q", (m.min_schedule_timestamp for m in meta.metadata_list))
    seg_max = array("Q", (m.max_schedule_timestamp for m in meta.metadata_list))
    w = watermark
    n = len(seg_max)
    # Skip segments entirely at or before the watermark (Pulsar skips segments whose
    # max_schedule_timestamp <= cutoff; ours is the committed release key).
    i = 0
    if w is not None:
        while i < n and seg_max[i] < w[0]:
            i += 1
    if i == 0 and n and (w is None or seg_min[0] > w[0]):
        whole = _whole_bucket(bid, meta)  # nothing of it was released: the bucket's own sets will do
        if whole is not None:
            counts, per_ledger = whole
            bucket = _bucket(ref, seg_min, seg_max, counts)
            for ledger, bm in per_ledger.items():
                pending.update_ledger_packed(ledger, bm)
            bucket.cur, bucket.remaining = 0, int(sum(counts))
            return bucket  # lazily: its first segment is read when its placeholder is due
    bitmaps: List[Dict[int, BitMap]] = []
    counts = array("Q")
    for k, sm in enumerate(meta.metadata_list):
        # One bit per message, as packed ids (layout 3 stores them so; older layouts converted).
        try:
            per_ledger = packed_id_bitmaps(sm)
        except ValueError as exc:
            raise StorageError(f"bucket {bid} segment {k + 1} {exc}") from exc
        bitmaps.append(per_ledger)
        counts.append(sum(len(b) for b in per_ledger.values()))
    bucket = _bucket(ref, seg_min, seg_max, counts)
    if i < n and (w is None or bucket.seg_min[i] > w[0]):
        return _recover_lazily(bucket, i, bitmaps, counts, pending)
    while i < n:
        # A segment whose max timestamp equals the watermark's may end at or before it:
        # fetch the next one in the same call so recovery stays one read per bucket.
        last = i + 1 if (w is not None and bucket.seg_max[i] == w[0] and i + 1 < n) else i
        datas = storage.get_segments(bid, i + 1, last + 1)
        counters.segments += 1
        for k, data in enumerate(datas):
            counters.bytes += len(data)
            seg = PackedSegment.parse(data, f"bucket {bid} segment {i + k + 1}")
            bucket.cur = i + k
            if bucket.use_segment(seg, w):
                counters.loaded += 1
                break
        if bucket.seg is not None:
            break
        i = last + 1
    if bucket.seg is None:
        return None  # every item is at or before the watermark: exhausted
    seg = bucket.seg
    loaded: Dict[int, List[int]] = {}
    for r in range(bucket.pos, len(seg)):
        loaded.setdefault(seg.ledger[r], []).append(seg.entry[r])
    for ledger, entries in loaded.items():
        pending.add_many(ledger, entries)
    bucket.remaining = len(seg) - bucket.pos
    _pending_from_bitmaps(bucket, bucket.cur + 1, bitmaps, counts, pending)
    return bucket


def _bucket(ref: Any, seg_min: array, seg_max: array, counts: array) -> ImmutableBucket:
    return ImmutableBucket(bucket_id=ref.bucket_id, key=ref.bucket_key, start_ledger=ref.start_ledger_id,
                           end_ledger=ref.end_ledger_id, seg_min=seg_min, seg_max=seg_max, seg_count=counts,
                           snapshot_length=ref.snapshot_length, index_count=ref.index_count)


def _whole_bucket(bid: int, meta: Any) -> Optional[Tuple[array, Dict[int, BitMap]]]:
    """(count per segment, ledger -> packed ids of the whole bucket) from the metadata's
    extension fields, or None when the snapshot has none (written before them) or they disagree
    with each other (the segments' own bitmaps are used then; they are what Pulsar reads)."""
    n = len(meta.metadata_list)
    if len(meta.segment_count) != n or not len(meta.packed_index_bit_map):
        return None
    counts = array("Q", meta.segment_count)
    try:
        per_ledger = {ledger: deserialize_bitmap(data) for ledger, data in meta.packed_index_bit_map.items()}
    except ValueError as exc:
        log.warning("event=bucket_whole_bitmap_unreadable bucket=%d error=%r action='segment bitmaps used'", bid, exc)
        return None
    total = sum(len(bm) for bm in per_ledger.values())
    if total != sum(counts):
        log.warning("event=bucket_whole_bitmap_mismatch bucket=%d ids=%d counted=%d action='segment bitmaps used'",
                    bid, total, sum(counts))
        return None
    return counts, per_ledger


def _recover_lazily(bucket: ImmutableBucket, first: int, bitmaps: List[Dict[int, BitMap]], counts: array,
                    pending: LedgerBitmaps) -> ImmutableBucket:
    """A bucket whose segments from `first` on all lie after the watermark: nothing of it
    was released, so its pending items are exactly those segments' bitmaps, and its first
    segment is read only when its placeholder reaches the top of the queue (load_current),
    as after a segment is drained. Recovery then reads no segment of such buckets: a writer
    started on a seeded store of N buckets would otherwise hold N decoded segments before
    its first release. (The index queues its placeholder: `seg` stays None.)"""
    bucket.cur = first
    _pending_from_bitmaps(bucket, first, bitmaps, counts, pending)
    return bucket


def _pending_from_bitmaps(bucket: ImmutableBucket, first: int, bitmaps: List[Dict[int, BitMap]], counts: array,
                          pending: LedgerBitmaps) -> None:
    """Segments `first`.. of `bucket` are unreleased: their (packed) id bitmaps join the pending
    set and their counts the bucket's remaining items."""
    later: Dict[int, list] = {}
    for k in range(first, bucket.nseg):
        for ledger, bm in bitmaps[k].items():
            later.setdefault(ledger, []).append(bm)
        bucket.remaining += counts[k]
    for ledger, bms in later.items():  # one union per ledger, then one merge into the large pending set
        pending.update_ledger_packed(ledger, union_bitmaps(bms))


def replay_journal(records: List[Tuple[int, bytes]], journal_cut: int, watermark: Optional[ReleaseKey],
                   seen: LedgerBitmaps, pending: LedgerBitmaps, tombstones: LedgerBitmaps,
                   counters: RecoveryCounters) -> JournalReplay:
    """Replay the journal records after `journal_cut`: items into `seen` (and, when after the
    watermark, `pending` and the returned items), cancels into `tombstones`."""
    w = watermark
    out = JournalReplay(items=[], used=0, journal_last=journal_cut)
    replayed: Set[Tuple[int, int]] = set()
    seen_add: Dict[int, List[int]] = {}
    pending_add: Dict[int, List[int]] = {}
    for rid, raw in records:
        if rid <= journal_cut:
            continue  # already covered by a snapshot (crash between manifest and truncate)
        out.used += 1
        counters.bytes += len(raw)
        rec = parse(JournalRecord, raw, f"journal record {rid}")
        if rec.add:
            # The add field is wire-identical to SnapshotSegment.indexes: decode all at once.
            indexes = parse_segment(raw, f"journal record {rid} items").indexes
            for idx, blob in zip(indexes, rec.add):
                ledger, entry = idx.ledger_id, index_id_of(idx)
                # The manifest's seen-set may already hold journal items (any manifest write
                # after the last seal includes them); within the journal the first record wins.
                if (ledger, entry) in replayed:
                    continue
                replayed.add((ledger, entry))
                seen_add.setdefault(ledger, []).append(entry)
                key = (idx.timestamp, ledger, entry)
                if w is not None and key <= w:
                    continue  # released and committed before the restart
                # A layout-1 record is rewritten in layout 2 here, so the next seal writes it so.
                out.items.append(index_item(idx) if upgrade_index(idx) else (key[0], ledger, entry, frame(blob)))
                pending_add.setdefault(ledger, []).append(entry)
        for op in rec.cancel:
            tombstones.add(op.ledger_id, op.entry_id)
        out.journal_last = max(out.journal_last, rid)
    for ledger, entries in seen_add.items():
        seen.add_many(ledger, entries)
    for ledger, entries in pending_add.items():
        pending.add_many(ledger, entries)
    if pending_add:
        out.start, out.end = min(pending_add), max(pending_add)
    return out
