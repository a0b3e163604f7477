"""Merging adjacent immutable buckets when there are more than MaxNumBuckets (Pulsar's
asyncMergeBucketSnapshot): which window to merge (merge_policy) and writing the merged snapshot,
read segment by segment from the sources and cut again, with bounded memory.
"""
from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .codec import Item, index_item, index_key, parse_segment, upgrade_index
from .config import BucketConfig
from .immutable_bucket import ImmutableBucket
from .keys import bucket_key
from .merge_policy import select_merge_window
from .records import MAX_U64, ReleaseKey
from .segments import CutSegment, SegmentCutter, snapshot_metadata_bytes
from .snapshots import BucketSnapshots
from .storage import BucketSnapshotStorage, StorageError

logger = logging.getLogger(__name__)


@dataclass
class MergedBucket:
    """A merged snapshot just written: the bucket (not positioned yet), its segments' metadata and
    the bytes kept of its first unreleased segments (so installing it rarely needs a read)."""

    bucket: ImmutableBucket
    segments: List[CutSegment]
    cached: Dict[int, bytes]


def merge_window(buckets: Sequence[ImmutableBucket], limit: int) -> Optional[Tuple[int, int]]:
    """(start, width) of the adjacent buckets to merge, or None (within the limit, -1: none)."""
    if limit == -1 or len(buckets) <= limit:
        return None
    counts = [b.remaining for b in buckets]
    # Every bucket may merge (see merge_policy): excluding drained-but-uncommitted ones
    # could leave no adjacent window and the bucket count above the limit.
    eligible = [True] * len(buckets)
    next_ts = [b.seg_min[b.cur] if not b.drained else MAX_U64 for b in buckets]
    return select_merge_window(counts, eligible, next_ts)


def source_items(storage: BucketSnapshotStorage, bucket: ImmutableBucket, w: Optional[ReleaseKey]) -> Iterator[Item]:
    """Every item of `bucket` after the committed watermark, read from its snapshot.

    Reads from the first segment that may hold anything after the watermark — including
    the segment currently loaded in memory and already-released-but-uncommitted items.
    (Pulsar's merge read from currentSegmentEntryId + 1 and lost the loaded segment's
    items: PR #26251.)"""
    first = 0
    if w is not None:
        while first < bucket.nseg and bucket.seg_max[first] < w[0]:
            first += 1
    for k in range(first, bucket.nseg):
        data = storage.get_segments(bucket.bucket_id, k + 1, k + 1)[0]
        seg = parse_segment(data, f"bucket {bucket.bucket_id} segment {k + 1}")
        for idx in seg.indexes:
            key = index_key(idx)
            if w is None or key > w:
                upgrade_index(idx)  # a layout-1 source is merged into layout 2
                yield index_item(idx)


def write_merged(snapshots: BucketSnapshots, config: BucketConfig, sources: Sequence[ImmutableBucket],
                 w: Optional[ReleaseKey], last_released: Callable[[], Optional[ReleaseKey]]) -> Optional[MergedBucket]:
    """Write one snapshot holding every item of `sources` after the watermark `w`;
    `last_released()` gives the last released key (the first segments after it stay in memory).
    None (logged) when it failed."""
    start = min(s.start_ledger for s in sources)
    end = max(s.end_ledger for s in sources)
    key = bucket_key(start, end)
    writer = None
    try:
        writer = snapshots.begin(key)
        cutter = SegmentCutter(config.time_step_ms, config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
        closed: List[CutSegment] = []
        cached: Dict[int, bytes] = {}
        last = last_released()

        def keep(seg: CutSegment) -> None:
            writer.add_segment(seg.data)
            # Keep the bytes of the first couple of segments that may still be unreleased,
            # so installing the merged bucket rarely needs a read.
            if (last is None or seg.last_key > last) and len(cached) < 2:
                cached[len(closed)] = seg.data
            seg.data = b""  # bounded memory: only metadata stays
            closed.append(seg)

        for item in heapq.merge(*(source_items(snapshots.storage, s, w) for s in sources)):
            seg = cutter.push(item)
            if seg is not None:
                keep(seg)
        seg = cutter.finish()
        if seg is not None:
            keep(seg)
        if not closed:
            raise StorageError("no item after the watermark to merge")
        bid = writer.finish(snapshot_metadata_bytes(closed))
    except Exception as exc:
        logger.warning("merging buckets %s failed: %s", [s.bucket_id for s in sources], exc)
        snapshots.abort(writer, key)
        return None
    return MergedBucket(snapshots.new_bucket(bid, key, start, end, closed), closed, cached)
