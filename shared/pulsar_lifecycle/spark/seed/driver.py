"""`spark seed`: build a writer's bucket snapshots from exported backlog files on Spark.

Driver: check the store is empty (no manifest, cursor or journal; a crashed seed's unreferenced
snapshots are removed, as the writer's recovery would), count rows per ledger, plan buckets over
whole-ledger ranges with the engine's seal rule and the bucket-count limit (bucket/sealing.py),
collect the cancel requests (few) into tombstones, reserve one bucket id per planned bucket.
Executors (repartition by a placement key + mapInArrow: the rows reach Python as Arrow batches, no
sort in the JVM; each task holds the buckets placed on its partition, normally one): classify,
order, cut and write each bucket through the storage interface (executor.py, executor_bucket.py). Driver again: the
output check (every snapshot the manifest will list is in the store as the driver sees it, has
the length and segment count its task reported, and its segments decode to the reported item
count), then the manifest from the executors' small per-bucket results, written last and
atomically: until then a writer would see an empty store and delete the new snapshots as
orphans, so a seed that fails its check leaves no store a writer would trust.

Every path is resolved on the driver first (paths.py): executors get absolute URLs, and a local
path the executors of a remote master cannot reach is refused before any work.
"""
from __future__ import annotations

import heapq
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...bucket.bitmap import LedgerBitmaps
from ...bucket.codec import Manifest, ReleaseCursor, parse
from ...bucket.config import BucketConfig
from ...bucket.manifest import bucket_ref, manifest_from_maps
from ...bucket.sealing import plan_ledger_buckets, seal_threshold
from ...bucket.storage import BucketSnapshotStorage
from ...clock import Clock, wall_clock_ms
from ...scheduler.index_identity import seq_base_for_new_index
from ...scheduler.intake import Cancel
from ...scheduling_protocol import CANCEL_PROP
from ..backlog import ROW_COLUMNS, ClassifyOptions, as_properties, classify_row, joined_names, read_backlog
from ..errors import SparkJobError
from ..failures import spark_step
from ..paths import STORE_HINT, require_reachable, resolve_all, resolve_store
from ..progress import JobProgress
from ..store import exclusive, open_store, store_dir
from .direct import MAX_READ_AMPLIFICATION, RowGroup, SeedTask, count_tasks, plan_tasks, read_amplification, row_groups
from .executor import RESULT_DDL, count_ledgers, seed_direct_task, seed_partition, snapshot_counts
from .executor_bucket import tombstones_of

log = logging.getLogger(__name__)

MAX_CANCELS_ON_DRIVER = 5_000_000
MAX_PARTITIONS = 2000  # more buckets than this share partitions (balanced by rows)
MAX_NAMED = 10  # output-check problems named in the error
@dataclass
class SeedReport:
    """What a seed did (printed as the summary, written as JSON with --report)."""

    store: str
    inputs: List[str]
    rows: int = 0
    items: int = 0
    buckets: int = 0
    segments: int = 0
    duplicates: int = 0
    cancelled: int = 0
    cancel_requests: int = 0
    tombstones: int = 0
    invalid: int = 0
    invalid_examples: List[str] = field(default_factory=list)
    bucket_ids: List[int] = field(default_factory=list)
    planned_threshold: int = 0
    index_id: str = ""
    seconds: float = 0.0
    rows_per_s: float = 0.0
    path: str = "shuffle"  # "direct": executors read their row groups (direct.py)
    read_amplification: float = 0.0  # rows the direct path's tasks would read / rows there are

    def to_json(self) -> str:
        """The report as JSON text."""
        return json.dumps(asdict(self), indent=2)


def check_empty(storage: BucketSnapshotStorage, url: str) -> None:
    """Refuse a store a writer has used; drop snapshots no manifest references (a crashed seed).
    A cursor with no watermark and no manifest is a crashed seed's too (its manifest is the
    commit point) and is kept with its sequence base."""
    cursor = storage.get_cursor()
    released = cursor is not None and parse(ReleaseCursor, cursor, "release cursor").has_watermark
    if storage.get_manifest() is not None or released or storage.journal_read():
        raise SparkJobError(f"snapshot store {url} is not empty (it has a manifest, a release watermark or a "
                            "journal): seed only a new store")
    for bid in storage.list_snapshots(0):
        log.warning("event=seed_drop_unreferenced_snapshot bucket=%d store=%s", bid, url)
        storage.delete(bid)


def bind_tasks(fn: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """`fn` with its leading arguments bound, as a plain function for mapInArrow (which wants a
    function, not a partial); Spark pickles `fn` by reference, `args` by value."""

    def run(batches: Any) -> Any:
        return fn(*args, batches)

    return run


def place_buckets(sizes: Sequence[int], partitions: int) -> List[int]:
    """The partition of each bucket: bucket i on partition i when there are enough partitions,
    else the largest buckets first, each on the partition with the fewest rows so far."""
    if len(sizes) <= partitions:
        return list(range(len(sizes)))
    load = [(0, p) for p in range(partitions)]
    heapq.heapify(load)
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        rows, p = heapq.heappop(load)
        out[i] = p
        heapq.heappush(load, (rows + sizes[i], p))
    return out


def partition_keys(spark: Any, partitions: int) -> List[int]:
    """For each partition p a long key that `repartition(partitions, key)` sends to p: Spark's
    hash partitioning is pmod(hash(key), partitions) (Murmur3, seed 42; F.hash computes the same),
    so the keys are looked up among small numbers with Spark itself. Only the balance of the
    tasks depends on it: any placement gives the same result (each task groups its rows)."""
    from pyspark.sql import functions as F  # optional dependency

    found: Dict[int, int] = {}
    span = 64 * partitions
    while len(found) < partitions and span <= 1 << 24:
        for r in spark.range(0, span, 1, 1).select("id", F.expr(f"pmod(hash(id), {partitions})").alias("p")).collect():
            found.setdefault(int(r["p"]), int(r["id"]))
        span *= 16
    return [found.get(p, p) for p in range(partitions)]


def run_seed(spark: Any, inputs: Sequence[str], url: str, config: BucketConfig, opts: ClassifyOptions, *,
             fmt: str = "parquet", max_buckets: int = 0, progress: JobProgress, direct: bool = True,
             shared_fs: bool = False) -> SeedReport:
    """Seed the (empty) store at `url` from backlog files; returns the report. `max_buckets` > 0
    lowers the bucket-count limit below config.delayed_delivery_max_num_buckets. `direct`:
    let executors read their row groups when that pays (direct.py); else Spark shuffles.
    Paths are resolved here, on the driver; `shared_fs`: local paths are on a filesystem every
    executor of a remote master mounts at the same path (paths.require_reachable)."""
    paths = resolve_all(inputs)
    store = resolve_store(url)
    master = spark.sparkContext.master
    require_reachable(master, [("backlog", p) for p in paths], shared_fs)
    require_reachable(master, [("--store", store)], shared_fs, hint=STORE_HINT)
    url = store.url
    t0 = time.monotonic()
    report = SeedReport(store=url, inputs=[p.url for p in paths])
    limit = config.delayed_delivery_max_num_buckets
    if max_buckets > 0:
        limit = max_buckets if limit == -1 else min(limit, max_buckets)
    with exclusive(url):
        storage = open_store(url)
        try:
            check_empty(storage, url)
            progress.phase("plan buckets")
            df = read_backlog(spark, paths, fmt)
            groups = None
            if direct and fmt == "parquet" and all(p.local is not None for p in paths):
                groups = row_groups([str(p.local) for p in paths])
            with spark_step(f"cannot count the rows of backlog {joined_names(report.inputs)}"):
                per_ledger = _count_rows(spark, df, groups)
            counts = [(ledger, n) for ledger, n, _ in per_ledger]
            n_cancels = sum(c for _, _, c in per_ledger)
            plan = plan_ledger_buckets(counts, config.delayed_delivery_min_index_count_per_bucket, limit)
            report.planned_threshold = seal_threshold(sum(c for _, c in counts),
                                                      config.delayed_delivery_min_index_count_per_bucket, limit)
            progress.phase("cancel requests")
            with spark_step(f"cannot read the cancel requests of backlog {joined_names(report.inputs)}"):
                tomb = _tombstones(df, opts, report) if n_cancels else LedgerBitmaps()
            if not plan:
                report.index_id = _claim_index(storage)
                storage.put_manifest(manifest_from_maps([], seen={}, tombstones=tomb.to_proto_map(), journal_cut=0,
                                                        max_bucket_id=0, pending_delete=()))
                report.seconds = round(time.monotonic() - t0, 3)
                return report
            first = storage.reserve_bucket_ids(len(plan))
            progress.phase("build and write buckets")
            progress.expect_rows(sum(c for _, c in counts))
            tasks = _direct_tasks(spark, groups, plan, report) if groups is not None else None
            with spark_step(f"cannot build and write the buckets of {url} from backlog {joined_names(report.inputs)}"):
                if tasks is not None:
                    results = sorted(spark.sparkContext.parallelize(tasks, len(tasks))
                                     .flatMap(bind_tasks(seed_direct_task, url, first, config, opts,
                                                         tomb.to_proto_map()))
                                     .collect(), key=lambda r: r["bucket_no"])
                else:
                    results = _shuffle_seed(spark, df, url, first, config, opts, tomb, plan, counts)
            refs, seen = [], {}
            for r in results:
                report.rows += r["rows"]
                report.duplicates += r["duplicates"]
                report.cancelled += r["cancelled"]
                report.invalid += r["invalid"]
                report.invalid_examples += json.loads(r["invalid_examples"])
                if not r["index_count"]:
                    continue
                refs.append(bucket_ref(r["bucket_id"], r["bucket_key"], r["start_ledger"], r["end_ledger"],
                                       r["snapshot_length"], r["index_count"]))
                seen.update(parse(Manifest, r["seen"], f"bucket {r['bucket_id']} seen-set").seen)
                report.items += r["index_count"]
                report.segments += r["segments"]
            progress.rows(report.rows)
            progress.phase("check output")
            check_output(spark, storage, url, [r for r in results if r["index_count"]])
            progress.phase("manifest")
            report.index_id = _claim_index(storage)
            storage.put_manifest(manifest_from_maps(refs, seen=seen, tombstones=tomb.to_proto_map(), journal_cut=0,
                                                    max_bucket_id=first + len(plan) - 1, pending_delete=()))
            report.buckets = len(refs)
            report.bucket_ids = [r.bucket_id for r in refs]
            report.invalid_examples = report.invalid_examples[:10]
        finally:
            storage.close()
    report.seconds = round(time.monotonic() - t0, 3)
    report.rows_per_s = round(report.rows / report.seconds) if report.seconds else 0
    log.info("event=seed_done store=%s rows=%d items=%d buckets=%d segments=%d seconds=%.1f",
             url, report.rows, report.items, report.buckets, report.segments, report.seconds)
    return report


def _count_rows(spark: Any, df: Any, groups: Optional[Sequence[RowGroup]]) -> List[Tuple[int, int, int]]:
    """(ledger id, rows, cancel requests) per ledger: the direct path's planning scan (pyarrow in
    the executors) when `groups` are known, else one Spark aggregation."""
    from pyspark.sql import functions as F  # optional dependency: only this job needs it

    if groups is not None:
        return _count_row_groups(spark, groups)
    is_cancel = F.col("properties").getItem(CANCEL_PROP).isNotNull().cast("long")
    return [(int(r["ledger_id"]), int(r["n"]), int(r["c"] or 0)) for r in
            df.groupBy("ledger_id").agg(F.count("*").alias("n"), F.sum(is_cancel).alias("c")).collect()]


def snapshot_file(url: str, bucket_id: int) -> str:
    """How to name a snapshot in a message: its file in a directory store (bucket/storage/directory.py
    layout), else the bucket id in the store."""
    directory = store_dir(url)
    if directory is not None:
        return str(directory / "snapshots" / f"{bucket_id:020d}.snap")
    return f"bucket {bucket_id} of {url}"


def check_output(spark: Any, storage: BucketSnapshotStorage, url: str, results: Sequence[Any]) -> None:
    """Before the manifest: every snapshot the tasks reported exists in the store as the driver
    sees it (where the manifest goes), and holds the length, segments, items and time range its
    task reported, its segments decoded on the executors. SparkJobError naming the first
    problems otherwise (the store then has no manifest: no writer adopts it)."""
    present = set(storage.list_snapshots(0))
    problems: List[str] = []
    for r in results:
        if r["bucket_id"] not in present:
            problems.append(f"{snapshot_file(url, r['bucket_id'])} is missing")
    readable = [r for r in results if r["bucket_id"] in present]
    found: Dict[int, Dict[str, Any]] = {}
    if readable:
        ids = [int(r["bucket_id"]) for r in readable]
        parts = max(1, min(len(ids), 4 * spark.sparkContext.defaultParallelism))
        with spark_step(f"cannot read back the snapshots written to {url}"):
            found = {c["bucket_id"]: c for c in spark.sparkContext.parallelize(ids, parts)
                     .map(bind_tasks(snapshot_counts, url)).collect()}
    for r in readable:
        bid = int(r["bucket_id"])
        got = found.get(bid, {"error": "not read back"})
        name = snapshot_file(url, bid)
        if got["error"]:
            problems.append(f"{name}: {got['error']}")
            continue
        want = {"length": r["snapshot_length"], "segments": r["segments"], "items": r["index_count"],
                "min_ts": r["min_ts"], "max_ts": r["max_ts"]}
        diff = [f"{k} {got[k]} (task reported {v})" for k, v in want.items() if got[k] != v]
        if diff:
            problems.append(f"{name} holds " + ", ".join(diff))
    if problems:
        log.debug("event=seed_output_check_failed store=%s problems=%d", url, len(problems))  # the error says it
        more = f" and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else ""
        raise SparkJobError(f"seed output check failed for {url}, {len(problems)} of {len(results)} snapshots: "
                            + "; ".join(problems[:MAX_NAMED]) + more
                            + "; no manifest was written (a writer sees an empty store); run the seed again")
    log.info("event=seed_output_checked store=%s snapshots=%d", url, len(results))


def _shuffle_seed(spark: Any, df: Any, url: str, first: int, config: BucketConfig, opts: ClassifyOptions,
                  tomb: LedgerBitmaps, plan: Sequence[Tuple[int, int, int]],
                  counts: Sequence[Tuple[int, int]]) -> List[Any]:
    """The buckets built from rows Spark shuffles to them: one partition per bucket (up to
    MAX_PARTITIONS); a task builds its buckets from rows handed over unsorted, so the JVM only
    shuffles (no sort, no grouping). The result rows, in bucket order."""
    from pyspark.sql import functions as F  # optional dependency: only this job needs it

    partitions = min(len(plan), MAX_PARTITIONS)
    place = place_buckets([c for _, _, c in plan], partitions)
    keys = partition_keys(spark, partitions)
    ledger_bucket, no = [], 0
    for ledger, _ in sorted(counts):  # plan is in ledger order and covers every counted ledger
        while ledger > plan[no][1]:
            no += 1
        ledger_bucket.append((ledger, no, keys[place[no]]))
    ldf = spark.createDataFrame(ledger_bucket, "ledger_id long, bucket_no int, part_key long")
    out = (df.select(*ROW_COLUMNS).join(F.broadcast(ldf), "ledger_id")
           .repartition(partitions, "part_key").select(*ROW_COLUMNS, "bucket_no")
           .mapInArrow(bind_tasks(seed_partition, url, first, config, opts, tomb.to_proto_map()), RESULT_DDL))
    return sorted(out.collect(), key=lambda r: r["bucket_no"])


def _direct_tasks(spark: Any, groups: Sequence[RowGroup], plan: Sequence[Tuple[int, int, int]],
                  report: "SeedReport") -> Optional[List[SeedTask]]:
    """The direct path's tasks (direct.py), or None when they would read too much."""
    tasks = plan_tasks(plan, groups, spark.sparkContext.defaultParallelism)
    amplification = read_amplification(tasks, groups)
    report.read_amplification = round(amplification, 2)
    if amplification > MAX_READ_AMPLIFICATION:
        log.info("event=seed_direct_skipped read_amplification=%.2f", amplification)
        return None
    report.path = "direct"
    return tasks


def _count_row_groups(spark: Any, groups: Sequence[RowGroup]) -> List[Tuple[int, int, int]]:
    """(ledger id, rows, cancel requests) over every row group, counted by executor tasks."""
    total: Dict[int, List[int]] = {}
    tasks = count_tasks(groups, spark.sparkContext.defaultParallelism)
    if not groups:
        return []
    for ledger, n, c in spark.sparkContext.parallelize(tasks, len(tasks)).flatMap(
            bind_tasks(count_ledgers, CANCEL_PROP)).collect():
        acc = total.setdefault(ledger, [0, 0])
        acc[0] += n
        acc[1] += c
    return [(ledger, n, c) for ledger, (n, c) in sorted(total.items())]


def _claim_index(storage: BucketSnapshotStorage, clock: Clock = wall_clock_ms) -> str:
    """Make the store a new index before its manifest (the commit point) is written: a cursor
    with the sequence base of a new index (so releases never collide with ids an earlier index
    published; scheduler/index_identity.py) and an index id the writer adopts at its first start."""
    if storage.get_cursor() is None:
        base = seq_base_for_new_index(clock(), 0)
        storage.put_cursor(ReleaseCursor(has_watermark=False, seq=base).SerializeToString())
    index_id = storage.get_index_id() or uuid.uuid4().hex
    storage.put_index_id(index_id)
    return index_id


def _tombstones(df: Any, opts: ClassifyOptions, report: SeedReport) -> LedgerBitmaps:
    """Cancel requests of the backlog (collected: they are few) as tombstones."""
    from pyspark.sql import functions as F  # optional dependency

    cancels = df.where(F.col("properties").getItem(CANCEL_PROP).isNotNull()).select(*ROW_COLUMNS)
    n = cancels.count()
    if n > MAX_CANCELS_ON_DRIVER:
        raise SparkJobError(f"the backlog holds {n} cancel requests, more than {MAX_CANCELS_ON_DRIVER} this seeder "
                            "collects on the driver")
    found = []
    for r in cancels.toLocalIterator():
        res = classify_row(int(r["ledger_id"]), int(r["entry_id"]), int(r["batch_index"]), int(r["partition"]),
                           bytes(r["payload"]), as_properties(r["properties"]), r["key"], int(r["event_time"] or 0), opts)
        if isinstance(res, Cancel):
            found.append(res)
    report.cancel_requests = len(found)
    tomb = tombstones_of(found)
    report.tombstones = len(tomb)
    return tomb
