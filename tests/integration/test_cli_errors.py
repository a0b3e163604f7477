"""Operators' view of the CLI (issue 8, items 3-6): bad input is one line and a non-zero exit,
never a traceback; commands exit 0 after doing their work (no SIGABRT from pulsar-client at
interpreter shutdown), also on SIGTERM after a broker restart; a second localrun on a data dir
gets one line naming the holder."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Tuple

import pytest
import yaml

from pulsar_lifecycle.runtime.broker import EmbeddedBroker, free_port, port_open
from pulsar_lifecycle.timing import DelayedProducer
from support.diskfull import try_mount_tmpfs, umount
from support.helpers import wait_for
from support.paths import REPO

ROOT = REPO
CLI = [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING"]


def run_cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode != 0, res
    assert res.returncode != -signal.SIGABRT, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, res.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


# -- item 3: bad input ------------------------------------------------------------------------

def test_validate_reports_every_file_and_names_control_characters(tmp_path):
    (tmp_path / "nul.yaml").write_bytes(b"name: a\x00b\nclassName: x.Y\n")
    (tmp_path / "ctl.yaml").write_bytes(b"tenant: public\nname: a\x07b\n")
    (tmp_path / "good.yaml").write_text((ROOT / "function-configs" / "example-function.yaml").read_text())
    res = run_cli("validate", "nul.yaml", "good.yaml", "ctl.yaml", "missing.yaml", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "OK: good.yaml" in res.stdout
    assert "nul.yaml:1: invalid YAML: control character 0x0000" in res.stderr
    assert "ctl.yaml:2: invalid YAML: control character 0x0007" in res.stderr
    assert "missing.yaml: no such file" in res.stderr
    assert "3 of 4 file(s) have problems" in res.stderr


def test_localrun_bad_config_and_bad_data_dir_are_one_line(tmp_path):
    (tmp_path / "nul.yaml").write_bytes(b"name: a\x00b\nclassName: x.Y\n")
    assert_one_line_error(run_cli("localrun", "--function-config-file", "nul.yaml", cwd=tmp_path),
                          "nul.yaml:1", "control character")
    good = tmp_path / "good.yaml"
    good.write_text((ROOT / "function-configs" / "example-function.yaml").read_text())
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(run_cli("localrun", "--function-config-file", str(good), "--data-dir", "afile/sub",
                                  cwd=tmp_path), f"--data-dir {tmp_path / 'afile' / 'sub'}", "regular file")
    ro = tmp_path / "ro"
    if try_mount_tmpfs(ro, 1):
        try:
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True, timeout=20)
            assert_one_line_error(run_cli("localrun", "--function-config-file", str(good), "--data-dir", "ro/d",
                                          cwd=tmp_path), f"--data-dir {ro / 'd'}", "EROFS")
        finally:
            umount(ro)


def test_enqueue_with_a_refused_connection_names_url_and_what_to_do(tmp_path):
    port = free_port()
    assert_one_line_error(run_cli("deletion", "enqueue", "--service-url", f"pulsar://127.0.0.1:{port}",
                                  "--topic", "public/default/t", "--ledger-id", "7", "--connect-timeout", "1",
                                  cwd=tmp_path), f"pulsar://127.0.0.1:{port}", "refused the connection",
                          "--embedded-broker-port")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_delayed_producer_names_the_argument_and_value(bad):
    dp = DelayedProducer(client=None, backend="scheduler", scheduling_topic="persistent://public/default/s")
    with pytest.raises(ValueError) as ei:
        dp.send("persistent://public/default/t", b"x", bad)
    assert "deliver_at_ms" in str(ei.value) and ("NaN" if math.isnan(bad) else repr(bad)) in str(ei.value)
    with pytest.raises(ValueError) as ei:
        dp.send_after("persistent://public/default/t", b"x", bad)
    assert "delay_ms" in str(ei.value)


# -- item 4: clean exits ----------------------------------------------------------------------

@pytest.mark.integration
def test_enqueue_runs_in_a_row_all_exit_zero(broker, tmp_path, unique):
    """pulsar-client used to abort at interpreter exit in ~1 of 15 runs (a Python logger in its
    C++ factory); 10 runs here, the full 200 in the closing note."""
    codes = []
    for i in range(10):
        res = run_cli("deletion", "enqueue", "--service-url", broker.service_url, "--topic",
                      f"public/default/enq-{unique}", "--ledger-id", str(100 + i), "--send-delay-seconds", "0",
                      cwd=tmp_path)
        codes.append((res.returncode, res.stderr[-300:]))
        assert '"ledgerId": %d' % (100 + i) in res.stdout, res
    assert [c for c, _ in codes] == [0] * 10, codes


def _writer_config(tmp_path: Path, unique: str) -> Path:
    cfg = yaml.safe_load((ROOT / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    ticks = f"persistent://public/default/sticks-{unique}"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg["output"] = f"persistent://public/default/sout-{unique}"
    cfg["name"] = f"swriter-{unique}"
    cfg["userConfig"].update(schedulingTopic=f"persistent://public/default/ssched-{unique}", tickTopic=ticks,
                             tickTimeMillis=200, tickMode="runner")
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_writer_localrun_exits_zero_on_sigterm_after_a_broker_restart(tmp_path, unique):
    broker = EmbeddedBroker(data_dir=tmp_path / "broker")
    broker.start()
    config = _writer_config(tmp_path, unique)
    codes = []
    try:
        for i in range(5):
            with open(tmp_path / f"localrun{i}.log", "wb") as log:
                proc = subprocess.Popen([*CLI, "localrun", "--function-config-file", str(config),
                                         "--broker-service-url", broker.service_url, "--data-dir",
                                         str(tmp_path / "data")], cwd=tmp_path, stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL)
            assert wait_for(lambda i=i: "running " in (tmp_path / f"localrun{i}.log").read_text(), timeout=30)
            time.sleep(1.0)
            broker.restart()
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(timeout=60))
    finally:
        broker.stop(remove_data=True)
    logs = "".join((tmp_path / f"localrun{i}.log").read_text() for i in range(len(codes)))
    assert codes == [0] * 5, (codes, logs[-3000:])
    assert "terminate called" not in logs and "Traceback" not in logs


# -- item 5: a second localrun on the same data dir ----------------------------------------------

@pytest.mark.integration
def _start_example_localrun(tmp_path: Path, log_name: str) -> Tuple[Path, int, subprocess.Popen]:
    """(config, broker port, process): the shipped example function under `localrun` in tmp_path,
    data dir `data`, its embedded broker on a free port, output to tmp_path/<log_name>."""
    good = tmp_path / "good.yaml"
    good.write_text((ROOT / "function-configs" / "example-function.yaml").read_text())
    port = free_port()
    with open(tmp_path / log_name, "wb") as log:
        proc = subprocess.Popen([*CLI, "localrun", "--function-config-file", str(good), "--data-dir", "data",
                                 "--embedded-broker-port", str(port)], cwd=tmp_path, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
    return good, port, proc


def test_second_localrun_on_the_same_data_dir_is_one_line_naming_the_holder(tmp_path):
    good, port, first = _start_example_localrun(tmp_path, "first.log")
    try:
        assert wait_for(lambda: port_open("127.0.0.1", port), timeout=30)
        res = run_cli("localrun", "--function-config-file", str(good), "--data-dir", "data", cwd=tmp_path)
        line = assert_one_line_error(res, str((tmp_path / "data").resolve()), f"process {first.pid}")
        assert len(res.stderr.strip().splitlines()) <= 3, res.stderr  # no broker backtrace on the console
        assert "in use" in line
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0
    assert os.path.exists(tmp_path / "data" / "broker" / "pulsar-lite.log")


def test_localrun_sigterm_while_starting_stops_in_order(tmp_path):
    """A SIGTERM that lands while localrun still starts (its broker listens, the instances do not
    run yet) waits for the start and stops in order: exit 0, the embedded broker gone with it."""
    _good, port, run = _start_example_localrun(tmp_path, "run.log")
    try:
        assert wait_for(lambda: port_open("127.0.0.1", port), timeout=30, interval=0.01)
        run.send_signal(signal.SIGTERM)
        rc = run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert wait_for(lambda: not port_open("127.0.0.1", port), timeout=10)
