"""Structured one-line-per-event logging for the CLI and local runs."""
from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Optional


def setup_logging(level: str = "INFO") -> None:
    """`time level logger event=... key=value` lines on stderr; pulsar's C++ client kept at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("pulsar.client").setLevel(logging.WARNING)


def log_to_file(path: Path) -> None:
    """Send the log lines (same format and level) to `path` instead of stderr: for a command
    that owns the terminal (`up`'s live view)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.getLogger().handlers[:] = [handler]


# -- where pulsar-client's C++ log lines go ----------------------------------------------------
# Kept here (no pulsar import) so the CLI can route them before any command runs; runtime/client.py
# builds every client's logger from client_log_path().
CLIENT_LOG_ENV = "PULSAR_LIFECYCLE_CLIENT_LOG"
_client_log = "/dev/stderr"  # library default; the CLI routes it to a file
# The client log's bound: rotated at CLIENT_LOG_MAX_BYTES into <file>.1 .. <file>.<BACKUPS>.
CLIENT_LOG_MAX_BYTES = 10 * 1024 * 1024
CLIENT_LOG_BACKUPS = 3
CLIENT_LOG_CHECK_S = 10.0  # how often a long-running command checks the bound


def rotate_client_log(path: Optional[Path] = None, max_bytes: int = CLIENT_LOG_MAX_BYTES,
                      backups: int = CLIENT_LOG_BACKUPS) -> bool:
    """Rotate the client log (`path`, default the current one) when it holds `max_bytes` or more:
    `<file>.<i>` becomes `<file>.<i+1>` (the oldest beyond `backups` is dropped), the file is copied
    to `<file>.1` and truncated. True when it rotated.

    Copy and truncate, not rename: pulsar-client's C++ file logger keeps its file open for the
    life of the process and appends (O_APPEND), so after the truncation its lines land at the
    start of the same file (a line written between the copy and the truncation is lost).
    """
    target = Path(path if path is not None else client_log_path())
    try:
        if not target.is_file() or target.stat().st_size < max_bytes:
            return False
        for i in range(backups - 1, 0, -1):
            older = target.with_name(f"{target.name}.{i}")
            if older.exists():
                os.replace(older, target.with_name(f"{target.name}.{i + 1}"))
        if backups > 0:
            shutil.copyfile(target, target.with_name(f"{target.name}.1"))
        os.truncate(target, 0)
    except OSError as exc:  # a log that cannot be rotated must not stop a command
        logging.getLogger(__name__).warning("event=client_log_rotate_failed path=%s error=%r", target, exc)
        return False
    logging.getLogger(__name__).info("event=client_log_rotated path=%s max_bytes=%d backups=%d", target, max_bytes,
                                     backups)
    return True


class ClientLogRotation:
    """Keeps the client log under its bound while a long-running command (`up`, `localrun`) runs:
    a daemon thread checks it every `interval_s` (rotate_client_log)."""

    def __init__(self, path: Optional[Path] = None, max_bytes: int = CLIENT_LOG_MAX_BYTES,
                 backups: int = CLIENT_LOG_BACKUPS, interval_s: float = CLIENT_LOG_CHECK_S) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "ClientLogRotation":
        """Start checking (the first check after `interval_s`)."""
        self._thread = threading.Thread(target=self._run, name="client-log-rotation", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            rotate_client_log(self.path, self.max_bytes, self.backups)

    def stop(self) -> None:
        """Stop checking. Safe twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def route_client_log(path: Path) -> str:
    """Send the C++ log lines of clients made from now on to `path` (appended; its directory is
    created; rotated first when it reached its bound, rotate_client_log), unless
    $PULSAR_LIFECYCLE_CLIENT_LOG names a file, which wins. Returns the file used.

    Commands call it before they connect to anything, so a broker that refuses, resets or
    never answers ends a command with one error line instead of the client's reconnect log.
    When the directory cannot be created the previous choice is kept.
    """
    global _client_log
    chosen = Path(os.environ.get(CLIENT_LOG_ENV) or path)
    try:
        chosen.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        logging.getLogger(__name__).debug("event=client_log_unroutable path=%s error=%r", chosen, exc)
        return client_log_path()
    _client_log = str(chosen)
    rotate_client_log(chosen)
    return _client_log


def client_log_path() -> str:
    """The file pulsar-client's C++ logger writes to ($PULSAR_LIFECYCLE_CLIENT_LOG first)."""
    return os.environ.get(CLIENT_LOG_ENV) or _client_log


def default_client_log() -> Path:
    """The client log of commands without a --data-dir: `<cache>/logs/pulsar-client.log`, the
    cache being $PULSAR_LIFECYCLE_CACHE or ~/.cache/pulsar-lifecycle."""
    env = os.environ.get("PULSAR_LIFECYCLE_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "pulsar-lifecycle"
    return root / "logs" / "pulsar-client.log"
