"""Offline pipeline: `spark seed` vs the engine, a writer started on the seeded store, `spark verify`.

    flock /tmp/pl-heavy.lock .venv/bin/python bench/bench_spark_seed.py                 # 10M rows
    flock /tmp/pl-heavy.lock .venv/bin/python bench/bench_spark_seed.py --rows 1000000 --baseline-rows 200000
    flock /tmp/pl-heavy.lock .venv/bin/python bench/bench_spark_seed.py --seed-only          # the seed step alone
    .venv/bin/python bench/bench_spark_seed.py --rows 2000 --spread-hours 0.001 --baseline-rows 1000 --files 2 \
        --shuffle-partitions 2 --driver-memory 1g --writer-settle-s 1 --workdir DIR        # CI smoke (tiny)

1. An export of N rows (what export-backlog writes) is generated: `--ledgers` ledgers in order,
   deliver-at spread over `--spread-hours` from now (the earliest already due when the writer
   starts), 24-byte payloads, the protocol property, batch index -1.
2. seed: `run_seed` on local[2] into a new directory store with the shipped writer config
   (64 buckets max, 5000 indexes / 300 s per segment), from reading Parquet to the manifest,
   snapshots written by the executors. Rows/s = N / wall time (the session is already up).
3. baseline: the engine (BucketIndex, one process) building the same snapshots from the same
   rows: the writer's classifier, add() in ledger order in ingest batches of 500, Pulsar's seal
   rule with the seeder's threshold, no merges; over the first `--baseline-rows` rows (the
   engine's cost per row does not depend on N: one bucket in memory at a time). The buckets the
   baseline completes are compared byte for byte with the seeded ones.
4. verify: `run_verify` of the seeded store (indexes/s), then again `--against` the export.
5. writer: (a) the writer's engine in a fresh process: BucketIndex(store).recover() and the first
   pop_due, timed from creating the index, RSS growth over the process after imports (as
   bench_bucket_recovery measures); (b) the real BucketSnapshotWriter (localrun, its own process,
   embedded broker) started on the seeded store: time from process start to the first release
   on the output topic, and its RSS 10 s after start minus the same writer's on an empty store.
Ledgers default to 50,000 entries (`--ledgers 200` for 10M: Pulsar's default rollover,
managedLedgerMaxEntriesPerLedger), deliver-at over 24 h.
Targets: seed >= 500,000 rows/s; first release within 2 s; RSS growth <= 64 MB.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _writer_common as wc  # noqa: E402 - bench helpers live next to this file
from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DirectorySnapshotStorage  # noqa: E402
from pulsar_lifecycle.bucket.records import DelayedMessage  # noqa: E402
from pulsar_lifecycle.scheduler.wake import send_wake_tick  # noqa: E402
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP  # noqa: E402
from pulsar_lifecycle.spark.backlog import EXPORT_SCHEMA, as_properties, classify_row  # noqa: E402
from pulsar_lifecycle.spark.progress import JobProgress  # noqa: E402
from pulsar_lifecycle.spark.seed.driver import run_seed  # noqa: E402
from pulsar_lifecycle.spark.session import get_spark  # noqa: E402
from pulsar_lifecycle.spark.settings import writer_settings  # noqa: E402
from pulsar_lifecycle.spark.verify.driver import run_verify  # noqa: E402

HOUR_MS = 3_600_000


def generate(out: Path, rows: int, ledgers: int, spread_ms: int, base_ms: int, files: int, batch: int = 0) -> float:
    """Write the export (`batch` > 0: that many messages per entry, batch indexes 0..batch-1, as a
    batching producer writes them; 0: unbatched, batch index -1); returns seconds."""
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    per_ledger = -(-rows // ledgers)
    rng = np.random.default_rng(7)
    per_file = -(-rows // files)
    for f in range(files):
        lo, hi = f * per_file, min(rows, (f + 1) * per_file)
        if lo >= hi:
            break
        i = np.arange(lo, hi, dtype=np.int64)
        at = base_ms + rng.integers(0, spread_ms, hi - lo, dtype=np.int64)
        keys = pa.array([DELIVER_AT_PROP] * (hi - lo), pa.string())
        props = pa.MapArray.from_arrays(pa.array(np.arange(0, hi - lo + 1, dtype=np.int32)), keys,
                                        pa.array(at.astype(str), pa.string()))
        n = hi - lo
        in_ledger = i % per_ledger
        entry = in_ledger // batch if batch else in_ledger
        batch_index = (in_ledger % batch).astype(np.int32) if batch else np.full(n, -1, np.int32)
        table = pa.Table.from_arrays([
            pa.array(1000 + i // per_ledger), pa.array(entry), pa.array(batch_index),
            pa.array(np.full(n, -1, np.int32)), pa.array(at),
            pa.array([b"job-%020d" % k for k in range(lo, hi)], pa.binary()),
            pa.nulls(n, pa.string()), props, pa.array(np.zeros(n, np.int64)), pa.nulls(n, pa.string()),
            pa.array(np.full(n, base_ms, np.int64)), pa.array(["bench"] * n, pa.string()),
        ], schema=EXPORT_SCHEMA)
        pq.write_table(table, out / f"part-{f:06d}.parquet", compression="zstd")
    return time.monotonic() - t0


def engine_baseline(inputs: Path, store: Path, rows: int, config: BucketConfig, opts: Any, threshold: int) -> Dict[str, Any]:
    """The engine building snapshots from the first `rows` rows, in ledger order."""
    cfg = BucketConfig(delayed_delivery_min_index_count_per_bucket=threshold,
                       delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds=(
                           config.delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds),
                       delayed_delivery_max_indexes_per_bucket_snapshot_segment=(
                           config.delayed_delivery_max_indexes_per_bucket_snapshot_segment),
                       delayed_delivery_max_num_buckets=-1, max_unacked_per_bucket=10**9,
                       max_seal_delay_millis=10**12, topic=config.topic, cursor=config.cursor)
    ix = BucketIndex(DirectorySnapshotStorage(store), cfg)
    ix.recover()
    t0 = time.monotonic()
    done = 0
    for path in sorted(inputs.glob("part-*.parquet")):
        table = pq.read_table(path)
        cols = [table.column(c).to_pylist() for c in ("ledger_id", "entry_id", "batch_index", "partition",
                                                     "payload", "properties", "key", "event_time")]
        batch: List[DelayedMessage] = []
        for ledger, entry, bi, part, payload, props, key, evt in zip(*cols):
            if done >= rows:
                break
            batch.append(classify_row(ledger, entry, bi, part, payload, as_properties(props), key, evt, opts))
            done += 1
            if len(batch) == 500:
                ix.add(batch)
                batch = []
        if batch:
            ix.add(batch)
        if done >= rows:
            break
    ix.seal()
    seconds = time.monotonic() - t0
    return {"rows": done, "seconds": round(seconds, 2), "rows_per_s": round(done / seconds)}


def same_bytes(a: Path, b: Path) -> Dict[str, int]:
    """Compare the snapshots of two stores bucket by bucket: those with the same key."""
    sa, sb = DirectorySnapshotStorage(a), DirectorySnapshotStorage(b)
    by_key = {sb.snapshot_info(i)["bucket_key"]: i for i in sb.list_snapshots()}
    same = differ = 0
    for i in sa.list_snapshots():
        j = by_key.get(sa.snapshot_info(i)["bucket_key"])
        if j is None:
            continue
        fa = (a / "snapshots" / f"{i:020d}.snap").read_bytes()
        fb = (b / "snapshots" / f"{j:020d}.snap").read_bytes()
        if fa == fb:
            same += 1
        else:
            differ += 1
    return {"compared": same + differ, "identical": same}


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and every live descendant (the driver,
    Spark's JVM and its Python workers): the work a run cost, whatever else ran on the machine."""
    children: Dict[int, List[int]] = {}
    times: Dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        times[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def rss_kb(pid: int) -> int:
    """VmRSS of a process in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_writer(workdir: Path, store: Path, broker_url: str, wait_first: bool, settle_s: float = 10.0) -> Dict[str, Any]:
    """Start the writer (localrun process) on `store`; first release time and RSS after `settle_s`."""
    topics = wc.topics_for("seed")
    config = wc.write_writer_config(workdir, topics)
    cfg_text = config.read_text().replace(str(workdir / "snapshots"), str(store))
    config.write_text(cfg_text)
    client = wc.quiet_client(broker_url)
    consumer = wc.output_consumer(client, topics.out)
    send_wake_tick(client, topics.ticks)  # what export-backlog --wake-topic leaves for the first start
    t0 = time.monotonic()
    proc = wc.start_localrun(config, broker_url, workdir)
    first = None
    try:
        if wait_first:
            msg = consumer.receive(timeout_millis=60_000)
            first = time.monotonic() - t0
            consumer.acknowledge(msg)
        time.sleep(max(0.0, settle_s - (time.monotonic() - t0)))
        rss = rss_kb(proc.pid)
    finally:
        wc.stop_process(proc)
        consumer.close()
        client.close()
    return {"first_release_s": round(first, 3) if first is not None else None, "rss_mb": round(rss / 1024, 1)}


def recover_first_release(store: Path) -> Dict[str, Any]:
    """Child process: recover the store and pop the first due item; time and RSS growth."""
    before = rss_kb(os.getpid())
    t0 = time.monotonic()
    ix = BucketIndex(DirectorySnapshotStorage(store))
    report = ix.recover()
    first = ix.pop_due(int(time.time() * 1000), 1)
    ms = (time.monotonic() - t0) * 1000
    return {"first_release_ms": round(ms, 1), "released": len(first), "pending": report.pending,
            "rss_growth_mb": round((rss_kb(os.getpid()) - before) / 1024, 1), "bytes_read": report.bytes_read}


def executor_cpu(work: Path, rows: int) -> None:
    """CPU time per row of what one Spark task does for one bucket (no Spark, no writes)."""
    from pulsar_lifecycle.bucket.bitmap import LedgerBitmaps
    from pulsar_lifecycle.spark.backlog import ROW_COLUMNS
    from pulsar_lifecycle.spark.seed.executor_bucket import build_bucket

    shutil.rmtree(work, ignore_errors=True)
    generate(work / "export", rows, max(1, rows // 50_000), 24 * HOUR_MS, int(time.time() * 1000), 1)
    config, opts = writer_settings(str(wc.WRITER_CONFIG), None)
    table = pq.read_table(work / "export").select(list(ROW_COLUMNS))
    runs = []
    for _ in range(3):
        t0 = time.process_time()
        build = build_bucket(table, config, opts, LedgerBitmaps())
        runs.append((time.process_time() - t0) / rows * 1e6)
    shutil.rmtree(work, ignore_errors=True)
    print(f"executor side: {rows:,} rows -> {build.items:,} items, {len(build.segments)} segments; CPU per row "
          f"{', '.join(f'{r:.2f}' for r in runs)} us (median {sorted(runs)[1]:.2f} us)")


def spark_plan_only(spark: Any, export: Path, config: BucketConfig) -> Dict[str, Any]:
    """Spark's side of the seed alone: the same read, broadcast join of ledger -> bucket and
    partition key, repartition and mapInArrow, with a function that only counts its rows (no
    classify, encode or writes); wall seconds and CPU of all Spark processes."""
    from pyspark.sql import functions as F

    from pulsar_lifecycle.bucket.sealing import plan_ledger_buckets
    from pulsar_lifecycle.spark.backlog import ROW_COLUMNS, read_backlog
    from pulsar_lifecycle.spark.seed.driver import MAX_PARTITIONS, partition_keys, place_buckets

    df = read_backlog(spark, [str(export)])
    counts = sorted((int(r["ledger_id"]), int(r["n"]))
                    for r in df.groupBy("ledger_id").agg(F.count("*").alias("n")).collect())
    plan = plan_ledger_buckets(counts, config.delayed_delivery_min_index_count_per_bucket,
                               config.delayed_delivery_max_num_buckets)
    partitions = min(len(plan), MAX_PARTITIONS)
    place, keys = place_buckets([c for _, _, c in plan], partitions), partition_keys(spark, partitions)
    ledger_bucket = []
    for ledger, _ in counts:
        no = next(i for i, (_, end, _) in enumerate(plan) if ledger <= end)
        ledger_bucket.append((ledger, no, keys[place[no]]))
    ldf = spark.createDataFrame(ledger_bucket, "ledger_id long, bucket_no int, part_key long")

    def count_rows(batches: Any) -> Any:
        yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})

    cpu0, t0 = tree_cpu_s(os.getpid()), time.monotonic()
    out = (df.select(*ROW_COLUMNS).join(F.broadcast(ldf), "ledger_id").repartition(partitions, "part_key")
           .select(*ROW_COLUMNS, "bucket_no").mapInArrow(count_rows, "n long").collect())
    return {"seconds": round(time.monotonic() - t0, 1), "rows": sum(r["n"] for r in out),
            "cpu_s": round(tree_cpu_s(os.getpid()) - cpu0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--ledgers", type=int, default=0, help="default: rows / 50,000")
    ap.add_argument("--spread-hours", type=float, default=24.0)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--baseline-rows", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=0, help="messages per entry (0 = unbatched)")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--workdir", default="/tmp/pl-bench-spark-seed")
    ap.add_argument("--skip-writer", action="store_true")
    ap.add_argument("--keep", action="store_true", help="Keep the work directory.")
    ap.add_argument("--shuffle", action="store_true", help="Seed through Spark's shuffle (no direct row-group reads).")
    ap.add_argument("--seed-only", action="store_true", help="Only generate and seed (no verify, baseline, writer).")
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--executor-rows", type=int, default=0,
                    help="Only time the executor side (seeding.build_bucket) on one bucket of this many rows, "
                         "in this process, in CPU time (3 runs).")
    ap.add_argument("--spark-only", action="store_true",
                    help="Only time Spark's side of the seed plan (read, join, repartition + mapInArrow counting rows).")
    ap.add_argument("--shuffle-partitions", type=int, default=0,
                    help="spark.sql.shuffle.partitions (0: Spark's default; 2 for tiny runs)")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--writer-settle-s", type=float, default=10.0,
                    help="How long each writer runs before its RSS is read (s).")
    ap.add_argument("--recover-only", default=None, help=argparse.SUPPRESS)  # child process mode
    args = ap.parse_args()
    if args.recover_only:
        print(json.dumps(recover_first_release(Path(args.recover_only))))
        return
    if args.executor_rows:
        executor_cpu(Path(args.workdir), args.executor_rows)
        return
    args.ledgers = args.ledgers or max(1, args.rows // 50_000)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: Dict[str, Any] = {"rows": args.rows, "ledgers": args.ledgers, "cores": os.cpu_count()}
    base = int(time.time() * 1000)
    results["generate_s"] = round(generate(work / "export", args.rows, args.ledgers,
                                           int(args.spread_hours * HOUR_MS), base, args.files, args.batch), 1)
    print(f"generated {args.rows:,} rows in {results['generate_s']} s", flush=True)
    config, opts = writer_settings(str(wc.WRITER_CONFIG), None)

    conf = {"spark.driver.memory": args.driver_memory}
    if args.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(args.shuffle_partitions)
    spark = get_spark("local[2]", "bench-seed", **conf)
    spark.range(10).count()  # session warm, not counted
    if args.spark_only:
        res = spark_plan_only(spark, work / "export", config)
        print(f"Spark's plan alone: {res['rows']:,} rows in {res['seconds']} s = {res['rows'] / res['seconds']:,.0f} "
              f"rows/s; CPU of all Spark processes {res['cpu_s']} s", flush=True)
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        return
    cpu0 = tree_cpu_s(os.getpid())
    with JobProgress(spark, "seed") as progress:
        seed = run_seed(spark, [str(work / "export")], str(work / "seeded"), config, opts, progress=progress,
                        direct=not args.shuffle)
    results["seed_cpu_s"] = round(tree_cpu_s(os.getpid()) - cpu0, 1)
    results["seed_phases_s"] = progress.summary()["phases_s"]
    results["seed"] = {"seconds": seed.seconds, "rows_per_s": seed.rows_per_s, "buckets": seed.buckets,
                       "segments": seed.segments, "items": seed.items, "threshold": seed.planned_threshold,
                       "path": seed.path, "read_amplification": seed.read_amplification}
    print(f"seed: {seed.rows:,} rows -> {seed.buckets} buckets, {seed.segments:,} segments in {seed.seconds} s "
          f"= {seed.rows_per_s:,.0f} rows/s ({seed.path} path); CPU of all Spark processes {results['seed_cpu_s']} s",
          flush=True)
    if args.seed_only:
        spark.stop()
        print(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return
    if not args.skip_verify:
        with JobProgress(spark, "verify") as progress:
            ver = run_verify(spark, str(work / "seeded"), config, progress=progress)
        results["verify"] = {"seconds": ver.seconds, "indexes_per_s": ver.items_per_s, "ok": ver.ok}
        print(f"verify: {ver.items:,} indexes in {ver.seconds} s = {ver.items_per_s:,.0f}/s ok={ver.ok}", flush=True)
        if not ver.ok or ver.items != seed.items:
            raise SystemExit(f"verify: ok={ver.ok}, {ver.items:,} indexes for {seed.items:,} seeded")
        with JobProgress(spark, "verify --against") as progress:
            vag = run_verify(spark, str(work / "seeded"), config, against=[str(work / "export")], opts=opts,
                             progress=progress)
        results["verify_against"] = {"seconds": vag.seconds, "rows_per_s": round(args.rows / vag.seconds),
                                     "ok": vag.ok, "found": vag.against["found"] if vag.against else None}
        print(f"verify --against: {vag.seconds} s ok={vag.ok} found={results['verify_against']['found']:,}", flush=True)
        if not vag.ok or results["verify_against"]["found"] != args.rows:
            raise SystemExit(f"verify --against: ok={vag.ok}, found {results['verify_against']['found']} of {args.rows:,}")
    spark.stop()

    if not args.skip_baseline:
        base_res = engine_baseline(work / "export", work / "engine", args.baseline_rows, config, opts,
                                   seed.planned_threshold)
        results["engine_baseline"] = base_res
        results["engine_vs_seed_bytes"] = same_bytes(work / "seeded", work / "engine")
        results["ratio_seed_vs_engine"] = round(seed.rows_per_s / base_res["rows_per_s"], 2)
        print(f"engine baseline: {base_res['rows']:,} rows in {base_res['seconds']} s = {base_res['rows_per_s']:,}/s; "
              f"seed is {results['ratio_seed_vs_engine']}x; identical snapshots {results['engine_vs_seed_bytes']}",
              flush=True)

    child = [sys.executable, __file__, "--recover-only"]
    results["engine_recovery"] = json.loads(subprocess.run(child + [str(work / "seeded")], check=True,
                                                           capture_output=True, text=True).stdout)
    print(f"engine on the seeded store: first release {results['engine_recovery']['first_release_ms']} ms after "
          f"creating the index, RSS growth {results['engine_recovery']['rss_growth_mb']} MB", flush=True)
    if not args.skip_writer:
        from pulsar_lifecycle.runtime.broker import EmbeddedBroker

        broker = EmbeddedBroker(data_dir=work / "broker")
        broker.start()
        try:
            seeded = run_writer(work / "w-seeded", work / "seeded", broker.service_url, wait_first=True,
                                settle_s=args.writer_settle_s)
            empty = run_writer(work / "w-empty", work / "empty-store", broker.service_url, wait_first=False,
                               settle_s=args.writer_settle_s)
        finally:
            broker.stop(remove_data=True)
        results["writer"] = {"seeded": seeded, "empty": empty,
                             "rss_growth_mb": round(seeded["rss_mb"] - empty["rss_mb"], 1)}
        print(f"writer on the seeded store: first release {seeded['first_release_s']} s after process start; "
              f"RSS {seeded['rss_mb']} MB vs {empty['rss_mb']} MB on an empty store "
              f"(growth {results['writer']['rss_growth_mb']} MB)", flush=True)
    print(json.dumps(results, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
