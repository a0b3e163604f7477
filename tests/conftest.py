"""Test layout: unit/<package>/ (no broker), integration/ (embedded broker), crash/ (SIGKILL, full disk).

Shared code lives in support/ (helpers, contracts, and the fixture modules registered below) and
servers/ (local servers speaking the wire formats of services that cannot run here); test modules
never import each other (unit/test_layers.py checks).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest

# tests/ on sys.path: `support` and `servers` are imported by their top-level names, also by the
# functions the local runner loads by class name (support.fn_samples).
sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest_plugins = ["support.broker_fixtures", "support.spark_fixtures", "support.deletion", "support.cli",
                  "support.real_worker", "support.secured", "support.xdist_groups"]

# The directory says what a test needs, so `-m "not crash"` or `-m "not integration"` selects by layout
# (modules may add `slow` and the like themselves).
_DIR_MARKERS = {"integration": "integration", "crash": "crash"}


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.path)).resolve()
        top = path.relative_to(tests_dir).parts[0] if tests_dir in path.parents else ""
        marker = _DIR_MARKERS.get(top)
        if marker is not None:
            item.add_marker(marker)
