"""The Spark session factory: one clear error for missing/old Java, and a working local session."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.spark.errors import SparkSetupError
from pulsar_lifecycle.spark.session import check_java, parse_java_version


def _fake_java(tmp_path: Path, version_line: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return home


def test_parse_java_version() -> None:
    assert parse_java_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert parse_java_version('java version "1.8.0_392"') == 8
    assert parse_java_version('openjdk version "25" 2025-09-16') == 25
    with pytest.raises(ValueError):
        parse_java_version("no version here")


def test_missing_java_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(SparkSetupError, match=r"Java 17 or newer.*no bin/java.*openjdk-17-jre-headless"):
        check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkSetupError, match=r"no `java` on PATH"):
        check_java()


def test_old_java_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15')))
    with pytest.raises(SparkSetupError, match=r"found Java 11 at .*bin/java"):
        check_java()
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path / "new", 'openjdk version "17.0.1" 2021-10-19')))
    assert check_java()[1] == 17


def test_cli_reports_old_java_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pulsar_lifecycle.spark.cli import run_job
    from pulsar_lifecycle.spark.session import get_spark

    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, 'java version "1.8.0_392"')))
    import click

    with pytest.raises(click.ClickException, match="found Java 8"):
        run_job(lambda: get_spark("local[1]", "never-starts"))
    result = CliRunner().invoke(main, ["spark", "--help"])
    assert result.exit_code == 0 and "Offline jobs on Spark" in result.output


@pytest.mark.spark
def test_session_runs_python_workers_from_this_interpreter(spark) -> None:
    import sys

    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    exe = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()
    assert exe == [sys.executable]
    assert spark.range(1000).count() == 1000


def test_masters_of_this_machine_get_a_few_shuffle_partitions_per_core() -> None:
    from pulsar_lifecycle.spark.session import local_cores

    assert [local_cores(m) for m in ("local", "local[2]", "local[3,2]", "local-cluster[2,1,1024]")] == [1, 2, 3, 2]
    assert local_cores("local[*]") == (os.cpu_count() or 1)
    assert local_cores("spark://10.0.0.1:7077") is None and local_cores("yarn") is None
