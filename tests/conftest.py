"""Test layout: unit/<package>/ (no broker), integration/ (embedded broker), crash/ (SIGKILL, full disk).

Shared code lives in support/ (helpers, contracts, and the fixture modules registered below) and
servers/ (local servers speaking the wire formats of services that cannot run here); test modules
never import each other (unit/test_layers.py checks).
"""
from __future__ import annotations

import sys
from pathlib import Path

# tests/ on sys.path: `support` and `servers` are imported by their top-level names, also by the
# functions the local runner loads by class name (support.fn_samples).
sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest_plugins = ["support.broker_fixtures", "support.spark_fixtures", "support.deletion"]
