"""Cutting a key-ordered stream of items into PIP-195 snapshot segments.

Pulsar's rule (MutableBucket.createImmutableBucketAndAsyncPersistent): the first index of a
segment sets `upper = ts + timeStepMs - 1`; after appending an index the segment is closed when
there is no next index, or the next index's timestamp > upper, or (maxIndexes != -1 and the
segment holds >= maxIndexes). Each closed segment gets min/max schedule timestamps and one
run-optimized RoaringBitmap of entry ids per ledger — real entry ids, what Pulsar's
containsMessage(ledgerId, entryId) looks up — plus our extension map of packed index ids per
ledger (`packed_index_bit_map`, one bit per message; see codec.py for the layouts).
"""
from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from pyroaring import BitMap

from .bitmap import deserialize_bitmap, entry_bitmap, pack_bitmap, pack_ids, serialize_bitmap, union_bitmaps
from .codec import Item, SnapshotMetadata, SnapshotSegmentMetadata
from .packed import PackedItems
from .records import ReleaseKey


@dataclass
class CutSegment:
    """One closed segment: its entry bytes and its SnapshotSegmentMetadata."""

    data: bytes
    metadata: "SnapshotSegmentMetadata"
    count: int
    first_key: ReleaseKey
    last_key: ReleaseKey

    @property
    def min_ts(self) -> int:
        """min_schedule_timestamp."""
        return self.first_key[0]

    @property
    def max_ts(self) -> int:
        """max_schedule_timestamp."""
        return self.last_key[0]


class SegmentCutter:
    """Streaming cutter (the engine's merges): push items in strictly increasing key order,
    collect closed segments.

    Checking the cut condition before appending the next item is the same rule as Pulsar's
    check after appending with a look-ahead at the next one, and as cut_bounds (batch form,
    used by cut_segments and the Spark seeder; tests/unit/bucket/test_bucket_units.py checks they agree).
    """

    def __init__(self, time_step_ms: int, max_indexes: int) -> None:
        check_cut_args(time_step_ms, max_indexes)
        self.time_step_ms = time_step_ms
        self.max_indexes = max_indexes
        self._frames: List[bytes] = []
        self._entries: Dict[int, List[int]] = {}
        self._upper = 0
        self._first: Optional[ReleaseKey] = None
        self._last: Optional[ReleaseKey] = None
        self.total = 0

    def push(self, item: Item) -> Optional[CutSegment]:
        """Append one item (ts, ledger, index id, layout-2 framed bytes); returns the segment
        this push closed, if any."""
        ts, ledger, entry, framed = item
        key = (ts, ledger, entry)
        if self._last is not None and key <= self._last:
            raise ValueError(f"items must arrive in increasing release-key order: {key} after {self._last}")
        closed = None
        if self._frames and (
            ts > self._upper or (self.max_indexes != -1 and len(self._frames) >= self.max_indexes)
        ):
            closed = self._close()
        if not self._frames:
            self._first = key
            self._upper = ts + self.time_step_ms - 1
        self._frames.append(framed)
        entries = self._entries.get(ledger)
        if entries is None:
            self._entries[ledger] = [entry]
        else:
            entries.append(entry)
        self._last = key
        self.total += 1
        return closed

    def finish(self) -> Optional[CutSegment]:
        """Close the open segment (if any) and return it."""
        return self._close() if self._frames else None

    def _close(self) -> CutSegment:
        assert self._first is not None and self._last is not None  # set by the segment's first add
        seg = make_segment(b"".join(self._frames), len(self._frames), self._first, self._last,
                           {ledger: BitMap(ids) for ledger, ids in self._entries.items()})
        self._frames = []
        self._entries = {}
        return seg


def check_cut_args(time_step_ms: int, max_indexes: int) -> None:
    """ValueError unless the segment time step and size limit are usable."""
    if time_step_ms <= 0:
        raise ValueError(f"segment time step must be > 0 ms, got {time_step_ms}")
    if max_indexes == 0 or max_indexes < -1:
        raise ValueError(f"max indexes per segment must be > 0 or -1, got {max_indexes}")


def cut_bounds(ts: Sequence[int], time_step_ms: int, max_indexes: int) -> List[Tuple[int, int]]:
    """Pulsar's cutting rule over the release-key timestamps of items in key order: the
    [start, end) index ranges of the segments. A segment starting at `s` ends before the first
    item with ts > ts[s] + time_step_ms - 1, or after `max_indexes` items (-1: no limit).
    O(segments * log n): `ts` may be a list or a numpy array (the Spark seeder's columns)."""
    check_cut_args(time_step_ms, max_indexes)
    n = len(ts)
    out = []
    start = 0
    while start < n:
        hi = n if max_indexes == -1 else min(n, start + max_indexes)
        end = bisect_right(ts, ts[start] + time_step_ms - 1, start + 1, hi)
        out.append((start, end))
        start = end
    return out


def make_segment(data: bytes, count: int, first_key: ReleaseKey, last_key: ReleaseKey,
                 index_ids: Mapping[int, BitMap], entry_ids: Optional[Mapping[int, BitMap]] = None,
                 packed_ids: Optional[Mapping[int, BitMap]] = None) -> CutSegment:
    """A closed segment: its joined framed items and its metadata (min/max schedule timestamps,
    per ledger the bitmap of real entry ids and our bitmap of packed index ids). `entry_ids` and
    `packed_ids` may be given when the caller has them already (derived from each index-id
    bitmap otherwise: entry_bitmap, pack_ids; not pack_bitmap, whose numpy would cost the
    writer about 15 MB of RSS at its first seal)."""
    meta = SnapshotSegmentMetadata(max_schedule_timestamp=last_key[0], min_schedule_timestamp=first_key[0])
    for ledger, ids in index_ids.items():
        entries = entry_ids[ledger] if entry_ids is not None else entry_bitmap(ids)
        packed = packed_ids[ledger] if packed_ids is not None else pack_ids(ids)
        meta.delayed_index_bit_map[ledger] = serialize_bitmap(entries)
        meta.packed_index_bit_map[ledger] = serialize_bitmap(packed)
    return CutSegment(data=data, metadata=meta, count=count, first_key=first_key, last_key=last_key)


def packed_id_bitmaps(sm: "SnapshotSegmentMetadata") -> Dict[int, BitMap]:
    """ledger -> packed index ids of one segment's metadata, whatever its layout: 3
    packed_index_bit_map, 2 index_id_bit_map (index ids), 1 delayed_index_bit_map holding index
    ids. ValueError naming the ledger on bytes that are no bitmap."""
    if len(sm.packed_index_bit_map):
        source, packed = sm.packed_index_bit_map, True
    else:
        source, packed = (sm.index_id_bit_map if len(sm.index_id_bit_map) else sm.delayed_index_bit_map), False
    out = {}
    for ledger, data in source.items():
        try:
            bm = deserialize_bitmap(data)
        except ValueError as exc:
            raise ValueError(f"bitmap of ledger {ledger}: {exc}") from exc
        out[ledger] = bm if packed else pack_bitmap(bm)
    return out


def cut_segments(items: Iterable[Item], time_step_ms: int, max_indexes: int) -> List[CutSegment]:
    """All segments of `items` (in strictly increasing key order; ValueError otherwise)."""
    items = list(items)
    last: Optional[ReleaseKey] = None
    for ts, ledger, entry, _ in items:
        key = (ts, ledger, entry)
        if last is not None and key <= last:
            raise ValueError(f"items must arrive in increasing release-key order: {key} after {last}")
        last = key
    out = []
    for start, end in cut_bounds([i[0] for i in items], time_step_ms, max_indexes):
        entries: Dict[int, List[int]] = {}
        for _, ledger, entry, _ in items[start:end]:
            entries.setdefault(ledger, []).append(entry)
        first, final = items[start], items[end - 1]
        out.append(make_segment(b"".join(i[3] for i in items[start:end]), end - start, first[:3], final[:3],
                                {ledger: BitMap(ids) for ledger, ids in entries.items()}))
    return out


def cut_packed(rows: PackedItems, order: Sequence[int], time_step_ms: int, max_indexes: int) -> List[CutSegment]:
    """All segments of the rows `order` of `rows` (in strictly increasing key order, which the
    caller guarantees: a mutable bucket's sorted rows): the same segments as cut_segments of
    those rows as items, built from the columns without an item object per row."""
    ts, ledgers, entries, offsets, data = rows.ts, rows.ledger, rows.entry, rows.offsets, rows.data
    view = memoryview(data)
    out = []
    try:
        for start, end in cut_bounds(array("Q", (ts[r] for r in order)), time_step_ms, max_indexes):
            per_ledger: Dict[int, List[int]] = {}
            for r in order[start:end]:
                per_ledger.setdefault(ledgers[r], []).append(entries[r])
            first, final = order[start], order[end - 1]
            out.append(make_segment(b"".join([view[offsets[r]:offsets[r + 1]] for r in order[start:end]]), end - start,
                                    rows.key(first), rows.key(final),
                                    {ledger: BitMap(ids) for ledger, ids in per_ledger.items()}))
    finally:
        view.release()
    return out


def snapshot_metadata(segments: Iterable[CutSegment]) -> "SnapshotMetadata":
    """Entry 0 of a snapshot with these segments: Pulsar's list of segment metadata, and our
    extension of each segment's count and, per ledger, the packed ids of the whole bucket."""
    segs = list(segments)
    meta = SnapshotMetadata(metadata_list=[s.metadata for s in segs])
    meta.segment_count.extend(s.count for s in segs)
    per_ledger: Dict[int, List[BitMap]] = {}
    for s in segs:
        for ledger, bm in packed_id_bitmaps(s.metadata).items():
            per_ledger.setdefault(ledger, []).append(bm)
    for ledger, bms in per_ledger.items():
        meta.packed_index_bit_map[ledger] = serialize_bitmap(union_bitmaps(bms))
    return meta


def snapshot_metadata_bytes(segments: Iterable[CutSegment]) -> bytes:
    """Entry 0 serialized. Deterministic: protobuf leaves the order of map entries (the per-ledger
    bitmaps) unspecified and it varies between processes, so the engine and the Spark seeder
    would otherwise write different bytes for the same bucket."""
    return snapshot_metadata(segments).SerializeToString(deterministic=True)
