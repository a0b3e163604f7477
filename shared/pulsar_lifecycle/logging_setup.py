"""Structured one-line-per-event logging for the CLI and local runs."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path


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


def route_client_log(path: Path) -> str:
    """Send the C++ log lines of clients made from now on to `path` (appended; its directory is
    created), unless $PULSAR_LIFECYCLE_CLIENT_LOG names a file, which wins. Returns the file used.

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
