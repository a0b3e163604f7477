"""seed, verify and the orphan audit as a user runs them: commands with relative paths, on local[2].

The commands run in this process on the test run's session, from a working directory that is
not the JVM's (support.spark_fixtures.run_spark_commands_here): a relative path that reached the
JVM or its Python workers as typed would name another file. The same commands on local-cluster,
where executors are JVMs in working directories of their own, run in
tests/integration/test_spark_worked_example.py. The bookie and admin servers run in this process
on 127.0.0.1; the executors' bookie listing reaches them over HTTP.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pulsar_lifecycle.bucket import DirectorySnapshotStorage
from pulsar_lifecycle.spark.verify import executor_checks as checks
from support.orphans import SmallCluster
from support.spark_fixtures import (
    assert_no_spark_log_lines,
    assert_one_error_line,
    backlog_rows,
    run_spark_commands_here,
    write_backlog,
)

pytestmark = pytest.mark.spark
BASE = 1_800_000_000_000
USER_CONFIG = json.dumps({"delayedDeliveryMinIndexCountPerBucket": 100,
                          "delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds": 60,
                          "delayedDeliveryMaxIndexesPerBucketSnapshotSegment": 25,
                          "delayedDeliveryMaxNumBuckets": 8})


def test_seed_verify_and_orphan_audit_with_relative_paths(spark, bookie_server, admin_server, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture) -> None:
    SmallCluster.build(bookie_server, admin_server)
    rows = backlog_rows({lg: 60 + 7 * (lg % 5) for lg in range(500, 512)}, BASE, 20 * 60_000, seed=3)
    files = write_backlog(tmp_path / "backlog", rows, per_file=300)
    (tmp_path / "partial").mkdir()
    for f in files[:2]:
        shutil.copy(f, tmp_path / "partial")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "part-000000.parquet").write_bytes(Path(files[0]).read_bytes()[:2000])  # truncated
    common = ["--user-config", USER_CONFIG, "--master", "local[2]", "--quiet"]
    run = run_spark_commands_here(tmp_path, [
        ["spark", "seed", "backlog/", "--store", "store", "--report", "seed.json", *common],
        ["spark", "verify", "--store", "store", "--against", "backlog/", "--out", "verify-full", *common],
        ["spark", "verify", "--store", "store", "--against", "partial/", "--out", "verify-partial", *common],
        ["spark", "orphans", "--bookie-url", bookie_server.url, "--admin-url", admin_server.url,
         "--snapshot-dir", "store", "--state-dir", "scans", "--master", "local[2]", "--quiet",
         "--json-report", "scan.json"],
        ["spark", "seed", "bad/", "--store", "store-bad", *common],
    ], monkeypatch, capfd)
    print("command durations:", [(r.args[1], r.seconds) for r in run.results])
    seed, full, partial, audit, bad = run.results

    # seed: every snapshot the manifest lists is in ./store as this directory sees it.
    assert seed.exit_code == 0, seed.output
    report = json.loads((tmp_path / "seed.json").read_text())
    store = DirectorySnapshotStorage(tmp_path / "store")
    assert report["buckets"] >= 3 and store.list_snapshots() == report["bucket_ids"]
    assert report["items"] == len(rows) and store.get_manifest() is not None

    # verify: clean against the whole export; the seeded store's items outside a partial export are violations.
    assert full.exit_code == 0, full.output
    full_report = json.loads((tmp_path / "verify-full" / "report.json").read_text())
    assert full_report["ok"] and full_report["against"]["store_kind"] == "seeded"
    assert full_report["against"]["found"] == len(rows) and full_report["against"]["not_in_export"] == 0
    assert partial.exit_code == 1, partial.output
    part_report = json.loads((tmp_path / "verify-partial" / "report.json").read_text())
    assert part_report["violations"] == {checks.NOT_IN_EXPORT: len(rows) - 600}

    # the orphan audit: executor tasks list the bookie and write the candidates under ./scans.
    assert audit.exit_code == 0, audit.output
    scan = json.loads((tmp_path / "scan.json").read_text())
    assert sorted(r["ledger_id"] for r in scan["orphanSample"]) == [5, 6, 7]
    assert (tmp_path / "scans" / "scans" / f"{scan['scanId']}.json").exists()
    assert (tmp_path / "scans" / "scans" / f"{scan['scanId']}.parquet").is_dir()

    # a damaged input: one Error: line naming the file and the reader's own message; the stack
    # traces are in the Spark log, none on the console (the JVM's stderr included).
    assert_one_error_line(bad, "bad/part-000000.parquet")
    assert_no_spark_log_lines(bad.output, run.stderr)
    assert "bad/part-000000.parquet" in run.spark_log and "\tat " in run.spark_log
    assert DirectorySnapshotStorage(tmp_path / "store-bad").get_manifest() is None
