"""Which adjacent immutable buckets to merge when there are more than MaxNumBuckets.

Pulsar (selectMergedBuckets, MAX_MERGE_NUM = 4, PR #19927): slide a window of 4 adjacent
buckets, all eligible, and take the window with the smallest total of delayed messages; ties go
to the window whose next schedule timestamp is earliest; if no window of 4 qualifies try 3,
then 2. Pulsar calls a bucket eligible when its last segment is not loaded yet and it is not
already merging. The engine calls every bucket eligible: all items after the committed
watermark are read back from the snapshot (never from memory), so a loaded last segment is no
obstacle, and with our time/count based sealing many buckets have a single segment — Pulsar's
rule would leave them (and drained buckets awaiting their commit) unmergeable and the bucket
count unbounded (documented in docs/bucket-format.md). `eligible` is kept for Pulsar's rule.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

MAX_MERGE_NUM = 4


def select_merge_window(
    counts: Sequence[int],
    eligible: Sequence[bool],
    next_ts: Sequence[int],
    max_merge: int = MAX_MERGE_NUM,
) -> Optional[Tuple[int, int]]:
    """(start index, length) of the buckets to merge, or None when no window qualifies.

    counts[i]: items (not yet released) of bucket i; eligible[i]: may be merged; next_ts[i]: its
    next schedule timestamp (tie-break). Buckets are in bucket order (adjacency).
    """
    n = len(counts)
    if not (len(eligible) == n == len(next_ts)):
        raise ValueError("counts, eligible and next_ts must have the same length")
    if max_merge < 2:
        raise ValueError(f"max_merge must be >= 2, got {max_merge}")
    for width in range(min(max_merge, n), 1, -1):
        best: Optional[Tuple[int, int, int]] = None  # (total, earliest ts, start)
        run = 0  # eligible buckets ending at i
        for i in range(n):
            run = run + 1 if eligible[i] else 0
            if run < width:
                continue
            start = i - width + 1
            total = sum(counts[start:i + 1])
            earliest = min(next_ts[start:i + 1])
            cand = (total, earliest, start)
            if best is None or cand < best:
                best = cand
        if best is not None:
            return best[2], width
    return None
