"""Orphan audit at scale: N listed ledgers against N in-use entries, from exported Parquet lists.

The data (generated with numpy/pyarrow before any timing): listed ids 0..N-1 with a component,
an owner over 1,000 topics and a ctime; in-use ids: 90 % of the listed ids plus 10 % ids above
N (other ledgers the metadata knows). So 10 % of the listing is unreferenced; of those 1/4 are
younger than --older-than and 1/20 unlabelled. The newest known id is above every listed id.

Timed:
  spark      run_audit on local[2] (session already up): read both lists, check the ids, the
             anti-join with every status, the counts, write the candidates, commit the scan.
  spark-2nd  a second scan that is confirmed against the first (adds the confirming join).
  pandas     baseline in one process: read both lists, `isin` difference, the same age,
             unlabelled and newest-id filters (no candidates written).
  pyset      baseline: Python set of in-use ids, filter the listed ids in a list comprehension
             (ids only, no rules).
Rows/s = listed rows / wall seconds. Every path must find the same orphan count.

    flock /tmp/pl-heavy.lock python bench/bench_spark_orphans.py [--rows 10000000]
    python bench/bench_spark_orphans.py --rows 2000 --shuffle-partitions 2 --driver-memory 1g   # CI smoke
"""
from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))

from pulsar_lifecycle.spark.orphans.driver import AuditConfig, run_audit  # noqa: E402
from pulsar_lifecycle.spark.orphans.driver_frames import default_export_coverage  # noqa: E402
from pulsar_lifecycle.spark.orphans.state import ScanStateDir  # noqa: E402
from pulsar_lifecycle.spark.progress import JobProgress  # noqa: E402
from pulsar_lifecycle.spark.session import get_spark  # noqa: E402

DAY_MS = 86_400_000


def generate(root: Path, n: int, now_ms: int, seed: int = 7) -> None:
    """Write listed.parquet and in_use.parquet (each a Spark-style directory with _SUCCESS)."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int64)
    topic = rng.integers(0, 1000, n)
    owners = np.array([f"public/default/persistent/topic-{t}" for t in range(1000)], dtype=object)[topic]
    comp = np.where(ids % 20 == 11, None, np.where(ids % 3 == 0, "managed-cursor", "managed-ledger")).astype(object)
    age_days = np.where((ids % 40) == 1, 0.1, 2.0 + (ids % 5))
    created = (now_ms - age_days * DAY_MS).astype(np.int64)
    unused = (ids % 10) == 1  # 10 % unreferenced
    used_ids = ids[~unused]
    extra = np.arange(n, n + (n - used_ids.size), dtype=np.int64)  # ids of ledgers not in this listing
    in_use = np.concatenate([used_ids, extra])
    rng.shuffle(in_use)
    for name, table in (("listed", pa.table({"ledger_id": ids, "component": comp, "owner": owners,
                                              "created_ms": created})),
                        ("in_use", pa.table({"ledger_id": in_use}))):
        d = root / f"{name}.parquet"
        d.mkdir()
        half = table.num_rows // 2
        pq.write_table(table.slice(0, half), d / "part-00000.parquet")
        pq.write_table(table.slice(half), d / "part-00001.parquet")
        (d / "_SUCCESS").write_bytes(b"")


def pandas_baseline(root: Path, now_ms: int, older_than_ms: int) -> int:
    import pandas as pd

    listed = pd.read_parquet(root / "listed.parquet")
    in_use = pd.read_parquet(root / "in_use.parquet")
    newest = in_use["ledger_id"].max()
    cand = listed[~listed["ledger_id"].isin(in_use["ledger_id"])]
    cand = cand[cand["component"].notna() & (cand["ledger_id"] <= newest)
                & (cand["created_ms"] <= now_ms - older_than_ms)]
    return int(len(cand))


def pyset_baseline(root: Path) -> int:
    used = set(pq.read_table(root / "in_use.parquet", columns=["ledger_id"]).column(0).to_pylist())
    listed = pq.read_table(root / "listed.parquet", columns=["ledger_id"]).column(0).to_pylist()
    return len([i for i in listed if i not in used])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dir", default=None, help="Work directory (default: a temporary one, removed).")
    ap.add_argument("--shuffle-partitions", type=int, default=8, help="spark.sql.shuffle.partitions (2 for tiny runs).")
    ap.add_argument("--driver-memory", default="4g")
    args = ap.parse_args()
    n = args.rows
    root = Path(args.dir or tempfile.mkdtemp(prefix="pl-orphans-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    now_ms = int(time.time() * 1000)
    older = DAY_MS
    try:
        t = time.perf_counter()
        generate(root, n, now_ms)
        print(f"generated {n:,} listed + {n:,} in-use rows in {time.perf_counter() - t:.1f} s")

        t = time.perf_counter()
        spark = get_spark("local[2]", "bench-orphans", **{"spark.sql.shuffle.partitions": str(args.shuffle_partitions),
                                                          "spark.driver.memory": args.driver_memory})
        spark.range(1000).count()
        print(f"spark session + first query: {time.perf_counter() - t:.1f} s (not in the figures below)")
        listed, in_use = str(root / "listed.parquet"), str(root / "in_use.parquet")
        cfg = AuditConfig(listing_files=[listed], in_use_files=[in_use],
                          in_use_file_coverage=default_export_coverage(), older_than_ms=older,
                          confirm_after_ms=0, sample=10, clock_ms=lambda: now_ms)
        state = ScanStateDir(root / "state")
        results = {}
        t = time.perf_counter()
        with JobProgress(spark, "scan 1", enabled=False) as prog:
            first = run_audit(spark, cfg, state, progress=prog)
        results["spark"] = (time.perf_counter() - t, first.orphans)
        print(f"scan 1 phases (s): {prog.summary()['phases_s']}")
        cfg2 = AuditConfig(listing_files=[listed], in_use_files=[in_use],
                           in_use_file_coverage=default_export_coverage(), older_than_ms=older,
                           confirm_after_ms=0, sample=10, clock_ms=lambda: now_ms + 1)
        t = time.perf_counter()
        with JobProgress(spark, "scan 2", enabled=False) as prog:
            second = run_audit(spark, cfg2, state, progress=prog)
        results["spark-2nd (confirming)"] = (time.perf_counter() - t, second.orphans)
        print(f"scan 2 phases (s): {prog.summary()['phases_s']}")
        assert second.confirmed == first.orphans, (second.confirmed, first.orphans)
        print(f"statuses: {first.counts}")
        spark.stop()
        gc.collect()

        t = time.perf_counter()
        found = pandas_baseline(root, now_ms, older)
        results["pandas baseline"] = (time.perf_counter() - t, found)
        gc.collect()
        t = time.perf_counter()
        unref = pyset_baseline(root)
        results["python set (ids only)"] = (time.perf_counter() - t, unref)
        assert results["pandas baseline"][1] == first.orphans, (results["pandas baseline"], first.orphans)

        base = results["pandas baseline"][0]
        print(f"\n{'path':<26} {'wall s':>8} {'listed rows/s':>14} {'vs pandas':>10} {'found':>12}")
        for name, (secs, found) in results.items():
            print(f"{name:<26} {secs:8.1f} {n / secs:14,.0f} {base / secs:9.2f}x {found:12,}")
        print("(python set counts every unreferenced id, without the age/label/newest rules)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
