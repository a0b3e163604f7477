"""The README's main command: every demo scene passes on the embedded broker (the shipped configs,
with the demo's overrides). A scene that releases nothing, or early, fails here."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from pulsar_lifecycle.demo import run_demo

pytestmark = pytest.mark.integration


def test_every_demo_scene_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSAR_LIFECYCLE_CLIENT_LOG", str(tmp_path / "client.log"))
    out = io.StringIO()
    ok = run_demo(tmp_path / "demo", Console(file=out, width=120))
    text = out.getvalue()
    assert ok, text
    assert "all scenes OK" in text and "FAILED" not in text, text
