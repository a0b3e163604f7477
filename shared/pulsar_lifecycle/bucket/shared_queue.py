"""The shared release queue of the immutable buckets (Pulsar's sharedBucketPriorityQueue).

A heap of one entry per immutable bucket that still has items: the release key of its head (the
next index of its loaded segment), or a placeholder (the segment's min timestamp) while that
segment is not loaded. Merged k-way with the mutable bucket by the index, it gives the next item.
When a bucket's segment empties, the next one is read through the injected reader.

Not thread-safe: the index guards it with its state lock.
"""
from __future__ import annotations

import heapq
import logging
from typing import Callable, Collection, List, Optional, Sequence

from .immutable_bucket import HeadEntry, ImmutableBucket
from .metrics import OpMetrics
from .packed import PackedSegment
from .records import ReleaseKey
from .segments import CutSegment

logger = logging.getLogger(__name__)

# Reads segment k (0-based) of a bucket's snapshot; None (logged, counted) when the storage failed.
SegmentReader = Callable[[ImmutableBucket, int], Optional[bytes]]


class SharedBucketQueue:
    """The heads of the immutable buckets, in release-key order."""

    def __init__(self, read_segment: SegmentReader, metrics: OpMetrics) -> None:
        self._read_segment = read_segment
        self._metrics = metrics
        self.heap: List[HeadEntry] = []

    def __len__(self) -> int:
        return len(self.heap)

    def head(self) -> Optional[HeadEntry]:
        """The smallest entry, or None."""
        return self.heap[0] if self.heap else None

    def head_ts(self) -> Optional[int]:
        """Release timestamp of the smallest entry, or None."""
        return self.heap[0][0] if self.heap else None

    def push(self, entry: HeadEntry) -> None:
        heapq.heappush(self.heap, entry)

    def heapify(self) -> None:
        heapq.heapify(self.heap)

    def remove_buckets(self, ids: Collection[int]) -> None:
        """Drop the entries of buckets `ids` (merged away)."""
        self.heap = [h for h in self.heap if h[3] not in ids]
        heapq.heapify(self.heap)

    def install(self, bucket: ImmutableBucket, segments: Sequence[CutSegment], cached: dict,
                last: Optional[ReleaseKey]) -> None:
        """Position a new bucket after the last released key `last` and put its head in the queue.
        `segments` gives each segment's last key (and maybe its bytes); `cached` more bytes."""
        k = bucket.first_unreleased(segments, last)
        bucket.cur = k
        if k >= len(segments):
            bucket.remaining = 0
            return
        data = cached.get(k)
        if data is None and k < len(segments) and segments[k].data:
            data = segments[k].data
        if data is None:
            data = self._read_segment(bucket, k)
            if data is None:
                bucket.remaining = sum(bucket.seg_count[k:])  # approximate until loaded
                heapq.heappush(self.heap, bucket.placeholder())
                return
        seg = PackedSegment.parse(data, f"bucket {bucket.bucket_id} segment {k + 1}")
        if not bucket.use_segment(seg, last):  # cannot happen: segment k ends after `last`
            raise ValueError(f"bucket {bucket.bucket_id} segment {k + 1} holds nothing after the last release")
        bucket.remaining = len(seg) - bucket.pos + int(sum(bucket.seg_count[k + 1:]))
        heapq.heappush(self.heap, bucket.head())

    def advance(self, bucket: ImmutableBucket, last: Optional[ReleaseKey]) -> None:
        """Step past the head of `bucket` (which is the top of the queue); load its next segment
        when the loaded one empties (positioned after `last`)."""
        if bucket.step():
            heapq.heapreplace(self.heap, bucket.head())
            return
        if bucket.drained:
            heapq.heappop(self.heap)
            logger.info("bucket %d fully released (deleted once committed)", bucket.bucket_id)
            return
        heapq.heapreplace(self.heap, bucket.placeholder())
        self.load_current(bucket, last)

    def load_current(self, bucket: ImmutableBucket, last: Optional[ReleaseKey]) -> bool:
        """Load segment `bucket.cur` whose placeholder is in the queue; replace the placeholder."""
        data = self._read_segment(bucket, bucket.cur)
        if data is None:
            return False
        try:
            seg = PackedSegment.parse(data, f"bucket {bucket.bucket_id} segment {bucket.cur + 1}")
        except ValueError as exc:
            self._metrics.record("load", False, 0.0)
            logger.error("%s", exc)
            return False
        if not bucket.use_segment(seg, last):
            # Cannot happen for a consistent snapshot (segments are in key order).
            logger.error("bucket %d segment %d holds nothing after the last release", bucket.bucket_id, bucket.cur + 1)
            return False
        for n, h in enumerate(self.heap):
            if h[3] == bucket.bucket_id:
                self.heap[n] = bucket.head()
                # The real head is >= the placeholder: restore the heap property downwards.
                heapq.heapify(self.heap)
                break
        return True
