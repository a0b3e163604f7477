"""DelayLevelSyncerService with partitioned targets on real Apache Pulsar (issue 41, syncer part):
a refused forward target dead-lettered while the other partitions go on, and a burst of cancels of
forwarded messages followed to the right partition of a partitioned scheduling topic at once."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pulsar
import pytest

from pulsar_lifecycle.dedup.recovery import PRODUCER_PROPERTY
from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.config import parse_syncer_config
from pulsar_lifecycle.delaylevel.forwarder import ERROR_PROP
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_MSG_ID_PROP
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import CANCEL_PROP, TARGET_PROP, MessageRef
from pulsar_lifecycle.state.directory import DirectoryStateStore
from pulsar_lifecycle.timing import DelayedProducer
from support.crash_runs import create_partitioned_topic

pytestmark = [pytest.mark.integration,
              pytest.mark.pulsar_only("pulsar-lite cannot create partitioned topics (only address partitions by name)")]
NS = "persistent://public/default"
UNIT_S = 2


def make_service(client: pulsar.Client, tmp_path: Path, topics: Dict[str, str], *, metrics: Dict[str, float],
                 **user: Any) -> DelayLevelSyncerService:
    cfg = parse_syncer_config({"delayLevelTopic": topics["business"] + "-delay-level", "schedulingTopic": topics["sched"],
                               "partitionBy": "SECONDS", "unitSeconds": UNIT_S, "messageMaximumDelayTimeSeconds": 30,
                               "lookaheadMillis": 500, "metricsIntervalSeconds": 1, **user})
    return DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="test-syncer",
                                   state=DirectoryStateStore(tmp_path / "state", "public", "default", "syncer"),
                                   record_metric=metrics.__setitem__).start()


def make_producer(client: pulsar.Client, topics: Dict[str, str]) -> DelayLevelProducer:
    strategy = DelayLevelTopicPartitionStrategy(30, PartitionBy.SECONDS, unit_seconds=UNIT_S)
    return DelayLevelProducer(client, topics["business"], DelayedProducer(client, scheduling_topic=topics["sched"]),
                              delay_level_topic=topics["business"] + "-delay-level", strategy=strategy)


def _consumer(client: pulsar.Client, topic: str, sub: str) -> pulsar.Consumer:
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                            initial_position=pulsar.InitialPosition.Earliest)


def test_refused_target_is_dead_lettered_while_other_partitions_forward(broker, tmp_path, unique):
    # Broker backend: each forward goes to its business topic with deliver_at. One target lies in
    # a namespace that does not exist (the broker refuses it); forwards to a partitioned business
    # topic (keyed and unkeyed) go on, and the refused one is dead-lettered after forwardRetrySeconds.
    good = f"{NS}/dlp-good-{unique}"
    bad = f"persistent://public/no-such-ns-{unique[-8:]}/dlp-bad"
    create_partitioned_topic(broker.admin_url, good, 3)
    topics = {"business": good, "sched": f"{NS}/dlp-unused-{unique}"}
    client = quiet_client(broker.service_url)
    producer = make_producer(client, topics)
    out = _consumer(client, good, "check")
    dlq = _consumer(client, good + "-delay-level-DLQ", "check")
    metrics: Dict[str, float] = {}
    service = make_service(client, tmp_path, topics, metrics=metrics, nearTermBackend="broker", forwardRetrySeconds=3)
    try:
        sent_at = time.time()
        producer.topic = bad
        poisoned = producer.send(b"poison", delay_ms=3000)
        producer.topic = good
        ids = [producer.send(f"m{i}".encode(), delay_ms=3000 + 300 * (i % 10), key=f"k{i}" if i % 2 else None)
               for i in range(40)]
        assert len({i.partition for i in ids}) > 1
        got: Dict[str, float] = {}
        deadline = time.monotonic() + 40
        while len(got) < 40 and time.monotonic() < deadline:
            try:
                m = out.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            out.acknowledge(m)
            got.setdefault(m.data().decode(), time.time() - sent_at)
        letter = dlq.receive(timeout_millis=30000)
        props = letter.properties()
    finally:
        service.stop()
        producer.close()
        client.close()
    assert sorted(got) == sorted(f"m{i}" for i in range(40))
    assert letter.data() == b"poison" and props[TARGET_PROP] == bad and "refused for 3 s" in props[ERROR_PROP]
    assert props[ORIGIN_MSG_ID_PROP]
    assert poisoned.parked
    print(f"\nrefused target: 40 good forwards released, latest {max(got.values()):.1f} s after sending; "
          f"dead letter reason {props[ERROR_PROP][:160]!r}")


def _percentile(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def test_cancel_burst_of_forwarded_messages_follows_each_to_its_partition(broker, tmp_path, unique):
    # 200 parked messages forwarded well before due over a 4-partition scheduling topic, then 200
    # cancels at 200/s: each is followed by a tombstone on the partition that holds the forward,
    # naming its position, from the landed record (no read of the topic).
    n = 200
    sched = f"{NS}/dlp-sched-{unique}"
    create_partitioned_topic(broker.admin_url, sched, 4)
    topics = {"business": f"{NS}/dlp-biz-{unique}", "sched": sched}
    client = quiet_client(broker.service_url)
    producer = make_producer(client, topics)
    tap = _consumer(client, sched, "tap")
    metrics: Dict[str, float] = {}
    service = make_service(client, tmp_path, topics, metrics=metrics, lookaheadMillis=9000)
    forwards: Dict[str, Tuple[str, str]] = {}  # origin ref -> (partition topic, cancel form of its position)
    tombstones: Dict[Tuple[str, str], float] = {}
    lock = threading.Lock()
    try:
        ids = [producer.send(f"c{i}".encode(), delay_ms=14000 + 10 * i, key=f"k{i}" if i % 2 else None)
               for i in range(n)]
        assert all(i.parked for i in ids)
        deadline = time.monotonic() + 30
        while len(forwards) < n and time.monotonic() < deadline:
            try:
                m = tap.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            tap.acknowledge(m)
            if m.properties().get(PRODUCER_PROPERTY, "").startswith("test-syncer"):
                forwards[m.properties()[ORIGIN_MSG_ID_PROP]] = (m.topic_name(),
                                                                MessageRef.of(m.message_id()).format_cancel())
        assert len(forwards) == n, f"{len(forwards)} of {n} forwarded"
        assert len({t for t, _ in forwards.values()}) == 4, "forwards spread over the 4 partitions"

        def watch() -> None:
            while len(tombstones) < n and time.monotonic() < stop_at:
                try:
                    m = tap.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                tap.acknowledge(m)
                target = m.properties().get(CANCEL_PROP)
                if target:
                    with lock:
                        tombstones[(m.topic_name(), target)] = time.monotonic()
        stop_at = time.monotonic() + 30
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sent: Dict[Tuple[str, str], float] = {}
        start = time.monotonic()
        for j, mid in enumerate(ids):
            pause = start + j / 200.0 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            m_id = mid.message_id
            b = m_id.batch_index()
            ref = f"{m_id.ledger_id()}:{m_id.entry_id()}:{b}" if b >= 0 else f"{m_id.ledger_id()}:{m_id.entry_id()}"
            sent[forwards[ref]] = time.monotonic()
            producer.cancel(mid)
        watcher.join(35)
        followed = service.metrics()["pulsar_delay_level_cancels_followed_total"]
        followed_read = service.metrics()["pulsar_delay_level_cancels_followed_read_total"]
    finally:
        service.stop()
        producer.close()
        client.close()
    missing = [k for k in sent if k not in tombstones]
    assert not missing, f"{len(missing)} cancels never reached the writer's partition, e.g. {missing[:3]}"
    latencies = [1000 * (tombstones[k] - t) for k, t in sent.items()]
    assert followed == n and followed_read == 0
    print(f"\ncancel -> tombstone on the forward's partition, {n} cancels at 200/s over 4 partitions: "
          f"p50 {_percentile(latencies, 0.5):.0f} ms, p99 {_percentile(latencies, 0.99):.0f} ms, "
          f"max {max(latencies):.0f} ms")

