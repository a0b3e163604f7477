"""The executor side of `spark seed`: the functions its Spark tasks run in their Python workers.

No PySpark here: the job (driver.py) hands these functions to its tasks (mapInArrow for the
shuffle path, flatMap for the direct path, map for the output check). Building one bucket is
executor_bucket.py.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np  # executor side; numpy and pyarrow come with the spark extra

from ...bucket.bitmap import LedgerBitmaps
from ...bucket.codec import CorruptRecordError, Manifest, SnapshotMetadata, parse, parse_segment
from ...bucket.config import BucketConfig
from ...bucket.item_columns import row_any
from ...bucket.storage import SnapshotNotFoundError, StorageError
from ..backlog import ROW_COLUMNS, ClassifyOptions
from ..store import open_store
from .direct import SeedTask
from .executor_bucket import build_bucket, write_bucket

RESULT_DDL = ("bucket_no int, bucket_id long, bucket_key string, start_ledger long, end_ledger long, "
              "snapshot_length long, index_count long, segments int, min_ts long, max_ts long, seen binary, "
              "rows long, duplicates long, cancelled long, cancels long, invalid long, invalid_examples string")

SEGMENTS_PER_READ = 256  # the output check reads a snapshot's segments in slices of this many


def result_schema() -> Any:
    """The Arrow schema of seed_partition's results (RESULT_DDL)."""
    import pyarrow as pa  # executor side; pyarrow comes with the spark extra

    types = {"int": pa.int32(), "long": pa.int64(), "string": pa.string(), "binary": pa.binary()}
    return pa.schema([pa.field(name, types[kind]) for name, kind in
                      (col.strip().split() for col in RESULT_DDL.split(","))])


def seed_partition(url: str, first_id: int, config: BucketConfig, opts: ClassifyOptions,
                   tombstones: Dict[int, bytes], batches: Iterator[Any]) -> Iterator[Any]:
    """The mapInArrow function (see bind_tasks): the Arrow batches of one partition, which holds
    every row of the buckets placed on it (column bucket_no); each bucket is built and written
    here, one result row per bucket."""
    import pyarrow as pa  # executor side; pyarrow comes with the spark extra

    parts = [b for b in batches if b.num_rows]
    if not parts:
        return
    table = pa.Table.from_batches(parts)
    del parts
    rows = seed_table(url, first_id, config, opts, LedgerBitmaps.from_proto_map(tombstones, "tombstones"), table)
    yield pa.RecordBatch.from_pylist(rows, schema=result_schema())


def seed_direct_task(url: str, first_id: int, config: BucketConfig, opts: ClassifyOptions,
                     tombstones: Dict[int, bytes], task: SeedTask) -> List[Dict[str, Any]]:
    """The flatMap function of the direct path (see bind_tasks): read the task's row groups,
    build and write its buckets; one result per bucket."""
    table = read_task(task, ROW_COLUMNS)
    if table is None:
        return []
    return seed_table(url, first_id, config, opts, LedgerBitmaps.from_proto_map(tombstones, "tombstones"), table)


def seed_table(url: str, first_id: int, config: BucketConfig, opts: ClassifyOptions, tomb: LedgerBitmaps,
               table: Any) -> List[Dict[str, Any]]:
    """Build and write every bucket whose rows `table` holds (column bucket_no says which);
    their result rows."""

    buckets = np.asarray(table.column("bucket_no").combine_chunks(), dtype=np.int64)
    if buckets[0] == buckets[-1] and (buckets == buckets[0]).all():
        return [_seed_bucket(url, first_id, config, opts, tomb, int(buckets[0]), table)]
    order = np.argsort(buckets, kind="stable")
    uniq, starts = np.unique(buckets[order], return_index=True)
    ends = list(starts[1:]) + [len(order)]
    return [_seed_bucket(url, first_id, config, opts, tomb, bucket_no, table.take(order[a:b]))
            for bucket_no, a, b in zip(uniq.tolist(), starts.tolist(), ends)]


def _seed_bucket(url: str, first_id: int, config: BucketConfig, opts: ClassifyOptions, tomb: LedgerBitmaps,
                 bucket_no: int, table: Any) -> Dict[str, Any]:
    """Build and write planned bucket `bucket_no` from its rows; its result row."""
    build = build_bucket(table, config, opts, tomb)
    bucket_id = first_id + bucket_no
    length = 0
    if build.items:
        storage = open_store(url)
        try:
            length = write_bucket(storage, bucket_id, build, config)
        finally:
            storage.close()
    seen = Manifest()
    for ledger, data in build.seen.to_proto_map().items():
        seen.seen[ledger] = data
    return {
        "bucket_no": bucket_no, "bucket_id": bucket_id if build.items else 0,
        "bucket_key": build.key if build.items else "",
        "start_ledger": build.start_ledger, "end_ledger": build.end_ledger, "snapshot_length": length,
        "index_count": build.items, "segments": len(build.segments),
        "min_ts": build.segments[0].min_ts if build.segments else 0,
        "max_ts": build.segments[-1].max_ts if build.segments else 0,
        "seen": seen.SerializeToString(), "rows": build.rows, "duplicates": build.duplicates,
        "cancelled": build.cancelled, "cancels": build.cancels, "invalid": build.invalid,
        "invalid_examples": json.dumps(build.invalid_examples),
    }


def snapshot_counts(url: str, bucket_id: int) -> Dict[str, Any]:
    """Executor side of the output check: what snapshot `bucket_id` holds (length, segments, items
    decoded from every segment, first and last release-key timestamp) or why it cannot be read."""
    out: Dict[str, Any] = {"bucket_id": bucket_id, "error": ""}
    storage = open_store(url)
    try:
        meta = parse(SnapshotMetadata, storage.get_metadata(bucket_id), f"bucket {bucket_id} metadata")
        n = len(meta.metadata_list)
        items = 0
        for a in range(1, n + 1, SEGMENTS_PER_READ):
            b = min(n, a + SEGMENTS_PER_READ - 1)
            for k, data in enumerate(storage.get_segments(bucket_id, a, b), start=a):
                items += len(parse_segment(data, f"bucket {bucket_id} segment {k}").indexes)
        out.update(length=storage.get_length(bucket_id), segments=n, items=items,
                   min_ts=meta.metadata_list[0].min_schedule_timestamp if n else 0,
                   max_ts=meta.metadata_list[-1].max_schedule_timestamp if n else 0)
    except SnapshotNotFoundError:
        out["error"] = "missing"
    except (StorageError, CorruptRecordError) as exc:
        out["error"] = " ".join(str(exc).split())
    finally:
        storage.close()
    return out


def read_task(task: SeedTask, columns: Sequence[str]) -> Any:
    """The task's rows (its ledgers only) as a pyarrow Table with a bucket_no column."""
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


def count_ledgers(cancel_prop: str, task: Tuple[Tuple[str, Tuple[int, ...]], ...]) -> List[Tuple[int, int, int]]:
    """(ledger id, rows, rows whose properties hold `cancel_prop`) for the rows of these row
    groups: what the shuffle path's planning scan computes with Spark, read with pyarrow."""
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
