"""SIGKILL the `pulsar-lifecycle localrun` worker process mid-stream while 30% of bookie calls
fail; restart it: 0 orphans, 0 in-use ledgers deleted, every permanently failing request in the
DLQ with its reason, forged requests never delete anything."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.broker import free_port, port_open
from pulsar_lifecycle.runtime.client import quiet_client
from servers.bookie_http_server import BookieHttpServer
from servers.internal_stats_server import InternalStatsServer
from support.deletion_scenario import build, collect_dlq, dlq_by_ledger, phase_one
from support.helpers import stop_process, wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO


def _write_config(tmp_path: Path, sc) -> Path:
    cfg = load_function_config(ROOT / "function-configs" / "ledger-deletion-worker.yaml")
    cfg.update(inputs=sc.topics.input_topics(), parallelism=2, subName=f"worker-{sc.topics.topic_name}",
               userConfig=sc.user_config(), secrets=dict(sc.secrets))
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _localrun(config: Path, port: int, data_dir: Path) -> subprocess.Popen:
    """localrun with its own embedded broker on `port` (data kept in data_dir across restarts).

    SIGKILL takes the broker down with the worker (its watchdog), as in the writer's crash test:
    a separate pulsar-lite would keep the killed client's consumer, and its unacked messages,
    registered until the broker restarts (docs/operations.md).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "functions"), env.get("PYTHONPATH", "")])
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "localrun.log", "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING", "localrun",
             "--function-config-file", str(config), "--embedded-broker-port", str(port), "--data-dir", str(data_dir)],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env,
        )
    assert wait_for(lambda: port_open("127.0.0.1", port), timeout=60), (data_dir / "localrun.log").read_text()[-2000:]
    return proc


def test_sigkill_mid_stream(s3_server, tmp_path, unique):
    topics = DeletionTopics(topic_name=f"__ledger_deletion_{unique.replace('-', '_')}")
    with InternalStatsServer() as admin, BookieHttpServer(fail_rate=0.3, seed=11, fail_after_delete_rate=0.1) as bookie:
        bookie.latency_s = 0.01
        sc = build(topics, admin, bookie, s3_server, tmp_path / "offload", n_topics=6, per_topic=48)
        config = _write_config(tmp_path, sc)
        port = free_port()
        proc = _localrun(config, port, tmp_path / "run")
        client = quiet_client(f"pulsar://127.0.0.1:{port}")
        try:
            phase_one(sc, client, delete_per_topic=40)
            assert len(sc.removed_bk) == 6 * 40 + 2
            # Kill somewhere in the middle of the stream.
            assert wait_for(lambda: len(bookie.deleted) >= 60, timeout=90), (
                f"only {len(bookie.deleted)} deletions before the kill point: "
                f"{(tmp_path / 'run' / 'localrun.log').read_text()[-2000:]}")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            killed_at = len(bookie.deleted)
            assert killed_at < len(sc.removed_bk) - len(sc.poison), "the stream finished before the kill"
            proc = _localrun(config, port, tmp_path / "run")
            assert wait_for(lambda: not sc.orphans(), timeout=180), f"orphans: {sorted(sc.orphans())[:10]}"
            expected = sc.in_use_requested | sc.forged | sc.poison
            msgs = collect_dlq(client, sc, time.monotonic() + 120,
                               lambda got: set(dlq_by_ledger(got)[0]) >= expected and dlq_by_ledger(got)[1])
        finally:
            stop_process(proc)
            client.close()
        by_ledger, undecodable = dlq_by_ledger(msgs)
        assert not sc.orphans()
        assert not sc.deleted_in_use()
        assert all(bookie.exists(l) for l in sc.forged | sc.in_use_requested | sc.poison)
        assert set(by_ledger) == sc.in_use_requested | sc.forged | sc.poison
        assert all(by_ledger[l].startswith("ownership mismatch") for l in sc.forged)
        assert all("gave up" in by_ledger[l] for l in sc.in_use_requested | sc.poison)
        assert undecodable and all("malformed" in r for r in undecodable)
        assert bookie.injected_failures > 0
