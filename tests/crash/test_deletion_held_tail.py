"""A `localrun` deletion worker SIGKILLed while its consumers hold requests it never read, on a
pulsar-lite that lives on: the restarted worker deletes every requested ledger, without a broker
restart, and nothing else.

The second half of the requests reaches the worker's connection while its process is stopped:
unread in its socket at the kill, so the connection ends with a reset, and pulsar-lite keeps the
dead consumers with those requests until it restarts. The successor's consumers never receive
them; the local runner reads what lies beyond its kept floor with a Reader
(`runtime/input_tails.py`, `event=input_tail_read`). Apache Pulsar redelivers them by itself
(tests/crash/test_deletion_sigkill.py covers that broker).
"""
from __future__ import annotations

import signal
import time

import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.deletion.service import LedgerDeletionService
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.deletion.trusted import TrustedLedgerRegistry
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer
from servers.internal_stats_server import InternalStatsServer
from support.crash_runs import CrashBroker, sigkill, start_localrun
from support.deletion import req
from support.deletion_scenario import build
from support.helpers import stop_process, wait_for
from support.paths import REPO
from support.watched_bookie import WatchedBookie

pytestmark = [pytest.mark.integration]
RECOVERY_S = 30  # the successor's idle check comes 2 s after its last message; a loaded machine adds


@pytest.mark.lite_only("Apache Pulsar redelivers a dead consumer's messages (test_deletion_sigkill.py)")
def test_a_killed_workers_held_requests_are_deleted_after_its_restart(broker, s3_server, tmp_path, unique):
    topics = DeletionTopics(topic_name=f"__ledger_deletion_{unique.replace('-', '_')}")
    shared = CrashBroker("lite", broker.service_url)  # outlives the worker's processes
    log = tmp_path / "localrun.log"
    (tmp_path / "run").mkdir()
    with InternalStatsServer() as admin, WatchedBookie() as bookie:
        sc = build(topics, admin, bookie, s3_server, tmp_path / "offload", n_topics=4, per_topic=48)
        cfg = load_function_config(REPO / "function-configs" / "ledger-deletion-worker.yaml")
        cfg.update(inputs=sc.topics.input_topics(), parallelism=1, subName=f"worker-{sc.topics.topic_name}",
                   userConfig=sc.user_config(), secrets=dict(sc.secrets))
        config = tmp_path / "worker.yaml"
        config.write_text(yaml.safe_dump(cfg))
        client = quiet_client(broker.service_url)
        delayed = DelayedProducer(client, backend="broker")
        service = LedgerDeletionService(client, sc.topics, delayed, send_delay_seconds=1,
                                        trusted=TrustedLedgerRegistry())
        proc = start_localrun(config, shared, tmp_path / "run", log, cwd=tmp_path)

        def request(lids: "list[tuple[str, int]]") -> None:
            for topic, lid in lids:
                service.append(req(topic, lid))
                admin.remove_ledger(topic, lid)
                sc.removed_bk[lid] = topic

        try:
            wanted = [(t, l) for t in sorted(admin.topics) if "victim" not in t for l in admin.topics[t].ledgers
                      if l % 100_000 < 40]
            first, second = wanted[:len(wanted) // 4], wanted[len(wanted) // 4:]
            request(first)
            assert wait_for(lambda: set(bookie.deleted) >= {l for _, l in first}, timeout=60), log.read_text()[-3000:]
            time.sleep(4)  # idle: the runner's floor moves over what it acked
            proc.send_signal(signal.SIGSTOP)
            request(second)
            time.sleep(1)  # dispatched into the stopped worker's socket
            sigkill(proc)
            held = {l for _, l in second} - set(bookie.deleted)
            assert held, "the stopped worker deleted everything: nothing was held"
            proc = start_localrun(config, shared, tmp_path / "run", log, cwd=tmp_path)
            restarted = time.monotonic()
            ok = wait_for(lambda: not sc.orphans(), timeout=RECOVERY_S, interval=0.2)
            took = time.monotonic() - restarted
            assert ok, (f"{len(sc.orphans())} of {len(held)} held requests' ledgers still orphaned {RECOVERY_S} s after "
                        f"the restart: {sorted(sc.orphans())[:10]}; {log.read_text()[-3000:]}")
        finally:
            stop_process(proc)
            service.close()
            delayed.close()
            client.close()
        assert set(bookie.deleted) <= set(sc.removed_bk), "a ledger that was not requested was deleted"
        assert not sc.deleted_in_use()
        assert len(bookie.deleted) == len(set(bookie.deleted)), "a ledger was deleted twice"
        print(f"held {len(held)} of {len(second)}; all deleted {took:.1f} s after the restart")
