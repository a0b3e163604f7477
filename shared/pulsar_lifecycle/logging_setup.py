"""Structured one-line-per-event logging for the CLI and local runs."""
from __future__ import annotations

import logging
import sys


def setup_logging(level: str = "INFO") -> None:
    """`time level logger event=... key=value` lines on stderr; pulsar's C++ client kept at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("pulsar.client").setLevel(logging.WARNING)
