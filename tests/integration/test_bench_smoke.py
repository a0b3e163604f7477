"""Every benchmark in bench/ still completes (issue 27, item 5): each script runs as a subprocess at
a tiny size and must exit 0 and reach its closing line.

The counts are the scripts' own: each exits non-zero when a message is missing, duplicated or
released early (or a stage's count disagrees), so a benchmark that no longer completes fails the
build here instead of on the next person who runs it. Times are only printed (`pytest -s`, or the
output of a failing case), never asserted: a 2-core CI machine gives no stable figure.

bench/ holds benchmarks (bench_*.py) and their shared helpers (_*.py) only: reproductions of broker
behaviour are tests or scripts/repro/. The Spark benchmarks run only
where PySpark is installed (the `test` extra installs it); bench_vs_pulsar.py only when the run
covers real Pulsar (TEST_BROKERS), and so does bench_deletion.py's
`--storage pulsar`.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

from support.broker_fixtures import broker_kinds
from support.paths import REPO

BENCH = REPO / "bench"

no_spark = pytest.mark.skipif(importlib.util.find_spec("pyspark") is None,
                              reason="PySpark is not installed (the `test` extra installs it)")
no_pulsar = pytest.mark.skipif("pulsar" not in broker_kinds(),
                               reason="this run does not cover real Apache Pulsar (TEST_BROKERS)")


def case(case_id: str, script: str, args: List[str], closing: str, timeout: float, *marks: pytest.MarkDecorator):
    """One smoke run: the script, its tiny-size arguments ("{tmp}": the test's tmp_path), a line it prints
    at its end, and its timeout in seconds."""
    return pytest.param(script, args, closing, timeout, id=case_id,
                        marks=[pytest.mark.timeout(timeout + 60), *marks])


CASES = [
    case("bucket_memory", "bench_bucket_memory.py", ["--sizes", "20000"], "ratio heap/bucket", 120),
    case("bucket_recovery", "bench_bucket_recovery.py", ["--n", "20000", "--runs", "1"],
         "ratio replay/recovery", 120),
    case("dedup", "bench_dedup.py", ["--messages", "2000", "--runs", "1", "--burst", "200"],
         "median ratio to the bare producer", 120),
    case("delay_level-index", "bench_delay_level.py", ["index", "--messages-per-day", "200", "--days", "40"],
         "peak near-term index entries", 60),
    case("delay_level-forward", "bench_delay_level.py",
         ["forward", "--messages", "1000", "--partitions", "2", "--runs", "1"], "ratio syncer/pipe", 180),
    case("delay_level-forward_cost", "bench_delay_level.py", ["forward-cost", "--messages", "500"],
         "CPU per message", 120),
    case("delay_level-rss", "bench_delay_level.py", ["rss", "--sizes", "100,2000", "--settle-seconds", "1"],
         "syncer RSS", 180),
    case("delay_level_batch_cap", "bench_delay_level_batch_cap.py",
         ["--broker", "lite", "--messages", "300", "--runs", "1"], "batching_max_messages=1000", 120),
    case("deletion", "bench_deletion.py", ["--ledgers", "40", "--topics", "4", "--runs", "1"],
         "internalStats under load", 180),
    case("deletion-real_bookie", "bench_deletion.py",
         ["--storage", "pulsar", "--ledgers", "20", "--topics", "2", "--runs", "1", "--concurrency", "2"],
         "median (real bookie", 300, no_pulsar),
    case("journal_group_commit", "bench_journal_group_commit.py", ["--appends", "40", "--threads", "1,2"],
         "threads=2 appends=40", 60),
    case("writer_throughput", "bench_writer_throughput.py", ["--messages", "1000", "--runs", "1"],
         "ratio writer/pipe", 240),
    case("writer_lateness", "bench_writer_lateness.py",
         ["--rate", "200", "--seconds", "2", "--lead-ms", "1000", "--preindexed-seconds", "1",
          "--preindexed-lead-s", "6"], "ratio writer p99 lateness", 240),
    case("writer_restart", "bench_writer_restart.py", ["--broker", "lite", "--kills", "1", "--rate", "100"],
         "held messages read from gaps", 240),
    case("writer_scaling", "bench_writer_scaling.py", ["--messages", "400", "--runs", "1"],
         "ratio vs partitioned x1", 300),
    case("spark_orphans", "bench_spark_orphans.py",
         ["--rows", "2000", "--shuffle-partitions", "2", "--driver-memory", "1g"],
         "python set (ids only)", 600, pytest.mark.spark, no_spark),
    case("spark_seed", "bench_spark_seed.py",
         ["--rows", "2000", "--spread-hours", "0.001", "--baseline-rows", "1000", "--files", "2",
          "--shuffle-partitions", "2", "--driver-memory", "1g", "--writer-settle-s", "1", "--workdir", "{tmp}/seed"],
         "writer on the seeded store", 600, pytest.mark.spark, no_spark),
    case("vs_pulsar", "bench_vs_pulsar.py", ["--smoke"], "dedup msg/s DedupPublisher/broker dedup", 600, no_pulsar),
]


def run_bench(script: str, args: List[str], timeout: float, tmp: Path) -> subprocess.CompletedProcess:
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("script,args,closing,timeout", CASES)
def test_benchmark_completes_at_a_tiny_size(script: str, args: List[str], closing: str, timeout: float,
                                           tmp_path: Path) -> None:
    t0 = time.monotonic()
    res: Optional[subprocess.CompletedProcess] = None
    try:
        res = run_bench(script, args, timeout, tmp_path)
    finally:
        load = os.getloadavg()[0]
        took = time.monotonic() - t0
        # Times are printed, never asserted.
        print(f"\n{script} {' '.join(args)}: {took:.1f} s, load average {load:.2f}")
        if res is not None:
            print(res.stdout[-4000:])
    assert res.returncode == 0, (f"{script} exited {res.returncode}\n--- stdout ---\n{res.stdout[-3000:]}\n"
                                 f"--- stderr ---\n{res.stderr[-3000:]}")
    assert closing in res.stdout, f"{script} did not reach its closing line {closing!r}:\n{res.stdout[-3000:]}"


def test_every_benchmark_has_a_smoke_case() -> None:
    """A benchmark added to bench/ without a case here fails the build."""
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    covered = {c.values[0] for c in CASES}
    assert scripts - covered == set(), f"benchmarks without a smoke case: {sorted(scripts - covered)}"


def test_bench_holds_benchmarks_and_their_helpers_only() -> None:
    """A script in bench/ is a benchmark (bench_*.py, smoke-run above) or a helper the benchmarks
    share (_*.py); a reproduction goes to a test or scripts/repro/."""
    other = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith(("bench_", "_")))
    assert other == [], f"neither a benchmark nor a helper in bench/: {other}"
