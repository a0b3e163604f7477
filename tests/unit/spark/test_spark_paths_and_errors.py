"""Paths fixed on the driver (absolute URLs, remote masters refused up front) and one-line errors
naming the file or endpoint with the failing code's own message."""
from __future__ import annotations

import socket
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.spark import paths
from pulsar_lifecycle.spark.backlog import read_backlog
from pulsar_lifecycle.spark.errors import SparkJobError
from pulsar_lifecycle.spark.failures import clean
from support.spark_fixtures import backlog_rows, write_backlog

BASE = 1_800_000_000_000
REMOTE = "spark://10.255.255.1:7077"


def test_paths_are_absolute_urls_resolved_on_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = paths.resolve("backlog/")
    assert p.url == f"file://{tmp_path}/backlog" and p.local == tmp_path / "backlog" and p.given == "backlog/"
    assert paths.resolve("file:store").url == f"file://{tmp_path}/store"
    assert paths.resolve("file:///data/x").url == "file:///data/x"
    assert paths.resolve("~/x").local == Path.home() / "x"
    for url in ("hdfs://nn:8020/export", "s3a://bucket/export"):
        assert paths.resolve(url) == paths.JobPath(url, url, None)
    with pytest.raises(SparkJobError, match="not host 'elsewhere'"):
        paths.resolve("file://elsewhere/data")
    assert paths.resolve_store("bk://h:4181/public/default/w").local is None
    with pytest.raises(SparkJobError, match="use a directory path"):
        paths.resolve_store("s3a://bucket/store")


def test_executors_must_reach_every_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for master in ("local", "local[2]", "local[*]", "local-cluster[2,1,1024]", "spark://127.0.0.1:7077",
                   "spark://localhost:7077"):
        assert paths.is_same_host_master(master), master
    for master in (REMOTE, "yarn", "k8s://https://k8s:6443", "spark://127.0.0.1:7077,10.0.0.2:7077"):
        assert not paths.is_same_host_master(master), master
    store = paths.resolve(str(tmp_path / "store"))
    paths.require_reachable("local-cluster[2,1,1024]", [("--store", store)])
    paths.require_reachable(REMOTE, [("--store", paths.resolve("hdfs://nn/x"))])
    paths.require_reachable(REMOTE, [("--store", store)], shared_fs=True)
    monkeypatch.setattr(paths, "_mounts", lambda: [("/", "ext4"), (str(tmp_path), "ext4")])
    with pytest.raises(SparkJobError) as err:
        paths.require_reachable(REMOTE, [("--store", store)])
    message = str(err.value)
    assert "\n" not in message and f"--store {tmp_path}/store" in message and "ext4" in message
    assert f"executors of {REMOTE} cannot reach it; use shared storage" in message and "--shared-fs" in message
    monkeypatch.setattr(paths, "_mounts", lambda: [("/", "ext4"), (str(tmp_path), "nfs4")])
    paths.require_reachable(REMOTE, [("--store", store)])  # an NFS mount: every node sees it
    assert paths.filesystem_of(tmp_path / "not" / "yet")[1] == str(tmp_path)


def test_a_local_path_on_a_remote_master_is_refused_before_spark_starts(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "_mounts", lambda: [("/", "ext4")])
    runner = CliRunner()
    for args in (["spark", "seed", "backlog/", "--store", "store", "--master", REMOTE],
                 ["spark", "verify", "--store", "store", "--master", REMOTE],
                 ["spark", "orphans", "--listed", "l.csv", "--in-use", "u.csv", "--state-dir", "scans",
                  "--master", REMOTE]):
        result = runner.invoke(main, args)
        errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
        assert result.exit_code == 1 and len(errors) == 1, result.output
        assert "cannot reach it; use shared storage" in errors[0] and str(tmp_path) in errors[0]


def test_clean_keeps_the_failing_codes_own_message() -> None:
    task = ("Job aborted due to stage failure: Task 1 in stage 1.0 failed 4 times, most recent failure: Lost task 1.3 "
            "in stage 1.0 (TID 7) (127.0.0.1 executor 1): org.apache.spark.api.python.PythonException: Traceback "
            "(most recent call last):\n  File \"/x/worker.py\", line 4327, in invoke_udf\n    run_process()\n"
            "    ^^^^^^^^\nFileNotFoundError: [Errno 2] Failed to open local file 'backlog/part-1.parquet'. Detail: "
            "[errno 2] No such file or directory\n\n\tat org.apache.spark.api.python.BasePythonRunner.x(P.scala:1)\n"
            "Driver stacktrace:\n\tat org.apache.spark.scheduler.DAGScheduler.y(D.scala:2)")
    assert clean(task) == ("FileNotFoundError: [Errno 2] Failed to open local file 'backlog/part-1.parquet'. "
                           "Detail: [errno 2] No such file or directory")
    ours = "Traceback (most recent call last):\n  File \"a.py\", line 1\npulsar_lifecycle.spark.errors.SparkJobError: boom"
    assert clean(ours) == "SparkJobError: boom"
    assert clean("[PATH_NOT_FOUND] Path does not exist: file:/x. SQLSTATE: 42K03") == \
        "[PATH_NOT_FOUND] Path does not exist: file:/x."
    assert clean("org.apache.spark.SparkException: line one\nline two") == "line one"


@pytest.mark.spark
def test_a_damaged_backlog_is_one_line_naming_the_file(spark, tmp_path: Path) -> None:
    files = write_backlog(tmp_path / "backlog", backlog_rows({1: 50}, BASE, 60_000), per_file=25)
    Path(files[0]).write_bytes(Path(files[0]).read_bytes()[:700])
    with pytest.raises(SparkJobError) as err:
        read_backlog(spark, [str(tmp_path / "backlog")])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot read backlog file://{tmp_path}/backlog as parquet: ")
    # the reader's own message ("... is not a Parquet file", "footer is too large ...") with the file
    assert f"file:{files[0]}" in message and "An error occurred while calling" not in message
    with pytest.raises(SparkJobError, match=rf"PATH_NOT_FOUND\] Path does not exist: file:{tmp_path}/nope"):
        read_backlog(spark, [str(tmp_path / "nope")])


@pytest.mark.spark
def test_an_unexpected_spark_failure_is_one_line_and_its_trace_goes_to_the_log(spark) -> None:
    from pulsar_lifecycle.spark.cli import run_job
    from pulsar_lifecycle.spark.session import spark_log_path

    with pytest.raises(click.ClickException) as err:
        run_job(lambda: spark.sql("select * from no_such_table").collect())
    message = err.value.message
    assert message.startswith("Spark job failed: [TABLE_OR_VIEW_NOT_FOUND]") and "\n" not in message
    assert message.endswith(f"(stack traces: {spark_log_path()})")
    assert "TABLE_OR_VIEW_NOT_FOUND" in spark_log_path().read_text()


def test_export_from_an_unreachable_broker_names_the_url(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"pulsar://127.0.0.1:{port}"
    result = CliRunner().invoke(main, ["export-backlog", "--service-url", url, "--topic", "persistent://public/default/t",
                                       "--subscription", "s", "--out", str(tmp_path / "out")])
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert errors[0].startswith(f"Error: no broker at {url}: "), errors[0]  # refused: at once, before any export
    assert "refused the connection" in errors[0]
