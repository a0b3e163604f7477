"""DedupPublisher on partitioned topics (real Apache Pulsar: pulsar-lite cannot create one).

Each message goes to one partition: a keyed one to the partition a Java producer with the default
JavaStringHash picks for its key, an unkeyed one by its sequence id; it is de-duplicated there,
across a restart, and a partition count that grows between a send and its replay neither loses
nor doubles.
"""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Dict, Tuple

import pulsar
import pytest
from tests.support.crash_runs import create_partitioned_topic, grow_partitioned_topic

from pulsar_lifecycle.dedup import PRODUCER_PROPERTY, SEQUENCE_PROPERTY, DedupPublisher, Outcome, OutMessage
from pulsar_lifecycle.dedup.partition_router import java_string_hash, murmur3_32_hash
from pulsar_lifecycle.state.directory import DirectoryStateStore
from pulsar_lifecycle.topics import partition_name

pytestmark = [pytest.mark.integration, pytest.mark.pulsar_only("pulsar-lite cannot create a partitioned topic")]

NAME = "public/default/dedup-partitioned-0-release"


def make_client(url: str) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def read_partitions(url: str, topic: str, partitions: int, expected: int, *, limit_s: float = 60.0,
                    quiet_s: float = 1.5) -> Dict[Tuple[int, int], int]:
    """(partition, seq) -> copies, read from each partition by name (bounded in time)."""
    client = make_client(url)
    seen: Counter = Counter()
    try:
        consumers = [client.subscribe(partition_name(topic, p), f"count-{time.monotonic_ns()}",
                                      initial_position=pulsar.InitialPosition.Earliest,
                                      consumer_type=pulsar.ConsumerType.Shared) for p in range(partitions)]
        deadline = time.monotonic() + limit_s
        idle_since = None
        while time.monotonic() < deadline:
            got = False
            for p, c in enumerate(consumers):
                try:
                    msg = c.receive(50)
                except pulsar.Timeout:
                    continue
                got = True
                assert msg.properties()[PRODUCER_PROPERTY] == NAME
                seen[(p, int(msg.properties()[SEQUENCE_PROPERTY]))] += 1
                c.acknowledge(msg)
            if got:
                idle_since = None
            elif sum(seen.values()) >= expected:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= quiet_s:
                    break
    finally:
        client.close()
    return dict(seen)


def test_keyed_and_unkeyed_messages_go_to_one_partition_each_once(broker, unique, tmp_path: Path) -> None:
    topic = f"persistent://public/default/dp-{unique}"
    create_partitioned_topic(broker.admin_url, topic, 4)
    client = make_client(broker.service_url)
    keys = {s: (f"order-{s % 13}" if s % 2 else None) for s in range(1, 201)}
    try:
        pub = DedupPublisher(client, NAME, DirectoryStateStore(tmp_path / "state", "public", "default", "dp"))
        assert pub.partitions(topic) == 4
        msgs = [OutMessage(f"m{s}".encode(), s, None, keys[s]) for s in range(1, 201)]
        assert pub.publish_many(topic, msgs) == [Outcome.SENT] * 200
        # Again, all at once and one by one: every one a duplicate on its own partition.
        assert pub.publish_many(topic, msgs[100:]) == [Outcome.DUPLICATE] * 100
        assert pub.publish(topic, b"again", 7, partition_key=keys[7]) is Outcome.DUPLICATE
        pub.flush(30)
        for s in (1, 2, 199, 200):
            dest = pub.destination(topic, s, keys[s])
            assert pub.persisted_seq(dest) >= s
        pub.close()
    finally:
        client.close()
    seen = read_partitions(broker.service_url, topic, 4, 200)
    assert sorted(s for _, s in seen) == list(range(1, 201)), "each id once, in one partition"
    assert set(seen.values()) == {1}
    where = {s: p for p, s in seen}
    for s, key in keys.items():
        if key:
            assert where[s] == java_string_hash(key) % 4, f"key {key} not where a Java producer sends it"
    unkeyed = Counter(where[s] for s, k in keys.items() if not k)
    assert len(unkeyed) == 4 and min(unkeyed.values()) >= 10, unkeyed


def test_murmur3_setting_routes_keys_like_a_murmur3_java_producer(broker, unique, tmp_path: Path) -> None:
    topic = f"persistent://public/default/dpm-{unique}"
    create_partitioned_topic(broker.admin_url, topic, 3)
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, DirectoryStateStore(tmp_path / "state", "public", "default", "dpm"),
                             key_hashing="murmur3_32")
        pub.publish_many(topic, [OutMessage(b"x", s, None, f"k{s}") for s in range(1, 31)])
        pub.close()
    finally:
        client.close()
    seen = read_partitions(broker.service_url, topic, 3, 30)
    assert {s: p for p, s in seen} == {s: murmur3_32_hash(f"k{s}") % 3 for s in range(1, 31)}


def test_growth_between_a_send_and_its_replay_neither_loses_nor_doubles(broker, unique, tmp_path: Path) -> None:
    """Ids 1-150 sent over 2 partitions, then the process dies before its caller committed; the
    topic grows to 5 partitions; the restarted publisher replays 1-150 and goes on to 300. The
    replayed ids are routed as before (dropped as duplicates); new ids spread over 5."""
    topic = f"persistent://public/default/dpg-{unique}"
    create_partitioned_topic(broker.admin_url, topic, 2)
    store = DirectoryStateStore(tmp_path / "state", "public", "default", "dpg")
    keys = {s: (f"cust-{s % 17}" if s % 3 == 0 else None) for s in range(1, 301)}
    msgs = [OutMessage(f"m{s}".encode(), s, None, keys[s]) for s in range(1, 301)]
    crashed = make_client(broker.service_url)
    pub = DedupPublisher(crashed, NAME, store, snapshot_interval=10_000)
    pub.publish_many(topic, msgs[:150])
    pub.flush(30)
    crashed.close()  # no close(): no final snapshot, as after SIGKILL
    grow_partitioned_topic(broker.admin_url, topic, 5)
    client = make_client(broker.service_url)
    try:
        pub2 = DedupPublisher(client, NAME, store)
        assert pub2.publish_many(topic, msgs[:150]) == [Outcome.DUPLICATE] * 150
        assert pub2.partitions(topic) == 5
        assert pub2.publish_many(topic, msgs[150:]) == [Outcome.SENT] * 150
        pub2.close()
    finally:
        client.close()
    seen = read_partitions(broker.service_url, topic, 5, 300)
    assert sorted(s for _, s in seen) == list(range(1, 301))
    assert set(seen.values()) == {1}
    where = {s: p for p, s in seen}
    assert {where[s] for s in range(1, 151)} <= {0, 1}
    assert {where[s] for s in range(151, 301)} == {0, 1, 2, 3, 4}
    for s in range(151, 301):
        if keys[s]:
            assert where[s] == java_string_hash(keys[s]) % 5
