"""When the last mutable bucket is sealed, and how an offline seeder groups ledgers into buckets.

Pulsar's rule (BucketDelayedDeliveryTracker.addMessage): before adding a message of a ledger newer
than the mutable bucket's end ledger, seal the mutable bucket when it holds at least
delayedDeliveryMinIndexCountPerBucket indexes and no immutable bucket covers that ledger. Buckets
therefore cover whole ledgers. The engine (engine.py) and the Spark seeder (spark/seed/) both
use the functions here, so a seeded store is cut by the same rule the engine follows.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple


def pulsar_seal_due(ledger: int, mutable_end: int, mutable_count: int, min_index_count: int,
                    covered: bool) -> bool:
    """Pulsar's seal rule: a message of `ledger` arrives while the mutable bucket ends at
    `mutable_end` and holds `mutable_count` indexes; `covered` = an immutable bucket's ledger range
    holds `ledger`."""
    if mutable_count == 0 or ledger <= mutable_end:
        return False
    if mutable_count < min_index_count:
        return False
    return not covered


def seal_threshold(total: int, min_index_count: int, max_num_buckets: int) -> int:
    """The index count at which plan_ledger_buckets seals: Pulsar's minimum, raised so that
    `total` indexes make at most `max_num_buckets` buckets (-1 = no limit)."""
    if max_num_buckets == 1:
        return total + 1  # one bucket: never seal before the end
    if max_num_buckets > 1:
        # k sealed buckets hold >= threshold each, plus one final partial: k + 1 <= max_num_buckets.
        return max(min_index_count, -(-total // (max_num_buckets - 1)))
    return min_index_count


def plan_ledger_buckets(ledger_counts: Iterable[Tuple[int, int]], min_index_count: int,
                        max_num_buckets: int) -> List[Tuple[int, int, int]]:
    """Group ledgers (id, index count) into buckets over whole-ledger ranges: (start, end, count).

    Ledgers are taken in id order and a bucket is sealed by pulsar_seal_due when the next ledger
    arrives, with the threshold raised to ceil(total / (max_num_buckets - 1)) when the plain rule
    would give more than `max_num_buckets` buckets, so that the planned buckets never exceed the
    bucket-count limit and the engine needs no merge (-1 = no limit). A ledger never spans two
    buckets (one ledger larger than the threshold is a bucket of its own).
    """
    ordered: Sequence[Tuple[int, int]] = sorted((int(l), int(c)) for l, c in ledger_counts if c > 0)
    for i in range(1, len(ordered)):
        if ordered[i][0] == ordered[i - 1][0]:
            raise ValueError(f"ledger {ordered[i][0]} listed twice")
    if max_num_buckets != -1 and max_num_buckets < 1:
        raise ValueError(f"max_num_buckets must be >= 1 or -1, got {max_num_buckets}")
    threshold = seal_threshold(sum(c for _, c in ordered), min_index_count, max_num_buckets)
    out: List[Tuple[int, int, int]] = []
    start = end = -1
    count = 0
    for ledger, n in ordered:
        if pulsar_seal_due(ledger, end, count, threshold, covered=False):
            out.append((start, end, count))
            start, count = -1, 0
        if start < 0:
            start = ledger
        end = ledger
        count += n
    if count:
        out.append((start, end, count))
    return out
