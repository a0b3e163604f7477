"""`--connect-timeout`: given, a command waits through refused connections (a broker still
starting) up to it; not given, a refused connection fails at once with what to do."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pulsar_lifecycle.runtime.broker import EmbeddedBroker, free_port
from pulsar_lifecycle.runtime.client import quiet_client
from support.cli import CLI, assert_one_line_error, cli_env, run_cli
from support.helpers import drain
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.lite_only("starts its own pulsar-lite on a fixed port")]
DELETION_TOPIC = "persistent://pulsar/system/__ledger_deletion"  # the shipped worker's, 4 partitions


def test_explicit_connect_timeout_waits_for_a_broker_that_starts_late(tmp_path: Path) -> None:
    """A script starts a broker and enqueues right after: 8 enqueues started ~3 s before the
    broker listens, each with --connect-timeout 30, all exit 0 and all 8 requests are stored."""
    port = free_port()
    url = f"pulsar://127.0.0.1:{port}"
    procs = [subprocess.Popen([*CLI, "deletion", "enqueue", "--service-url", url, "--topic",
                               "public/default/late-broker", "--ledger-id", str(500 + i), "--send-delay-seconds", "0",
                               "--connect-timeout", "30"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, env=cli_env(tmp_path))
             for i in range(8)]
    try:
        time.sleep(3.0)
        assert all(p.poll() is None for p in procs), "an enqueue gave up before the broker started"
        with EmbeddedBroker(data_dir=tmp_path / "broker", port=port) as broker:
            outs = [p.communicate(timeout=60) for p in procs]
            codes = [p.returncode for p in procs]
            assert codes == [0] * 8, [(c, err[-800:]) for c, (_, err) in zip(codes, outs)]
            client = quiet_client(broker.service_url)
            try:
                stored = []
                for k in range(4):
                    stored += drain(client, f"{DELETION_TOPIC}-partition-{k}", "check", expect=8, timeout=3)
            finally:
                client.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(stored) == 8, f"{len(stored)} of 8 enqueues stored"
    for i in range(8):
        assert any(f'"ledgerId": {500 + i}' in out for out, _ in outs), i


def test_without_connect_timeout_a_refused_connection_still_fails_at_once(tmp_path: Path) -> None:
    url = f"pulsar://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    res = run_cli("deletion", "enqueue", "--service-url", url, "--topic", "public/default/t", "--ledger-id", "7",
                  "--send-delay-seconds", "0", tmp_path=tmp_path, cwd=REPO, timeout=25)
    assert time.monotonic() - t0 < 15
    assert_one_line_error(res, url, "refused the connection", "--embedded-broker-port")


def test_an_explicit_connect_timeout_that_runs_out_names_the_refusal(tmp_path: Path) -> None:
    url = f"pulsar://127.0.0.1:{free_port()}"
    res = run_cli("deletion", "enqueue", "--service-url", url, "--topic", "public/default/t", "--ledger-id", "7",
                  "--send-delay-seconds", "0", "--connect-timeout", "2", tmp_path=tmp_path, cwd=REPO, timeout=25)
    assert_one_line_error(res, url, "still refused the connection after 2.", "--embedded-broker-port")
