"""The shipped deletion worker's delays reach the shipped writer and come back: phase one's
request (sendDelaySeconds) and a retry (reconsumeLaterSeconds) are delayed through the writer's
scheduling topic, which releases them to the deletion and RETRY partitions because its
allowedTargetPrefix lists the deletion topics; the retried request deletes the orphan."""
from __future__ import annotations

from typing import Any, Dict

import pytest

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.deletion.service import LedgerDeletionService
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.timing import DelayedProducer
from servers.bookie_http_server import BookieHttpServer, pulsar_metadata
from servers.internal_stats_server import InternalStatsServer
from support.deletion import req
from support.helpers import drain, wait_for
from support.paths import REPO

NS = "persistent://public/default"


def _writer(unique: str) -> Dict[str, Any]:
    """The shipped writer on topics of this test; its allowedTargetPrefix as shipped."""
    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    sched, ticks = f"{NS}/dtw-sched-{unique}", f"{NS}/dtw-ticks-{unique}"
    cfg.update(name=f"dtw-writer-{unique}", output=f"{NS}/dtw-released-{unique}",
               inputSpecs={ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}})
    cfg["userConfig"] = dict(cfg["userConfig"], schedulingTopic=sched, tickTopic=ticks, tickMode="runner",
                             tickTimeMillis=200)
    return cfg


@pytest.mark.lite_only("the admin REST and bookie HTTP are local servers here; the real-worker end-to-end test "
                       "drives a retry on real Pulsar")
def test_a_retried_deletion_goes_through_the_shipped_writer(broker, tmp_path, unique):
    topics = DeletionTopics(topic_name=f"__ledger_deletion_{unique.replace('-', '_')}", parallelism=1)
    data_topic = f"public/default/dtw-data-{unique}"
    wcfg = _writer(unique)
    sched = wcfg["userConfig"]["schedulingTopic"]
    with InternalStatsServer() as admin, BookieHttpServer() as bookie:
        admin.set_topic(data_topic, ledgers=[10, 11])
        for ledger in (10, 11):
            bookie.add_ledger(ledger, pulsar_metadata(data_topic))
        worker = load_function_config(REPO / "function-configs" / "ledger-deletion-worker.yaml")
        worker.update(name=f"dtw-worker-{unique}", subName=f"dtw-worker-{unique}", parallelism=1,
                      inputs=topics.input_topics())
        worker["userConfig"] = dict(worker["userConfig"], deletionTopicName=topics.topic_name,
                                    ledgerDeletionParallelism=1, schedulingTopic=sched, sendDelaySeconds=1,
                                    reconsumeLaterSeconds=1, ledgersCacheTtlSeconds=1, pulsarAdminUrl=admin.url,
                                    bookieHttpUrls=[bookie.url])
        assert worker["userConfig"]["delayBackend"] == "scheduler"  # as shipped
        opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "data")
        runners = [LocalRunner(spec_from_config(wcfg), opts).start(), LocalRunner(spec_from_config(worker), opts).start()]
        client = quiet_client(broker.service_url)
        delayed = DelayedProducer(client, backend="scheduler", scheduling_topic=sched)
        service = LedgerDeletionService(client, topics, delayed, send_delay_seconds=1)
        try:
            # Phase one's request goes out while the ledger is still in the topic's metadata (as
            # when the metadata update is slow): the worker finds it in use and retries.
            service.append(req(data_topic, 10))
            assert wait_for(lambda: admin.calls_for(data_topic) >= 1, timeout=60), "the request never reached the worker"
            assert bookie.exists(10)
            admin.remove_ledger(data_topic, 10)
            assert wait_for(lambda: not bookie.exists(10), timeout=60), "the retried request did not delete the orphan"
            assert bookie.exists(11)
            retried = drain(client, topics.retry_partition(0), "audit", expect=1, timeout=5)
            refused = drain(client, f"{sched}-INVALID", "audit", expect=1, timeout=1)
        finally:
            service.close()
            delayed.close()
            client.close()
            for runner in reversed(runners):
                runner.stop()
    assert len(retried) == 1 and retried[0].properties().get("RECONSUMETIMES") == "1", \
        [m.properties() for m in retried]
    assert refused == [], [m.properties() for m in refused]
