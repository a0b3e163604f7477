"""The pulsar-client log stays size-bounded: rotated when a command routes it and, under `up` and
`localrun`, while they run (copy-truncate: pulsar-client's C++ file logger keeps appending to the
file it opened). A real client writes the lines: one that cannot connect logs WARN and ERROR."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pulsar_lifecycle import logging_setup
from pulsar_lifecycle.logging_setup import CLIENT_LOG_ENV, rotate_client_log, route_client_log

BOUND = 4000


def _closed_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"pulsar://127.0.0.1:{s.getsockname()[1]}"


# A process of its own: pulsar-client keeps the first client's logger for the whole process.
WRITER = """
import sys, time
from pathlib import Path
import pulsar
from pulsar_lifecycle.logging_setup import ClientLogRotation
from pulsar_lifecycle.runtime.client import quiet_client
log, url, bound = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
client = quiet_client(url, operation_timeout_s=1)
rotation = ClientLogRotation(log, max_bytes=bound, backups=2, interval_s=0.1).start()

def some():
    try:
        client.create_producer("persistent://public/default/rotation")
    except pulsar.PulsarException:
        pass  # expected: nothing listens; the client logged why

deadline = time.monotonic() + 60
while not log.with_name(log.name + ".2").exists() and time.monotonic() < deadline:
    some()
some()
some()
time.sleep(0.3)  # one more check of the rotation
rotation.stop()
client.close()
"""


def test_the_client_log_rotates_at_its_bound_while_a_client_writes(tmp_path: Path) -> None:
    log = tmp_path / "pulsar-client.log"
    res = subprocess.run([sys.executable, "-c", WRITER, str(log), _closed_url(), str(BOUND)], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, **{CLIENT_LOG_ENV: str(log)}))
    assert res.returncode == 0, res.stderr[-3000:]
    backups = sorted(p.name for p in tmp_path.iterdir() if p.name != log.name)
    assert backups == ["pulsar-client.log.1", "pulsar-client.log.2"]  # the oldest beyond 2 dropped
    for path in [log, *(tmp_path / b for b in backups)]:
        data = path.read_bytes()
        assert b"\0" not in data, path  # the logger kept appending at the start of the truncated file
        assert b" WARN " in data or b" ERROR " in data or path == log, path
    # each rotated file was cut at the bound (plus what one check interval added)
    assert all((tmp_path / b).stat().st_size >= BOUND for b in backups)
    assert log.stat().st_size < 20 * BOUND


def test_a_command_rotates_a_full_client_log_when_it_routes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLIENT_LOG_ENV, raising=False)
    log = tmp_path / "pulsar-client.log"
    with open(log, "wb") as fh:
        fh.truncate(logging_setup.CLIENT_LOG_MAX_BYTES)  # sparse: as large as the bound, cheap to make
    previous = logging_setup.client_log_path()
    try:
        assert route_client_log(log) == str(log)
    finally:
        monkeypatch.setattr(logging_setup, "_client_log", previous)
    assert log.stat().st_size == 0
    assert log.with_name(log.name + ".1").stat().st_size == logging_setup.CLIENT_LOG_MAX_BYTES
    assert not rotate_client_log(log)  # below the bound now: left alone


def test_rotation_needs_the_bound(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    log.write_bytes(b"x" * 99)
    assert not rotate_client_log(log, max_bytes=100)
    assert log.read_bytes() == b"x" * 99
    log.write_bytes(b"x" * 100)
    assert rotate_client_log(log, max_bytes=100, backups=1)
    assert log.read_bytes() == b"" and (tmp_path / "c.log.1").read_bytes() == b"x" * 100
