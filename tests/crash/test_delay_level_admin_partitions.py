"""DelayLevelSyncer on a real partitioned delay-level topic that an operator grows through the
admin REST API while the syncer runs: the partitions added are discovered by the running syncer
(a `localrun --broker-service-url` process, SIGKILLed before and after the growth), and every
parked message is forwarded exactly once.

Real Pulsar refuses a partition beyond a partitioned topic's partition count (NotAllowedError),
for a producer as for a consumer; the syncer's discovery probes the partitions beyond the ones it
reads, so a refused one must count as absent, not fail the probe."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Dict, Set, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_PARTITION_PROP, partition_topic
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import (
    crash_broker,
    create_partitioned_topic,
    grow_partitioned_topic,
    partition_count,
    sigkill,
    start_localrun,
    wait_subscribed,
)
from support.helpers import stop_process, wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.pulsar_only("pulsar-lite has no admin REST API and no partitioned topics")]
NS = "persistent://public/default"
UNIT_S = 2
BEFORE, AFTER = 10, 14  # partitions before and after the growth (maximum delay 20 s, then 28 s)


def syncer_config(tmp_path: Path, unique: str, partitions: int) -> Tuple[Path, Dict[str, str]]:
    t = {"sched": f"{NS}/dlg-sched-{unique}", "business": f"{NS}/dlg-biz-{unique}", "ticks": f"{NS}/dlg-ticks-{unique}"}
    t["dl"] = t["business"] + "-delay-level"
    cfg = yaml.safe_load((REPO / "function-configs" / "delay-level-syncer.yaml").read_text())
    cfg["inputSpecs"] = {t["ticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg.update(name=f"dlg-syncer-{unique}", subName=f"dlg-syncer-{unique}")
    cfg["userConfig"].update(delayLevelTopic=t["dl"], schedulingTopic=t["sched"], partitionBy="SECONDS",
                             unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=partitions * UNIT_S,
                             lookaheadMillis=1000, partitionDiscoverySeconds=1, tickTopic=t["ticks"],
                             tickTimeMillis=200, tickMode="runner")
    path = tmp_path / f"syncer-{partitions}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, t


def park(producer: DelayLevelProducer, payloads: Dict[bytes, int], lo_ms: int, hi_ms: int, rng: random.Random,
         prefix: str, n: int) -> None:
    """Park n messages with delays in [lo_ms, hi_ms], the first at hi_ms (the last partition holds
    only the maximum delay); every send confirmed."""
    failed = []
    for i in range(n):
        delay = hi_ms if i == 0 else rng.randint(lo_ms, hi_ms)
        payload = f"{prefix}{i}".encode()
        payloads[payload] = delay
        producer.send_async(payload, lambda res, _id, p=payload: res == pulsar.Result.Ok or failed.append(p),
                            delay_ms=delay)
    producer.flush()
    assert not failed, f"{len(failed)} parked messages not confirmed, e.g. {failed[:3]}"


@pytest.mark.parametrize("kind", broker_kinds())
def test_partitions_added_through_the_admin_api_are_discovered_and_forwarded_once(request, tmp_path, unique, kind):
    broker = crash_broker(request, kind)
    unique = unique[-8:]  # state keys embed producer and topic names; keep file names short
    before, t = syncer_config(tmp_path, unique, BEFORE)
    after, _ = syncer_config(tmp_path, unique, AFTER)
    create_partitioned_topic(broker.admin_url, t["dl"], BEFORE)
    data, log = tmp_path / "data", tmp_path / "syncer.log"
    proc = start_localrun(before, broker, data, log, log_level="INFO")
    client = quiet_client(broker.service_url)
    forwards: Dict[bytes, Set[Tuple[int, int, int]]] = {}  # payload -> distinct positions on the scheduling topic
    origins: Dict[bytes, str] = {}
    parked: Dict[bytes, int] = {}
    rng = random.Random(5)

    def pump(seconds: float, extra: int = 0) -> None:
        """Read forwards for `seconds` or until every parked message (+ `extra`) was seen."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(forwards) < len(parked) + extra:
            try:
                m = tap.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            mid = m.message_id()
            forwards.setdefault(m.data(), set()).add((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
            origins[m.data()] = m.properties().get(ORIGIN_PARTITION_PROP, "")
            tap.acknowledge(m)

    grown = None
    try:
        tap = client.subscribe(t["sched"], "tap", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
        wait_subscribed(broker.admin_url, [partition_topic(t["dl"], k) for k in range(BEFORE)])
        strategy = DelayLevelTopicPartitionStrategy(BEFORE * UNIT_S, PartitionBy.SECONDS, unit_seconds=UNIT_S)
        producer = DelayLevelProducer(client, t["business"], DelayedProducer(client, scheduling_topic=t["sched"]),
                                      delay_level_topic=t["dl"],
                                      strategy=strategy)
        start = now_ms()
        park(producer, parked, 2_500, BEFORE * UNIT_S * 1000, rng, "a", 1500)
        pump(3)
        sigkill(proc)  # the running syncer dies with forwards in flight, before the growth
        proc = start_localrun(before, broker, data, log, log_level="INFO")

        grow_partitioned_topic(broker.admin_url, t["dl"], AFTER)
        assert partition_count(broker.admin_url, t["dl"]) == AFTER
        grown = DelayLevelProducer(client, t["business"], DelayedProducer(client, scheduling_topic=t["sched"]),
                                   delay_level_topic=t["dl"],
                                   strategy=DelayLevelTopicPartitionStrategy(AFTER * UNIT_S, PartitionBy.SECONDS,
                                                                             unit_seconds=UNIT_S))
        # Delays of 20-28 s: partitions 9-13, four of them new.
        park(grown, parked, BEFORE * UNIT_S * 1000, AFTER * UNIT_S * 1000, rng, "b", 400)
        found = [f"event=delay_level_partition_discovered topic={t['dl']} partition={k} " for k in range(BEFORE, AFTER)]
        assert wait_for(lambda: all(f in log.read_text() for f in found), timeout=30, interval=0.5), \
            f"the running syncer did not discover partitions {BEFORE}-{AFTER - 1}; see {log}"
        pump(2)
        # The operator raises the syncer's strategy too; it restarts (SIGKILLed here) with it.
        sigkill(proc)
        proc = start_localrun(after, broker, data, log, log_level="INFO")
        pump(max(0.0, (start + 6_000 + AFTER * UNIT_S * 1000 - now_ms()) / 1000) + 30)
        pump(3, extra=1)  # a copy forwarded late would show up here
    finally:
        if grown is not None:
            grown.close()
        stop_process(proc)
        client.close()
    missing = set(parked) - set(forwards)
    twice = {p: len(ids) for p, ids in forwards.items() if len(ids) > 1}
    new_partitions = {o for p, o in origins.items() if p.startswith(b"b")}
    assert not missing, f"{len(missing)} of {len(parked)} parked messages never forwarded, e.g. {sorted(missing)[:5]}"
    assert not twice, f"{len(twice)} forwarded more than once, e.g. {list(twice.items())[:5]}"
    assert {partition_topic(t["dl"], k) for k in range(BEFORE, AFTER)} <= new_partitions, sorted(new_partitions)


@pytest.mark.parametrize("kind", broker_kinds())
def test_a_strategy_beyond_the_partitioned_topic_is_refused_with_what_to_do(request, tmp_path, unique, kind):
    from pulsar_lifecycle.delaylevel import PartitionRefusedError
    from pulsar_lifecycle.delaylevel.config import parse_syncer_config
    from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
    from pulsar_lifecycle.state.directory import DirectoryStateStore

    broker = crash_broker(request, kind)
    dl = f"{NS}/dlr-biz-{unique}-delay-level"
    create_partitioned_topic(broker.admin_url, dl, BEFORE)
    cfg = parse_syncer_config({"delayLevelTopic": dl, "schedulingTopic": f"{NS}/dlr-sched-{unique}",
                               "partitionBy": "SECONDS", "unitSeconds": UNIT_S,
                               "messageMaximumDelayTimeSeconds": AFTER * UNIT_S, "partitionDiscoverySeconds": 0})
    client = quiet_client(broker.service_url)
    try:
        service = DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="dlr",
                                          state=DirectoryStateStore(tmp_path / "state", "public", "default", "s"),
                                          record_metric=lambda _n, _v: None)
        with pytest.raises(PartitionRefusedError, match=f"partition {BEFORE} of the delay-level topic .* fewer "
                                                        f"partitions than the strategy's {AFTER}.* -p {AFTER}"):
            service.start()
    finally:
        client.close()
