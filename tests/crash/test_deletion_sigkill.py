"""SIGKILL the `pulsar-lifecycle localrun` worker while 8 deletions are in flight and 30% of
bookie calls fail, then restart it, on both broker kinds: no ledger lost (0 orphans, every
permanently failing request in the DLQ with its reason), none deleted while in use, none deleted
twice wrongly (no two calls about one ledger ever overlap, nothing deleted that was not
requested, forged requests delete nothing).

One instance (`parallelism: 1`) with `maxDeletionsInFlight: 8`, so every overlap the bookie sees
would be that worker's own. The storage is the local stand-ins (bookie HTTP, internalStats, S3,
filesystem); only the broker differs: on pulsar-lite localrun owns its embedded broker, which
dies with it; on real Apache Pulsar the broker lives on and redelivers what the killed consumer
left unacked (tests/support/crash_runs.py).
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.client import quiet_client
from servers.internal_stats_server import InternalStatsServer
from support.broker_fixtures import broker_kinds
from support.crash_runs import CrashBroker, crash_broker, sigkill, start_localrun, wait_subscribed
from support.deletion_scenario import Scenario, build, collect_dlq, dlq_by_ledger, phase_one
from support.helpers import stop_process, wait_for
from support.paths import REPO
from support.watched_bookie import WatchedBookie

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IN_FLIGHT = 8


def _write_config(tmp_path: Path, sc: Scenario) -> Path:
    cfg = load_function_config(REPO / "function-configs" / "ledger-deletion-worker.yaml")
    cfg.update(inputs=sc.topics.input_topics(), parallelism=1, subName=f"worker-{sc.topics.topic_name}",
               userConfig=sc.user_config(maxDeletionsInFlight=IN_FLIGHT), secrets=dict(sc.secrets))
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(config: Path, broker: CrashBroker, tmp_path: Path, sc: Scenario) -> "subprocess.Popen[bytes]":
    proc = start_localrun(config, broker, tmp_path / "run", tmp_path / "localrun.log", cwd=tmp_path)
    if broker.standalone is not None:
        # Real Pulsar keeps no backlog for a topic nobody subscribed to: send once the worker has.
        wait_subscribed(broker.admin_url, sc.topics.input_topics())
    return proc


@pytest.mark.parametrize("kind", broker_kinds())
def test_sigkill_with_deletions_in_flight(request, s3_server, tmp_path, unique, kind):
    broker = crash_broker(request, kind)
    topics = DeletionTopics(topic_name=f"__ledger_deletion_{unique.replace('-', '_')}")
    log = tmp_path / "localrun.log"
    (tmp_path / "run").mkdir()
    # Each ledger call takes 50 ms: deletions overlap, and the stream lasts long enough to be cut.
    with InternalStatsServer() as admin, WatchedBookie(fail_rate=0.3, seed=11, fail_after_delete_rate=0.1,
                                                       call_s=0.05) as bookie:
        sc = build(topics, admin, bookie, s3_server, tmp_path / "offload", n_topics=6, per_topic=48)
        config = _write_config(tmp_path, sc)
        proc = _start(config, broker, tmp_path, sc)
        client = quiet_client(broker.service_url)
        try:
            phase_one(sc, client, delete_per_topic=40)
            assert len(sc.removed_bk) == 6 * 40 + 2
            # Kill while deletions are in flight, somewhere in the middle of the stream.
            def in_flight() -> bool:
                return bookie.deletes_in_progress() >= 2 and len(bookie.deleted) >= 40

            assert wait_for(in_flight, timeout=120, interval=0.01), (
                f"{len(bookie.deleted)} deleted, {bookie.deletes_in_progress()} in progress: {log.read_text()[-2000:]}")
            sigkill(proc)
            killed_at = len(bookie.deleted)
            assert killed_at < len(sc.removed_bk) - len(sc.poison), "the stream finished before the kill"
            assert bookie.most_in_progress >= 2
            proc = _start(config, broker, tmp_path, sc)
            assert wait_for(lambda: not sc.orphans(), timeout=240), f"orphans: {sorted(sc.orphans())[:10]}"
            expected = sc.in_use_requested | sc.forged | sc.poison
            msgs = collect_dlq(client, sc, time.monotonic() + 120,
                               lambda got: set(dlq_by_ledger(got)[0]) >= expected and bool(dlq_by_ledger(got)[1]))
        finally:
            stop_process(proc)
            client.close()
        by_ledger, undecodable = dlq_by_ledger(msgs)
        # None lost: every removed ledger is gone, every permanent failure is in the DLQ with its reason.
        assert not sc.orphans()
        assert set(by_ledger) == expected
        assert all(by_ledger[l].startswith("ownership mismatch") for l in sc.forged)
        assert all("gave up" in by_ledger[l] for l in sc.in_use_requested | sc.poison)
        assert undecodable and all("malformed" in r for r in undecodable)
        # None deleted while in use, none that was not requested, forged requests harmless.
        assert not sc.deleted_in_use()
        assert set(bookie.deleted) <= set(sc.removed_bk)
        assert all(bookie.exists(l) for l in sc.forged | sc.in_use_requested | sc.poison)
        # None deleted twice wrongly: never two calls about one ledger at once, each removed once.
        assert bookie.overlaps == [], f"calls about one ledger overlapped: {sorted(set(bookie.overlaps))[:10]}"
        assert len(bookie.deleted) == len(set(bookie.deleted))
        assert bookie.injected_failures > 0
        print(f"{kind}: killed with {killed_at} deleted, most calls in progress {bookie.most_in_progress}, "
              f"DELETE calls {sum(bookie.delete_requests.values())} for {len(bookie.deleted)} ledgers, "
              f"faults {bookie.injected_failures}")
