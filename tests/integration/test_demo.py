"""The README's main command: every demo scene passes on the embedded broker and, as
`scripts/demo.sh --pulsar`, on a real Apache Pulsar standalone (the shipped configs, with the
demo's overrides). A scene that releases nothing, or early, fails here."""
from __future__ import annotations

import io
from pathlib import Path
from typing import List

import pytest
from rich.console import Console

from pulsar_lifecycle.cli.demo import run_demo
from support.broker_fixtures import broker_kinds

pytestmark = pytest.mark.integration


def _processes_mentioning(text: str) -> List[int]:
    """Pids of live processes whose command line contains `text`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(proc.name))
    return pids


# The demo starts its own broker (real Pulsar: its own standalone, stopped at the end), so the
# kind is a plain parameter here rather than the `broker` fixture; TEST_BROKERS narrows it alike.
@pytest.mark.parametrize("kind", broker_kinds())
def test_every_demo_scene_passes(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSAR_LIFECYCLE_CLIENT_LOG", str(tmp_path / "client.log"))
    out = io.StringIO()
    ok = run_demo(tmp_path / "demo", Console(file=out, width=120), pulsar=kind == "pulsar")
    text = out.getvalue()
    assert ok, text
    assert "all scenes OK" in text and "FAILED" not in text, text
    if kind == "pulsar":
        # function state went to the table service and the JVM is gone when run_demo returns
        assert "table service (function state) bk://127.0.0.1:" in text, text
        assert "Apache Pulsar stopped" in text, text
        assert _processes_mentioning(str(tmp_path / "demo" / "pulsar")) == []
