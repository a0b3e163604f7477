"""`up` takes `brokerServiceUrl` from a client.conf (`--client-conf`, else $PULSAR_CLIENT_CONF) when
`--broker-service-url` is not given, as the other commands take `--service-url`; the flag wins; with
neither, no external broker (the embedded pulsar-lite one). Only the parameters are resolved here
(click's make_context): nothing is started."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pytest

from pulsar_lifecycle.cli.up_cli import up

CONF_URL = "pulsar+ssl://broker.example:6651"


def _broker_url(args: List[str]) -> Optional[str]:
    ctx = up.make_context("up", args)
    try:
        return ctx.params["broker_service_url"]
    finally:
        ctx.close()


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "client.conf"
    path.write_text(f"brokerServiceUrl={CONF_URL}\nwebServiceUrl=https://broker.example:8443\n")
    return path


def test_the_client_conf_gives_the_broker(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PULSAR_CLIENT_CONF", raising=False)
    assert _broker_url(["--client-conf", str(conf)]) == CONF_URL
    monkeypatch.setenv("PULSAR_CLIENT_CONF", str(conf))
    assert _broker_url([]) == CONF_URL


def test_the_flag_wins_and_neither_means_the_embedded_broker(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSAR_CLIENT_CONF", str(conf))
    assert _broker_url(["--broker-service-url", "pulsar://127.0.0.1:6650"]) == "pulsar://127.0.0.1:6650"
    monkeypatch.delenv("PULSAR_CLIENT_CONF")
    assert _broker_url([]) is None
