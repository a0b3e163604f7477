"""Partition discovery against a broker that refuses partitions beyond a partitioned topic's
partition count, as Apache Pulsar does (NotAllowedError): a refused partition holds nothing, ends
the probe window, and a strategy beyond the topic stops the syncer with what to do. No broker:
a client double answers subscribe."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.delaylevel import PartitionRefusedError
from pulsar_lifecycle.delaylevel.config import parse_syncer_config
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.state.directory import DirectoryStateStore

DL = "persistent://public/default/biz-delay-level"


class EmptyProbe:
    """A consumer of an empty partition."""

    def __init__(self) -> None:
        self.closed = False

    def receive(self, timeout_millis: int) -> None:
        raise pulsar.Timeout("nothing parked")

    def close(self) -> None:
        self.closed = True


class PartitionedTopicClient:
    """Answers subscribe like Apache Pulsar for a delay-level topic of `partitions` partitions."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.asked: List[int] = []
        self.probes: List[EmptyProbe] = []

    def subscribe(self, topic: str, subscription: str, **_kw: object) -> EmptyProbe:
        k = int(topic.rsplit("-", 1)[1])
        self.asked.append(k)
        if k >= self.partitions:
            raise pulsar.NotAllowedError(f"Illegal topic partition name {topic} with max allowed {self.partitions} partitions")
        probe = EmptyProbe()
        self.probes.append(probe)
        return probe


def service(tmp_path: Path, client: PartitionedTopicClient, max_delay_s: int = 20) -> DelayLevelSyncerService:
    cfg = parse_syncer_config({"delayLevelTopic": DL, "schedulingTopic": "persistent://public/default/sched",
                               "partitionBy": "SECONDS", "unitSeconds": 2, "messageMaximumDelayTimeSeconds": max_delay_s,
                               "partitionDiscoverySeconds": 0})
    return DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="p",  # type: ignore[arg-type]
                                   state=DirectoryStateStore(tmp_path, "public", "default", "s"),
                                   record_metric=lambda _n, _v: None)


@pytest.mark.parametrize("topic_partitions, asked", [(10, [10]), (12, [10, 11, 12])])
def test_the_first_refused_partition_ends_the_probe_window(tmp_path, topic_partitions, asked):
    client = PartitionedTopicClient(topic_partitions)
    syncer = service(tmp_path, client)  # reads partitions 0-9
    assert syncer.discover_partitions() == []
    assert client.asked == asked  # one refusal per round, nothing probed beyond it
    assert all(p.closed for p in client.probes)
    assert syncer.partitions == 10


def test_a_refused_partition_holds_nothing_for_the_shrink_guard(tmp_path):
    assert service(tmp_path, PartitionedTopicClient(10))._has_backlog(12) is False  # the shrink guard's probe


def test_a_strategy_beyond_the_topic_names_the_partition_and_the_command(tmp_path):
    syncer = service(tmp_path, PartitionedTopicClient(10), max_delay_s=28)  # 14 partitions
    with pytest.raises(PartitionRefusedError, match=f"partition 10 of the delay-level topic {DL} .*"
                                                    f"update-partitioned-topic {DL} -p 14"):
        syncer._subscribe_partition(10, 200)  # how start() subscribes each partition
