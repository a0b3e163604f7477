"""A healthy start and a clean stop of the shipped set say nothing at WARNING or above.

`up` runs every shipped function config (function-configs/) as shipped, on a brand-new
pulsar-lite it starts itself, on a brand-new one given with --broker-service-url (the start
ticks path of an external broker) and on a brand-new Apache Pulsar 4.0.0 standalone given the
same way; the first delayed message ever sent is released, another is left pending, and SIGINT
stops it. Neither the console nor the log has a WARNING or ERROR line: a fresh broker's missing
wake tick and a first message's gap read are INFO. (test_pulsar_localrun.py checks the writer's
instance log under Pulsar's own local runner.)
"""
from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import pulsar
import pytest

from pulsar_lifecycle.runtime.broker import EmbeddedBroker, free_port, port_open
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from support.broker_fixtures import broker_kinds
from support.cli import CLI, cli_env, run_cli
from support.helpers import stop_process, wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration]
NEW_LITE = "starts brand-new pulsar-lite brokers of its own"
NEW_PULSAR = "starts a brand-new Apache Pulsar standalone of its own"
ALARM = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


def alarms(*texts: str) -> List[str]:
    """The lines of `texts` logged at WARNING or above (or a traceback)."""
    return [ln for text in texts for ln in text.splitlines() if ALARM.search(ln)]


def assert_quiet(texts: Tuple[str, str], tmp_path: Path) -> None:
    """No alarm in `texts`; otherwise fail with the alarms, the log lines before each and the
    pulsar-client log's warnings and errors (which name the topic and subscription of a refusal)."""
    found = alarms(*texts)
    if not found:
        return
    lines = [ln for text in texts for ln in text.splitlines()]
    context = [ln for a in found for ln in lines[max(0, lines.index(a) - 15):lines.index(a) + 1]]
    client_log = tmp_path / "data" / "pulsar-client.log"
    client = [ln for ln in (client_log.read_text(errors="replace").splitlines() if client_log.exists() else [])
              if re.search(r"\b(WARN|ERROR)\b", ln)]
    raise AssertionError("alarms:\n" + "\n".join(found) + "\n-- before them:\n" + "\n".join(context)
                         + "\n-- pulsar-client log warnings and errors:\n" + "\n".join(client[-40:]))


def _first_messages(url: str, tmp_path: Path) -> None:
    """The first delayed message ever sent on this broker is released; a second one stays pending."""
    target = "persistent://public/default/quiet-orders"
    client = quiet_client(url)
    got: List[bytes] = []
    try:
        consumer = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        for payload, delay in (("first", "1s"), ("pending", "10m")):
            res = run_cli("delayed", "send", target, payload, "--in", delay, "--service-url", url,
                          tmp_path=tmp_path, cwd=REPO)
            assert res.returncode == 0, res.stderr[-2000:]

        def received() -> bool:
            try:
                m = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                return bool(got)
            consumer.acknowledge(m)
            got.append(m.data())
            return True
        assert wait_for(received, timeout=60, interval=0), "the first message was not released"
    finally:
        client.close()
    assert got == [b"first"]


def _run_up(tmp_path: Path, broker_url: Optional[str]) -> Tuple[str, str]:
    """(stdout, stderr) of an `up` of the shipped set that sent its first messages and got SIGINT."""
    args = ["--data-dir", str(tmp_path / "data"), "--refresh", "0.5"]
    if broker_url:
        url = broker_url
        args += ["--broker-service-url", broker_url]
    else:
        port = free_port()
        url = f"pulsar://127.0.0.1:{port}"
        args += ["--embedded-broker-port", str(port)]
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    with out.open("w") as fo, err.open("w") as fe:
        proc = subprocess.Popen([*CLI, "up", *args], cwd=REPO, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                text=True, env=cli_env(tmp_path))
        try:
            assert wait_for(lambda: port_open("127.0.0.1", int(url.rsplit(":", 1)[1])) and "broker pulsar://"
                            in out.read_text(), timeout=120, interval=0.2), err.read_text()[-3000:]
            _first_messages(url, tmp_path)
        finally:
            rc = stop_process(proc, signal.SIGINT, timeout=60)
    assert rc == 0, err.read_text()[-3000:]
    return out.read_text(), err.read_text()


@pytest.mark.lite_only(NEW_LITE)
def test_up_on_its_embedded_broker_starts_and_stops_without_a_warning(tmp_path: Path) -> None:
    assert_quiet(_run_up(tmp_path, None), tmp_path)


@pytest.mark.lite_only(NEW_LITE)
def test_up_on_a_brand_new_external_broker_starts_and_stops_without_a_warning(tmp_path: Path) -> None:
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        texts = _run_up(tmp_path, broker.service_url)
    assert_quiet(texts, tmp_path)


@pytest.mark.pulsar_only(NEW_PULSAR)
@pytest.mark.skipif("pulsar" not in broker_kinds(), reason=f"not on lite: {NEW_PULSAR}")
@pytest.mark.timeout(300)
def test_up_on_a_brand_new_pulsar_standalone_starts_and_stops_without_a_warning(
        tmp_path: Path, pulsar_factory: Callable[..., PulsarStandalone]) -> None:
    standalone = pulsar_factory()
    assert_quiet(_run_up(tmp_path, standalone.service_url), tmp_path)
