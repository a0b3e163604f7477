"""The DelayLevelSyncer function under the local runner: started by one tick, woken after a
restart by the tick it holds unacked (no runner ticks, no deliver_after)."""
from __future__ import annotations

import pytest
import yaml

from pulsar_lifecycle.config.function_config import spec_from_config
from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import tick_topic
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduling_protocol import TICK_PROP
from pulsar_lifecycle.timing import DelayedProducer
from support.helpers import drain, wait_for
from support.paths import REPO

pytestmark = pytest.mark.integration
ROOT = REPO


def test_restarted_syncer_is_woken_by_its_held_tick(broker, tmp_path, unique):
    ns = "persistent://public/default"
    ticks, sched, business = f"{ns}/dlf-ticks-{unique}", f"{ns}/dlf-sched-{unique}", f"{ns}/dlf-biz-{unique}"
    cfg = yaml.safe_load((ROOT / "function-configs" / "delay-level-syncer.yaml").read_text())
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg.update(name=f"dlf-{unique[-8:]}", subName=f"dlf-{unique[-8:]}")
    cfg["userConfig"].update(delayLevelTopic=business + "-delay-level", schedulingTopic=sched, tickTopic=ticks,
                             tickMode="hold", partitionBy="SECONDS", unitSeconds=2,
                             messageMaximumDelayTimeSeconds=20, lookaheadMillis=500)
    spec = spec_from_config(cfg)
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "data")
    client = quiet_client(broker.service_url)
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched),
                                  delay_level_topic=business + "-delay-level",
                                  strategy=DelayLevelTopicPartitionStrategy(20, PartitionBy.SECONDS, unit_seconds=2))
    runner = LocalRunner(spec, opts).start()
    try:
        client.create_producer(ticks).send(b"tick", properties={TICK_PROP: "0"})  # the operator's first tick
        assert wait_for(lambda: getattr(runner.functions()[0], "service", None) is not None, timeout=20)
        assert [m.data() for m in drain(client, sched, "check", 0, timeout=0.1)] == []
        runner.stop()
        parked = producer.send(b"after-restart", delay_ms=2600)
        assert parked.partition == 0
        runner = LocalRunner(spec, opts).start()  # no tick sent: the held one comes back
        got = drain(client, sched, "check", expect=1, timeout=15)
        assert [m.data() for m in got] == [b"after-restart"]
    finally:
        runner.stop()
        producer.close()
        client.close()


def test_shipped_config_starts_by_itself_on_the_first_parked_message(broker, tmp_path, unique):
    # Issue 11 gap 5: tickMode hold, input <delay-level topic>-TICK, nobody sends ticks; the
    # producer's wake tick (sent before its first parked message) starts the syncer.
    ns = "persistent://public/default"
    sched, business = f"{ns}/dls-sched-{unique}", f"{ns}/dls-biz-{unique}"
    dl = business + "-delay-level"
    cfg = yaml.safe_load((ROOT / "function-configs" / "delay-level-syncer.yaml").read_text())
    assert cfg["userConfig"]["tickMode"] == "hold" and list(cfg["inputSpecs"]) == [cfg["userConfig"]["tickTopic"]]
    assert cfg["userConfig"]["tickTopic"] == tick_topic(cfg["userConfig"]["delayLevelTopic"])
    cfg["inputSpecs"] = {tick_topic(dl): cfg["inputSpecs"][cfg["userConfig"]["tickTopic"]]}
    cfg.update(name=f"dls-{unique[-8:]}", subName=f"dls-{unique[-8:]}")
    cfg["userConfig"].update(delayLevelTopic=dl, schedulingTopic=sched, tickTopic=tick_topic(dl), partitionBy="SECONDS",
                             unitSeconds=2, messageMaximumDelayTimeSeconds=20, lookaheadMillis=500)
    runner = LocalRunner(spec_from_config(cfg), LocalRunOptions(broker_service_url=broker.service_url,
                                                                data_dir=tmp_path / "data")).start()
    client = quiet_client(broker.service_url)
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched),
                                  delay_level_topic=business + "-delay-level",
                                  strategy=DelayLevelTopicPartitionStrategy(20, PartitionBy.SECONDS, unit_seconds=2))
    try:
        assert getattr(runner.functions()[0], "service", None) is None  # idle: no tick yet
        assert producer.send(b"first", delay_ms=2600).partition == 0
        got = drain(client, sched, "check", expect=1, timeout=15)
    finally:
        runner.stop()
        producer.close()
        client.close()
    assert [m.data() for m in got] == [b"first"]
