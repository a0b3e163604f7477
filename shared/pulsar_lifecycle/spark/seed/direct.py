"""`spark seed` without a shuffle: executors read their ledgers' Parquet row groups themselves.

An export is written in subscription order, so each Parquet row group holds a narrow range of
ledger ids, and a bucket (a range of whole ledgers) lives in a few row groups. Then shuffling
every row through Spark (scan, rows, shuffle files, Arrow again; ~2 us per row on this machine,
most of it the properties map) is avoidable: the driver reads the row groups' ledger-id
statistics from the footers, cuts the plan into tasks of consecutive buckets, and each task
reads just the row groups that overlap its ledger range with pyarrow, keeps its ledgers' rows
and builds its buckets (seed.seed_table, the same code as the shuffle path).

Taken only when it pays: local (or pyarrow-readable) Parquet inputs, every row group with
ledger-id statistics, and the rows the tasks read at most MAX_READ_AMPLIFICATION times the
rows there are; anything else (Avro, hdfs:/s3a: paths, unordered exports) uses the shuffle.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..bucket.item_columns import row_any

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


def read_task(task: SeedTask, columns: Sequence[str]) -> Any:
    """The task's rows (its ledgers only) as a pyarrow Table with a bucket_no column."""
    import numpy as np  # executor side; numpy and pyarrow come with the spark extra
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parts = []
    for path, indexes in task.groups:
        t = pq.ParquetFile(path).read_row_groups(list(indexes), columns=list(columns))
        ledger = t.column("ledger_id")
        t = t.filter(pc.and_(pc.greater_equal(ledger, task.lo), pc.less_equal(ledger, task.hi)))
        if t.num_rows:
            parts.append(t)
    if not parts:
        return None
    table = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    ledgers = np.asarray(table.column("ledger_id").combine_chunks(), dtype=np.int64)
    bucket_no = task.first_bucket + np.searchsorted(np.asarray(task.ends, dtype=np.int64), ledgers, side="left")
    return table.append_column("bucket_no", pa.array(bucket_no.astype(np.int32)))


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


def count_ledgers(cancel_prop: str, task: Tuple[Tuple[str, Tuple[int, ...]], ...]) -> List[Tuple[int, int, int]]:
    """(ledger id, rows, rows whose properties hold `cancel_prop`) for the rows of these row
    groups: what the shuffle path's planning scan computes with Spark, read with pyarrow."""
    import numpy as np  # executor side; numpy and pyarrow come with the spark extra
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ledgers, cancels = [], []
    for path, indexes in task:
        t = pq.ParquetFile(path).read_row_groups(list(indexes), columns=["ledger_id", "properties"])
        props = t.column("properties").combine_chunks()
        offsets = np.asarray(props.offsets, dtype=np.int64)
        start = int(offsets[0]) if len(props) else 0
        keys = props.keys.slice(start, int(offsets[-1]) - start if len(props) else 0)
        hit = row_any(np.asarray(pc.equal(keys, cancel_prop).fill_null(False), dtype=bool), offsets - start)
        if props.null_count:  # a null map names nothing (Spark's getItem gives null)
            hit &= np.asarray(props.is_valid(), dtype=bool)
        ledgers.append(np.asarray(t.column("ledger_id").combine_chunks(), dtype=np.int64))
        cancels.append(hit)
    if not ledgers:
        return []
    uniq, inverse = np.unique(np.concatenate(ledgers), return_inverse=True)
    rows = np.bincount(inverse, minlength=len(uniq))
    hits = np.bincount(inverse, weights=np.concatenate(cancels).astype(np.float64), minlength=len(uniq))
    return list(zip(uniq.tolist(), rows.tolist(), hits.astype(np.int64).tolist()))
