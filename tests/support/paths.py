"""Where things are in the repository, for tests that read its files or run its scripts."""
from __future__ import annotations

from pathlib import Path

#: The repository root (tests/support/paths.py -> ../..).
REPO = Path(__file__).resolve().parents[2]
#: tests/ (the local servers, the Java interop sources and the fixture stores live here).
TESTS = REPO / "tests"
