"""`spark seed` without a shuffle: executors read their ledgers' Parquet row groups themselves.

An export is written in subscription order, so each Parquet row group holds a narrow range of
ledger ids, and a bucket (a range of whole ledgers) lives in a few row groups. Then shuffling
every row through Spark (scan, rows, shuffle files, Arrow again; ~2 us per row on this machine,
most of it the properties map) is avoidable: the driver reads the row groups' ledger-id
statistics from the footers, cuts the plan into tasks of consecutive buckets, and each task
reads just the row groups that overlap its ledger range with pyarrow, keeps its ledgers' rows
and builds its buckets (executor.seed_table, the same code as the shuffle path).

Taken only when it pays: local (or pyarrow-readable) Parquet inputs, every row group with
ledger-id statistics, and the rows the tasks read at most MAX_READ_AMPLIFICATION times the
rows there are; anything else (Avro, hdfs:/s3a: paths, unordered exports) uses the shuffle.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

MAX_READ_AMPLIFICATION = 2.0
ROWS_PER_TASK = 1_000_000  # tasks hold their rows in memory: about 100-150 MB per million


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group and the ledger ids its statistics bound."""

    path: str
    index: int
    rows: int
    min_ledger: int
    max_ledger: int


@dataclass(frozen=True)
class SeedTask:
    """Consecutive planned buckets [first_bucket, first_bucket + len(ends)) over ledgers
    [lo, hi]; `ends[i]` is bucket first_bucket + i's last ledger; the row groups to read."""

    first_bucket: int
    lo: int
    hi: int
    ends: Tuple[int, ...]
    groups: Tuple[Tuple[str, Tuple[int, ...]], ...]  # (path, row group indexes)


def row_groups(inputs: Sequence[str]) -> Optional[List[RowGroup]]:
    """The row groups of the Parquet inputs (files or directories), or None when pyarrow cannot
    list or open them or a row group has no ledger_id statistics."""
    import pyarrow.dataset as ds  # driver side; pyarrow comes with the spark extra
    import pyarrow.parquet as pq

    try:
        files = [f for path in inputs for f in ds.dataset(path, format="parquet").files]
        out = []
        for path in files:
            meta = pq.ParquetFile(path).metadata
            col = meta.schema.names.index("ledger_id")
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                if rg.num_rows == 0:
                    continue
                stats = rg.column(col).statistics
                if stats is None or not stats.has_min_max:
                    return None
                out.append(RowGroup(path, i, rg.num_rows, int(stats.min), int(stats.max)))
        return out
    except (OSError, ValueError, TypeError, ImportError) as exc:  # not local Parquet: the shuffle path reads it
        log.info("event=seed_direct_unavailable reason=%r", exc)
        return None


def plan_tasks(plan: Sequence[Tuple[int, int, int]], groups: Sequence[RowGroup], parallelism: int) -> List[SeedTask]:
    """Consecutive buckets in tasks of about ROWS_PER_TASK rows (at least 4 tasks per core when
    there are enough buckets), each with the row groups overlapping its ledgers."""
    total = sum(c for _, _, c in plan)
    n_tasks = max(1, min(len(plan), max(4 * parallelism, -(-total // ROWS_PER_TASK))))
    per_task = total / n_tasks
    tasks: List[SeedTask] = []
    start, acc = 0, 0
    for i, (_, _, count) in enumerate(plan):
        acc += count
        last = i == len(plan) - 1
        if last or acc >= per_task * (len(tasks) + 1):
            tasks.append(_task(plan, start, i + 1, groups))
            start = i + 1
    return tasks


def _task(plan: Sequence[Tuple[int, int, int]], a: int, b: int, groups: Sequence[RowGroup]) -> SeedTask:
    lo, hi = plan[a][0], plan[b - 1][1]
    by_path: Dict[str, List[int]] = {}
    for g in groups:
        if g.max_ledger >= lo and g.min_ledger <= hi:
            by_path.setdefault(g.path, []).append(g.index)
    return SeedTask(first_bucket=a, lo=lo, hi=hi, ends=tuple(end for _, end, _ in plan[a:b]),
                    groups=tuple((p, tuple(ix)) for p, ix in sorted(by_path.items())))


def read_amplification(tasks: Sequence[SeedTask], groups: Sequence[RowGroup]) -> float:
    """Rows the tasks read / rows there are."""
    rows = {(g.path, g.index): g.rows for g in groups}
    total = sum(rows.values())
    read = sum(rows[(p, i)] for t in tasks for p, ix in t.groups for i in ix)
    return read / total if total else 0.0


def count_tasks(groups: Sequence[RowGroup], parallelism: int) -> List[Tuple[Tuple[str, Tuple[int, ...]], ...]]:
    """The row groups in tasks of about ROWS_PER_TASK rows (at least 4 per core when there are
    enough), each a tuple of (path, row group indexes)."""
    total = sum(g.rows for g in groups)
    n_tasks = max(1, min(len(groups), max(4 * parallelism, -(-total // ROWS_PER_TASK))))
    per_task = total / n_tasks
    tasks: List[Tuple[Tuple[str, Tuple[int, ...]], ...]] = []
    current: Dict[str, List[int]] = {}
    acc = 0
    for i, g in enumerate(groups):
        current.setdefault(g.path, []).append(g.index)
        acc += g.rows
        if i == len(groups) - 1 or acc >= per_task * (len(tasks) + 1):
            tasks.append(tuple((p, tuple(ix)) for p, ix in current.items()))
            current = {}
    return tasks

