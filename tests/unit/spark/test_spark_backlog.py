"""External datasets for export-backlog: reserved positions, idempotent re-runs, clear errors."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP
from pulsar_lifecycle.spark.backlog import EXTERNAL_LEDGER_BASE, ClassifyOptions, classify_row
from pulsar_lifecycle.spark.errors import SparkJobError
from pulsar_lifecycle.spark.export.driver import import_jobs, part_files


def _jobs(path: Path, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            job = {"deliver_at": 1_900_000_000_000 + i, "payload": f"job {i}", "key": f"k{i}"}
            if i % 2:
                job["target"] = "persistent://public/default/t"
            fh.write(json.dumps(job) + "\n")
    return path


def test_external_jobs_get_reserved_positions_and_classify_like_messages(tmp_path: Path) -> None:
    report = import_jobs(_jobs(tmp_path / "jobs.jsonl", 7), 3, tmp_path / "out", batch_rows=3)
    assert report.files_written == 3 and report.rows_written == 7
    rows = [r for p in part_files(tmp_path / "out") for r in pq.read_table(p).to_pylist()]
    assert [(r["ledger_id"], r["entry_id"]) for r in rows] == [(EXTERNAL_LEDGER_BASE + 3 * 2**40, i) for i in range(7)]
    opts = ClassifyOptions(now_ms=1_900_000_000_000, max_delay_ms=10**9, allowed_target_prefixes=("persistent://",))
    for i, r in enumerate(rows):
        props = dict(r["properties"])
        assert props[DELIVER_AT_PROP] == str(1_900_000_000_000 + i)
        assert (TARGET_PROP in props) == bool(i % 2)
        msg = classify_row(r["ledger_id"], r["entry_id"], r["batch_index"], r["partition"], r["payload"], props,
                           r["key"], r["event_time"], opts)
        assert msg.deliver_at == 1_900_000_000_000 + i and msg.payload == f"job {i}".encode()
        assert msg.partition == -1 and msg.key == f"k{i}"


def test_a_rerun_after_a_crash_exports_nothing_twice(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path / "jobs.jsonl", 10)
    import_jobs(jobs, 0, tmp_path / "out", batch_rows=4)
    (tmp_path / "out" / ".part-000009-x.parquet.tmp").write_bytes(b"torn")  # a crash mid-write
    result = CliRunner().invoke(main, ["export-backlog", "--from-jobs", str(jobs), "--dataset-id", "0",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "0 new files" in result.output and "10 already exported" in result.output
    assert not list((tmp_path / "out").glob(".*.tmp"))
    rows = [r for p in part_files(tmp_path / "out") for r in pq.read_table(p).to_pylist()]
    assert len(rows) == 10


def test_bad_jobs_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"deliver_at": 5, "payload": "ok"}\n{"payload": "no time"}\n')
    with pytest.raises(SparkJobError, match=r"bad.jsonl:2: deliver_at must be"):
        import_jobs(bad, 0, tmp_path / "out")
    assert part_files(tmp_path / "out") == []  # nothing half-imported
    result = CliRunner().invoke(main, ["export-backlog", "--from-jobs", str(bad), "--out", str(tmp_path / "o2")])
    assert result.exit_code != 0 and "bad.jsonl:2" in result.output
