"""The delay-level chain over a partitioned scheduling topic on real Apache Pulsar (issue 41): a
DelayLevelSyncer (`localrun --broker-service-url`, as test_delay_level_crash runs it) forwards into
a 4-partition scheduling topic read by a partitioned BucketSnapshotWriter (`--parallelism 2`,
`schedulingTopicPartitions` 4). The syncer is SIGKILLed twice, each time right after a forward was
seen on the scheduling topic (mid-forward: more of the batch in flight), and restarted. Every
parked message is released once, none before its deliver-at time (the writer's released-at
property), none lost."""
from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Dict, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_MSG_ID_PROP, partition_topic
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import (
    CrashBroker,
    ReleaseCount,
    crash_broker,
    create_partitioned_topic,
    sigkill,
    start_localrun,
    stop_all,
    topic_stats,
    wait_subscribed,
)
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.pulsar_only("a partitioned scheduling topic fed through the client's routing needs a "
                                      "partitioned topic; pulsar-lite only addresses partitions by name")]
NS = "persistent://public/default"
N = 2000
UNIT_S = 2
UNITS = 12  # delays up to 24 s
PARTITIONS = 4
LOOKAHEAD_MS = 1000
KILLS = 2


def _configs(tmp_path: Path, unique: str) -> Tuple[Path, Path, Dict[str, str]]:
    t = {"sched": f"{NS}/dlpc-sched-{unique}", "wticks": f"{NS}/dlpc-wticks-{unique}",
         "sticks": f"{NS}/dlpc-sticks-{unique}", "business": f"{NS}/dlpc-biz-{unique}"}
    t["dl"] = t["business"] + "-delay-level"
    w = yaml.safe_load((REPO / "function-configs" / "alternatives" / "bucket-snapshot-writer-partitioned.yaml").read_text())
    w["inputSpecs"] = {t["wticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    w.update(output=t["business"], name=f"dlpc-writer-{unique}")
    w["userConfig"].update(schedulingTopic=t["sched"], tickTopic=t["wticks"], tickMode="runner", tickTimeMillis=200,
                           schedulingTopicPartitions=PARTITIONS, partitionLeaseSeconds=5,
                           schedulingSubscription="writer")
    s = yaml.safe_load((REPO / "function-configs" / "delay-level-syncer.yaml").read_text())
    s["inputSpecs"] = {t["sticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    s.update(name=f"dlpc-syncer-{unique}", subName=f"dlpc-syncer-{unique}")
    s["userConfig"].update(delayLevelTopic=t["dl"], schedulingTopic=t["sched"], schedulingSubscription="writer",
                           partitionBy="SECONDS", unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=UNITS * UNIT_S,
                           lookaheadMillis=LOOKAHEAD_MS, tickTopic=t["sticks"], tickTimeMillis=200, tickMode="runner",
                           forwardBatchSize=100)  # smaller batches: more forwards in flight at a kill
    wp, sp = tmp_path / "writer.yaml", tmp_path / "syncer.yaml"
    wp.write_text(yaml.safe_dump(w))
    sp.write_text(yaml.safe_dump(s))
    return wp, sp, t


@pytest.mark.parametrize("kind", broker_kinds())
def test_syncer_sigkilled_mid_forward_into_partitioned_writer_once_never_early(request, tmp_path, kind):
    broker: CrashBroker = crash_broker(request, kind)
    unique = uuid.uuid4().hex[:8]  # short: state file names hold producer and topic names
    wcfg, scfg, t = _configs(tmp_path, unique)
    create_partitioned_topic(broker.admin_url, t["sched"], PARTITIONS)
    create_partitioned_topic(broker.admin_url, t["dl"], UNITS)

    def run(cfg: Path, name: str, *extra: str):
        return start_localrun(cfg, broker, tmp_path / f"data-{name}", tmp_path / f"{name}.log", *extra)

    procs = {"writer": run(wcfg, "writer", "--parallelism", "2"), "syncer": run(scfg, "syncer")}
    client = quiet_client(broker.service_url)
    counter = client.subscribe(t["business"], "count", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
    # The syncer's forwards as they land on the scheduling topic: a kill follows one at once.
    tap = client.subscribe(t["sched"], "tap", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1000)
    strategy = DelayLevelTopicPartitionStrategy(UNITS * UNIT_S, PartitionBy.SECONDS, unit_seconds=UNIT_S)
    producer = DelayLevelProducer(client, t["business"], DelayedProducer(client, scheduling_topic=t["sched"]),
                                  delay_level_topic=t["dl"], strategy=strategy, max_pending_messages=5000)
    count = ReleaseCount()
    rng = random.Random(41)
    kills: list = []
    forwards_seen = 0
    try:
        wait_subscribed(broker.admin_url, [partition_topic(t["dl"], k) for k in range(UNITS)]
                        + [partition_topic(t["sched"], k) for k in range(PARTITIONS)], timeout=90)
        failed = []
        for i in range(N):
            # Parked (>= one unit), due from 4 s to 24 s: forwards flow for about 20 s.
            delay = rng.randint(2 * UNIT_S * 1000, UNITS * UNIT_S * 1000 - 100)
            producer.send_async(f"m{i}".encode(), lambda res, mid, i=i: failed.append(i) if res != pulsar.Result.Ok else None,
                                delay_ms=delay, key=f"k{i}" if i % 2 else None)
        producer.flush()
        assert not failed, f"{len(failed)} sends failed"
        sent_at = now_ms()
        for kill_at_s in (6.0, 13.0)[:KILLS]:
            count.pump(counter, max(0.0, kill_at_s - (now_ms() - sent_at) / 1000.0))
            while True:  # the next forward seen on the scheduling topic: the syncer is mid-forward
                m = tap.receive(timeout_millis=30000)
                tap.acknowledge(m)
                if ORIGIN_MSG_ID_PROP in m.properties():
                    forwards_seen += 1
                    break
            sigkill(procs["syncer"])
            kills.append(now_ms() - sent_at)
            procs["syncer"] = run(scfg, "syncer")
        count.pump(counter, max(0.0, (sent_at + UNITS * UNIT_S * 1000 - now_ms()) / 1000.0) + 60, until=N)
        count.pump(counter, 3)  # a copy released late shows up here
    finally:
        producer.close()
        stop_all(procs.values())
        client.close()
    per_partition = {k: topic_stats(broker.admin_url, partition_topic(t["sched"], k)).get("msgInCounter", 0)
                     for k in range(PARTITIONS)}
    print(f"\npartitioned chain: n={N} released={len(count.seen)} syncer SIGKILLs at {kills} ms after sending; "
          f"scheduling partitions' msgIn {per_partition}")
    assert all(per_partition.values()), f"every scheduling partition carried forwards: {per_partition}"
    count.assert_exactly_once_never_early([f"m{i}".encode() for i in range(N)], where=f"; logs in {tmp_path}")
