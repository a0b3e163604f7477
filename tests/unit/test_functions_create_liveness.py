"""The function-worker harness (support/functions_create.py) restarts an instance that died by
itself, as Pulsar's RuntimeSpawner does, and leaves one a test stopped on purpose alone.

The instance here is a small script standing in for the Python instance's process: it dies at its
first start (as Pulsar's runtime does when two instances create their state namespace at once)
and logs the running line at its second.
"""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from support.functions_create import RUNNING_LINE, FunctionWorker, Instance

FLAKY = f"""
import pathlib, sys
marker = pathlib.Path("started-once")
if not marker.exists():
    marker.write_text("x")
    sys.exit(1)
with open(sys.argv[1], "a") as log:
    log.write("{RUNNING_LINE} metrics_port=0\\n")
import time
time.sleep(60)
"""


def _instance(worker: FunctionWorker, tmp_path: Path, script: str) -> Instance:
    (tmp_path / "instance.py").write_text(script)
    log = tmp_path / "instance.log"
    log.write_text("event=earlier_instance_output\n")  # the log file is shared with earlier instances
    instance = Instance(0, tmp_path, 0, [sys.executable, str(tmp_path / "instance.py"), str(log)], log,
                        tmp_path / "stdout.log")
    worker.running.append(instance)
    worker.watch()
    return instance


@pytest.mark.timeout(60)
def test_an_instance_that_died_at_start_up_is_started_again_and_runs(tmp_path: Path) -> None:
    worker = FunctionWorker("pulsar://127.0.0.1:1", None, tmp_path / "worker", liveness_check_s=0.3)
    try:
        instance = _instance(worker, tmp_path, FLAKY)
        instance.wait_running(timeout_s=30)
        assert instance.restarts == 1
        assert instance.proc.poll() is None
        assert "earlier_instance_output" not in instance.log_text()
    finally:
        worker.stop_all()
    assert instance.proc.poll() is not None


@pytest.mark.timeout(60)
def test_an_instance_stopped_on_purpose_stays_stopped(tmp_path: Path) -> None:
    worker = FunctionWorker("pulsar://127.0.0.1:1", None, tmp_path / "worker", liveness_check_s=0.2)
    try:
        (tmp_path / "started-once").write_text("x")  # runs at its first start
        instance = _instance(worker, tmp_path, FLAKY)
        instance.wait_running(timeout_s=30)
        instance.stop(signal.SIGKILL)
        time.sleep(1.0)  # five liveness checks
        assert instance.restarts == 0 and instance.proc.poll() is not None
    finally:
        worker.stop_all()


@pytest.mark.timeout(60)
def test_an_instance_that_keeps_dying_fails_with_its_log(tmp_path: Path) -> None:
    worker = FunctionWorker("pulsar://127.0.0.1:1", None, tmp_path / "worker", liveness_check_s=0.2)
    try:
        instance = _instance(worker, tmp_path, "import sys\nprint('cannot start: broken package')\nsys.exit(3)\n")
        # The liveness check may restart it again between two looks of wait_running.
        with pytest.raises(AssertionError, match="exited rc=3 after [2-9][0-9]* restarts(.|\n)*broken package"):
            instance.wait_running(timeout_s=30)
        assert instance.restarts >= 2
    finally:
        worker.stop_all()
