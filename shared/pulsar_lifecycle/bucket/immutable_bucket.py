"""One sealed bucket in memory (Pulsar's ImmutableBucket): its snapshot's per-segment metadata and
a cursor over its first unreleased segment, the only one it keeps decoded (as packed columns over
the segment's bytes: packed.PackedSegment, no Python object per index).

Pure: reading a segment is the caller's job (the shared queue is given a reader); this module only
positions the cursor in decoded segments. Not thread-safe: the index guards it with its state lock.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .codec import BucketRef
from .manifest import bucket_ref
from .packed import PackedSegment, key_int
from .records import DelayedMessage, ReleaseKey
from .segments import CutSegment

PLACEHOLDER = -1  # ledger id of a queue head whose segment is not loaded (sorts first at equal ts)

# An entry of the shared queue: the release key of a bucket's head, then the bucket id.
HeadEntry = Tuple[int, int, int, int]


def first_after(seg: PackedSegment, key: Optional[ReleaseKey]) -> int:
    """Position of the first index in the decoded segment `seg` with a key > `key` (len when none)."""
    lo, hi = 0, len(seg)
    if key is None:
        return 0
    k = key_int(*key)
    rk = seg.key_int
    while lo < hi:  # keys in a segment are strictly increasing
        mid = (lo + hi) // 2
        if rk(mid) <= k:
            lo = mid + 1
        else:
            hi = mid
    return lo


def segment_arrays(segments: Sequence[CutSegment]) -> Tuple[array, array, array]:
    """Per-segment (min timestamps, max timestamps, index counts) as compact arrays."""
    return (
        array("Q", (s.min_ts for s in segments)),
        array("Q", (s.max_ts for s in segments)),
        array("Q", (s.count for s in segments)),
    )


@dataclass(eq=False)
class ImmutableBucket:
    """In-memory state of one immutable bucket."""

    bucket_id: int
    key: str
    start_ledger: int
    end_ledger: int
    seg_min: array  # per segment: min_schedule_timestamp
    seg_max: array  # per segment: max_schedule_timestamp
    seg_count: array  # per segment: number of indexes
    snapshot_length: int
    index_count: int
    cur: int = 0  # index of the current (loaded or to-load) segment; == nseg when drained
    seg: Optional[PackedSegment] = None  # decoded segment `cur`; None while not loaded
    pos: int = 0  # next index in `seg`
    remaining: int = 0  # unreleased items
    last_key: Optional[ReleaseKey] = None  # key of the bucket's last item, when known

    @classmethod
    def from_segments(cls, bucket_id: int, key: str, start: int, end: int, segments: Sequence[CutSegment],
                      snapshot_length: int) -> "ImmutableBucket":
        """A bucket just written from `segments` (cut in key order), not positioned yet."""
        mins, maxs, counts = segment_arrays(segments)
        return cls(
            bucket_id=bucket_id, key=key, start_ledger=start, end_ledger=end,
            seg_min=mins, seg_max=maxs, seg_count=counts,
            snapshot_length=snapshot_length, index_count=int(sum(counts)),
            last_key=segments[-1].last_key if segments else None,
        )

    @property
    def nseg(self) -> int:
        return len(self.seg_min)

    @property
    def drained(self) -> bool:
        return self.cur >= len(self.seg_min)

    @property
    def loaded(self) -> int:
        """Unreleased indexes of the decoded segment (0 when none is loaded)."""
        return len(self.seg) - self.pos if self.seg is not None else 0

    def ref(self) -> BucketRef:
        """The manifest's entry for this bucket."""
        return bucket_ref(self.bucket_id, self.key, self.start_ledger, self.end_ledger,
                          self.snapshot_length, self.index_count)

    def head(self) -> HeadEntry:
        """The queue entry of the loaded segment's next index."""
        seg, pos = self.seg, self.pos
        assert seg is not None  # only called while a segment is loaded
        return (seg.ts[pos], seg.ledger[pos], seg.entry[pos], self.bucket_id)

    def placeholder(self) -> HeadEntry:
        """The queue entry of segment `cur` before it is loaded: its min timestamp, sorting first."""
        return (self.seg_min[self.cur], PLACEHOLDER, PLACEHOLDER, self.bucket_id)

    def head_message(self) -> DelayedMessage:
        """The message at the head of the loaded segment, decoded from its bytes."""
        assert self.seg is not None  # only called while a segment is loaded
        return self.seg.message(self.pos)

    def use_segment(self, seg: PackedSegment, after: Optional[ReleaseKey]) -> bool:
        """Make the decoded segment `seg` (number `cur`) current, positioned after `after`;
        False (nothing changed) when it holds nothing after it."""
        pos = first_after(seg, after)
        if pos >= len(seg):
            return False
        self.seg, self.pos = seg, pos
        self._note_last_key()
        return True

    def step(self) -> bool:
        """Step past the head. True while the loaded segment has more; otherwise the segment is
        dropped and `cur` moves to the next one (see `drained`)."""
        self.pos += 1
        self.remaining -= 1
        assert self.seg is not None  # only called while a segment is loaded
        if self.pos < len(self.seg):
            return True
        self._note_last_key()
        self.seg = None
        self.cur += 1
        return False

    def first_unreleased(self, segments: Sequence[CutSegment], last: Optional[ReleaseKey]) -> int:
        """Number of the first of this bucket's `segments` with a key after `last` (nseg: none)."""
        k = 0
        while k < len(segments) and last is not None and segments[k].last_key <= last:
            k += 1
        return k

    def _note_last_key(self) -> None:
        if self.seg is not None and self.cur == self.nseg - 1:
            self.last_key = self.seg.key(len(self.seg) - 1)
