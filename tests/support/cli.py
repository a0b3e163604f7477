"""Running `pulsar-lifecycle` as an operator does (a subprocess) and checking what it printed."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

CLI = [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING"]
# pulsar-client's C++ log line: "2026-11-27 06:01:39.687 WARN  [140006446442176] ClientConnection:1731 | ..."
CLIENT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} +(DEBUG|INFO|WARN|ERROR) +\[\d+\]")


def cli_env(tmp_path: Path, **extra: str) -> Dict[str, str]:
    """The environment of a CLI run: its default client log under `tmp_path`, not in $HOME."""
    env = dict(os.environ, PULSAR_LIFECYCLE_CACHE=str(tmp_path / "cache"), **extra)
    env.pop("PULSAR_LIFECYCLE_CLIENT_LOG", None)
    return env


def run_cli(*args: str, tmp_path: Path, cwd: Optional[Path] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """One CLI run (stdin closed), its output captured."""
    return subprocess.run([*CLI, *args], cwd=cwd or tmp_path, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=cli_env(tmp_path))


def run_json(*args: str, tmp_path: Path, cwd: Optional[Path] = None) -> Any:
    """A CLI run that must succeed, its stdout parsed as JSON."""
    res = run_cli(*args, tmp_path=tmp_path, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_no_client_log_lines(res)
    return json.loads(res.stdout)


def client_log_lines(text: str) -> List[str]:
    """The pulsar-client C++ log lines in `text`."""
    return [line for line in text.splitlines() if CLIENT_LOG_LINE.match(line)]


def assert_no_client_log_lines(res: Any) -> None:
    """Neither stdout nor stderr of a run holds a pulsar-client C++ log line."""
    found = client_log_lines(res.stdout or "") + client_log_lines(res.stderr or "")
    assert found == [], found[:5]


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit status 1 or 2, no traceback, exactly one `Error:` line holding every needle."""
    assert res.returncode in (1, 2), (res.returncode, res.stderr[-2000:])
    assert res.returncode != -signal.SIGABRT, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, res.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    assert_no_client_log_lines(res)
    return errors[0]


class SilentBroker:
    """A TCP port that accepts connections and never answers (a hung broker)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._held: List[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._held.append(conn)  # read nothing, answer nothing

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.fixture
def silent_broker() -> Iterator[SilentBroker]:
    """A port that accepts connections and never answers."""
    server = SilentBroker()
    yield server
    server.close()
