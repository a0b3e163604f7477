"""The one SparkSession of a test run (local[2]), registered by conftest.py, and child
processes that run the Spark commands on other masters.

Spark costs about 10 s to start and about 1 s to stop, and its JVM outlives stop(): one session
for the whole test session (reference/pyspark-on-this-machine.md). A JVM holds one
SparkContext, so commands on `local-cluster` (executors in JVMs of their own, each in its own
working directory: what a real cluster does to relative paths) run in a child process
(`run_spark_commands`), all of them on one session the child starts first.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

from support.paths import REPO

# Two executor JVMs of 1 core / 1 GB each, in working directories of their own.
LOCAL_CLUSTER = "local-cluster[2,1,1024]"
SMALL_SESSION = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.driver.memory": "1g"}
CHILD_TIMEOUT_S = 840  # below the tests' own timeout (900 s): the child is killed first, with its output

_CHILD = r"""
import json, sys, time
from click.testing import CliRunner
from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.spark.session import get_spark
spec = json.load(sys.stdin)
spark = get_spark(spec["master"], "pulsar-lifecycle-tests-cli", **spec["conf"])
results = []
try:
    for args in spec["commands"]:
        t0 = time.monotonic()
        res = CliRunner().invoke(main, args)
        results.append({"args": args, "exit_code": res.exit_code, "output": res.output,
                        "seconds": round(time.monotonic() - t0, 1)})
finally:
    spark.stop()
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession shared by every Spark test (PySpark and Java 17+ are required:
    the `test` extra installs PySpark, scripts/setup.sh a JRE). Its log file is in the run's
    temp directory."""
    from pulsar_lifecycle.spark.session import SPARK_LOG_ENV, get_spark

    os.environ.setdefault(SPARK_LOG_ENV, str(tmp_path_factory.mktemp("spark-log") / "spark.log"))
    session = get_spark("local[2]", "pulsar-lifecycle-tests", **SMALL_SESSION)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SPARK_HOME for local-cluster masters in the run's temp directory: the installed PySpark's
    bin/, jars/ and python/ linked, and work/ where the executors run (session.spark_home_layout)."""
    from pulsar_lifecycle.spark.session import check_pyspark, spark_home_layout

    check_pyspark()
    return spark_home_layout(tmp_path_factory.mktemp("spark-home"))


@dataclass
class CommandResult:
    """One command that ran: its arguments, exit status, console output and duration."""

    args: List[str]
    exit_code: int
    output: str
    seconds: float


@dataclass
class CommandsRun:
    """The commands' results, what the JVM printed to the process's stderr, and what the
    commands added to the Spark log file."""

    results: List[CommandResult]
    stderr: str
    spark_log: str


def run_spark_commands(cwd: Path, master: str, commands: Sequence[Sequence[str]], spark_home: Path,
                       env: Optional[Dict[str, str]] = None) -> CommandsRun:
    """Run `pulsar-lifecycle` commands (argument lists) in a child process whose working
    directory is `cwd`, on one SparkSession of `master` that the child starts first (so the
    commands share it and leave it running). SPARK_HOME is `spark_home`; the Spark log is
    the commands' default, .pulsar-lifecycle/logs/spark.log under `cwd`."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PULSAR_LIFECYCLE_SPARK_LOG")}
    child_env.update({"SPARK_HOME": str(spark_home),
                      "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), child_env.get("PYTHONPATH", "")])})
    child_env.update(env or {})
    spec = {"master": master, "conf": SMALL_SESSION, "commands": [list(c) for c in commands]}
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(spec), cwd=cwd, env=child_env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULTS ")), None)
    assert proc.returncode == 0 and line is not None, f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                                      f"{proc.stderr[-5000:]}"
    log = cwd / ".pulsar-lifecycle" / "logs" / "spark.log"
    return CommandsRun([CommandResult(**r) for r in json.loads(line[len("RESULTS "):])], proc.stderr,
                       log.read_text() if log.exists() else "")


def run_spark_commands_here(cwd: Path, commands: Sequence[Sequence[str]], monkeypatch: pytest.MonkeyPatch,
                            capfd: pytest.CaptureFixture) -> CommandsRun:
    """The same in this process, on the test run's local[2] session (the `spark` fixture must be
    up): Python works in `cwd`, while the JVM and its Python workers stay in the directory pytest
    started in, so a relative path that reached them as typed would name another file."""
    from click.testing import CliRunner

    from pulsar_lifecycle.cli.main import main
    from pulsar_lifecycle.spark.session import spark_log_path

    monkeypatch.chdir(cwd)
    capfd.readouterr()
    log = spark_log_path()
    start = log.stat().st_size if log.exists() else 0
    results = []
    for args in commands:
        t0 = time.monotonic()
        res = CliRunner().invoke(main, list(args))
        results.append(CommandResult(list(args), res.exit_code, res.output, round(time.monotonic() - t0, 1)))
    with open(log, "rb") as fh:
        fh.seek(start)
        added = fh.read().decode("utf-8", "replace")
    return CommandsRun(results, capfd.readouterr().err, added)


def backlog_rows(ledgers: dict, base_ms: int, spread_ms: int, seed: int = 1, topic: str = "persistent://public/default/s",
                 partition: int = -1) -> list:
    """Export rows (backlog.EXPORT_SCHEMA) for {ledger id: message count}: deliver-at times
    spread over `spread_ms` after `base_ms` (with repeats), payload/key/properties varying."""
    import random

    from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

    rnd = random.Random(seed)
    rows = []
    for ledger, count in ledgers.items():
        for entry in range(count):
            at = base_ms + rnd.randrange(spread_ms) // 7 * 7  # coarse: equal timestamps happen
            props = {DELIVER_AT_PROP: str(at), "n": str(entry)}
            rows.append({"ledger_id": ledger, "entry_id": entry, "batch_index": -1, "partition": partition,
                         "deliver_at": at, "payload": f"m-{ledger}-{entry}".encode(),
                         "key": f"k{entry % 5}" if entry % 3 else None, "properties": list(props.items()),
                         "event_time": 1000 + entry if entry % 2 else 0, "target": None,
                         "publish_time": base_ms, "topic": topic})
    return rows


def write_backlog(directory, rows: list, per_file: int = 1000) -> list:
    """Rows as Parquet files (what export-backlog writes) under `directory`; returns the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pulsar_lifecycle.spark.backlog import EXPORT_SCHEMA

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(0, len(rows), per_file):
        path = directory / f"part-{i // per_file:06d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[i:i + per_file], schema=EXPORT_SCHEMA), path)
        paths.append(str(path))
    return paths


def assert_one_error_line(result: CommandResult, *names: str) -> str:
    """The command failed with exactly one `Error:` line, holding every one of `names`, and no
    Py4J wrapper or Python traceback; returns the line."""
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert all(name in errors[0] for name in names), errors[0]
    assert "An error occurred while calling" not in result.output and "Traceback" not in result.output, result.output
    return errors[0]


def assert_no_spark_log_lines(*consoles: str) -> None:
    """No log4j line and no stack-trace line on a console (those belong in the Spark log)."""
    for console in consoles:
        noise = [ln for ln in console.splitlines()
                 if ln.lstrip().startswith("at ") or " ERROR " in ln or " WARN " in ln]
        assert not noise, console
