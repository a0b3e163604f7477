"""A runtime older than Pulsar 3.0 (no context.get_pulsar_client()) is named, not an AttributeError."""
from __future__ import annotations

import pytest

from pulsar_lifecycle.runtime.context_api import MIN_PULSAR_VERSION, UnsupportedRuntimeError, pulsar_client
from support.paths import REPO


class _OldContext:
    """The classic Python Context API without get_pulsar_client (Pulsar < 3.0)."""

    def get_user_config_map(self) -> dict:
        return {}


class _NewContext(_OldContext):
    def get_pulsar_client(self) -> str:
        return "the runtime's client"


def test_missing_get_pulsar_client_names_the_minimum_version():
    with pytest.raises(UnsupportedRuntimeError, match=f"Pulsar {MIN_PULSAR_VERSION} or newer") as err:
        pulsar_client(_OldContext())
    assert "get_pulsar_client()" in str(err.value) and "_OldContext" in str(err.value)
    assert pulsar_client(_NewContext()) == "the runtime's client"


def test_every_function_asks_through_the_check():
    """No module calls .get_pulsar_client() directly (it would fail unnamed on an old runtime)."""
    import ast

    root = REPO
    offenders = []
    for d in ("shared/pulsar_lifecycle", "functions"):
        for p in (root / d).rglob("*.py"):
            if p.name == "context_api.py" or p.parent.name == "runtime" and p.name == "context.py":
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "get_pulsar_client"):
                    offenders.append(f"{p.relative_to(root)}:{node.lineno}")
    assert offenders == []
