"""LedgerDeletionWorker end to end on the embedded broker, with 30% of bookie calls failing."""
from __future__ import annotations

import time

import pytest

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.deletion.operator import list_dlq, replay_dlq
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from servers.bookie_http_server import BookieHttpServer
from servers.internal_stats_server import InternalStatsServer
from support.deletion_scenario import build, collect_dlq, dlq_by_ledger, phase_one
from support.helpers import wait_for
from support.paths import REPO

pytestmark = pytest.mark.integration
ROOT = REPO
CONFIG = ROOT / "function-configs" / "ledger-deletion-worker.yaml"


@pytest.fixture(autouse=True)
def _functions_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "functions"))


def _runner(broker, sc, tmp_path, parallelism=2, **extra):
    spec = spec_from_config(load_function_config(CONFIG), {
        "inputs": sc.topics.input_topics(),
        "parallelism": parallelism,
        "subName": f"worker-{sc.topics.topic_name}",
        "userConfig": sc.user_config(**extra),
    })
    spec.secrets = dict(sc.secrets)
    return LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "run",
                                             nack_redelivery_delay_ms=1000)).start()


def test_worker_under_storage_faults(broker, s3_server, tmp_path, unique):
    topics = DeletionTopics(topic_name=f"__ledger_deletion_{unique.replace('-', '_')}")
    with InternalStatsServer() as admin, BookieHttpServer(fail_rate=0.3, seed=7) as bookie:
        sc = build(topics, admin, bookie, s3_server, tmp_path / "offload")
        client = quiet_client(broker.service_url)
        phase_one(sc, client)
        assert len(sc.removed_bk) == 77 and sc.removed_s3 and sc.removed_fs and sc.forged and sc.poison
        runner = _runner(broker, sc, tmp_path)
        try:
            until = time.monotonic() + 120
            assert wait_for(lambda: not sc.orphans(), timeout=120), f"orphans left: {sorted(sc.orphans())}"
            msgs = collect_dlq(client, sc, until, lambda got: len(got) >= sc.expected_dlq)
        finally:
            runner.stop()
        by_ledger, undecodable = dlq_by_ledger(msgs)
        # 0 orphans, 0 in-use ledgers deleted, forged requests harmless.
        assert not sc.orphans()
        assert not sc.deleted_in_use()
        assert all(bookie.exists(l) for l in sc.forged)
        assert all(bookie.exists(l) for l in sc.in_use_requested)
        # Every permanently failing request is in the DLQ with its reason.
        assert set(by_ledger) == sc.in_use_requested | sc.forged | sc.poison, by_ledger
        for l in sc.forged:
            assert "ownership mismatch" in by_ledger[l] and "victim" in by_ledger[l]
        for l in sc.in_use_requested:
            assert "still in use" in by_ledger[l] and "gave up after 20 retries" in by_ledger[l]
        for l in sc.poison:
            assert "gave up after 20 retries" in by_ledger[l] and "500" in by_ledger[l]
        assert len(undecodable) == 1 and "malformed" in undecodable[0]
        assert bookie.injected_failures > 0
        print("removed", len(sc.removed_bk), len(sc.removed_s3), len(sc.removed_fs), "deleted", len(bookie.deleted), "faults", bookie.injected_failures, "dlq", len(msgs), "requests", bookie.requests)
        m = runner.metrics
        assert m is not None

        # The operator fixes the storage and replays the poisoned requests: nothing is left behind.
        bookie.poisoned.clear()
        pending = list_dlq(client, topics, idle_timeout_s=1.0)
        assert {e.ledger_id for e in pending if e.ledger_id is not None} == set(by_ledger)
        replayed = replay_dlq(client, topics, idle_timeout_s=1.0, select=lambda e: e.ledger_id in sc.poison)
        assert {e.ledger_id for e in replayed} == sc.poison
        runner = _runner(broker, sc, tmp_path)
        try:
            assert wait_for(lambda: not any(bookie.exists(l) for l in sc.poison), timeout=60)
        finally:
            runner.stop()
            client.close()
        assert not sc.deleted_in_use()
