"""DelayLevelProducer + DelayLevelSyncerService on the embedded broker (unit: 2 s)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import pulsar
import pytest

from pulsar_lifecycle.dedup.recovery import PRODUCER_PROPERTY
from pulsar_lifecycle.delaylevel import (
    DelayLevelTopicPartitionStrategy,
    DelayTooLongError,
    PartitionBy,
    ShrinkRefusedError,
)
from pulsar_lifecycle.delaylevel.admin import AdminView
from pulsar_lifecycle.delaylevel.config import parse_syncer_config
from pulsar_lifecycle.delaylevel.forwarder import ERROR_PROP
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_MSG_ID_PROP, ORIGIN_PARTITION_PROP, partition_topic
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.delaylevel.wiring import build_syncer
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP
from pulsar_lifecycle.state.directory import DirectoryStateStore
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from servers.pulsar_admin_server import PulsarAdminServer
from support.helpers import drain, receive_payloads, shipped_writer_spec, wait_for

pytestmark = pytest.mark.integration
UNIT_S = 2
LOOKAHEAD_MS = 500


def names(unique: str) -> Dict[str, str]:
    ns = "persistent://public/default"
    return {"business": f"{ns}/dl-biz-{unique}", "sched": f"{ns}/dl-sched-{unique}"}


def make_service(client: pulsar.Client, tmp_path: Path, topics: Dict[str, str], *, admin: Optional[AdminView] = None,
                 metrics: Optional[Dict[str, float]] = None, instance: int = 0, **user: Any) -> DelayLevelSyncerService:
    cfg = parse_syncer_config({"delayLevelTopic": topics["business"] + "-delay-level", "schedulingTopic": topics["sched"],
                               "partitionBy": "SECONDS", "unitSeconds": UNIT_S, "messageMaximumDelayTimeSeconds": 20,
                               "lookaheadMillis": LOOKAHEAD_MS, "metricsIntervalSeconds": 1, **user})
    sink = metrics if metrics is not None else {}
    return DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="test-syncer",
                                   state=DirectoryStateStore(tmp_path / "state", "public", "default", "syncer"),
                                   record_metric=sink.__setitem__, admin=admin, instance=instance).start()


def make_producer(client: pulsar.Client, topics: Dict[str, str], max_s: int = 20) -> DelayLevelProducer:
    strategy = DelayLevelTopicPartitionStrategy(max_s, PartitionBy.SECONDS, unit_seconds=UNIT_S)
    return DelayLevelProducer(client, topics["business"], DelayedProducer(client, scheduling_topic=topics["sched"]),
                              delay_level_topic=topics["business"] + "-delay-level",
                              strategy=strategy)


@dataclass
class Env:
    """One test's topics, client and producer; services it starts are stopped after it."""

    topics: Dict[str, str]
    client: pulsar.Client
    producer: DelayLevelProducer
    tmp_path: Path
    services: List[DelayLevelSyncerService] = field(default_factory=list)

    def start(self, **kw: Any) -> DelayLevelSyncerService:
        service = make_service(self.client, self.tmp_path, self.topics, **kw)
        self.services.append(service)
        return service


@pytest.fixture
def env(broker, tmp_path, unique):
    e = Env(names(unique), quiet_client(broker.service_url), None, tmp_path)  # type: ignore[arg-type]
    e.producer = make_producer(e.client, e.topics)
    yield e
    for service in e.services:
        service.stop()
    e.producer.close()
    e.client.close()


def test_parked_messages_forwarded_on_time_with_everything_kept(env):
    topics, client, producer = env.topics, env.client, env.producer
    metrics: Dict[str, float] = {}
    start = now_ms()
    near = producer.send(b"near", delay_ms=500)
    later = producer.send(b"later", delay_ms=5000, properties={"app": "x"}, key="k1", event_timestamp=12345)
    soon = producer.send(b"soon", delay_ms=3000)
    cancelled = producer.send(b"cancelled", delay_ms=9000)
    past = producer.send(b"past", deliver_at_ms=start - 10_000)
    assert (near.partition, later.partition, soon.partition, cancelled.partition, past.partition) == (None, 1, 0, 3, None)
    assert later.topic == partition_topic(topics["business"] + "-delay-level", 1)
    with pytest.raises(DelayTooLongError, match="exceeds the maximum"):
        producer.send(b"too-long", delay_ms=20_001)
    producer.cancel(cancelled)
    service = env.start(metrics=metrics)
    got = drain(client, topics["sched"], "check", expect=4, timeout=14)
    # The cancelled one would be due at +7.5 s: wait past that, nothing more may come.
    got += drain(client, topics["sched"], "check", expect=1, timeout=max(0.5, (start + 9000 - now_ms()) / 1000))
    service_metrics = service.metrics()
    service.stop()
    by = {m.data(): m for m in got}
    assert sorted(by) == [b"later", b"near", b"past", b"soon"]  # cancelled one never forwarded
    assert service_metrics["pulsar_delay_level_cancelled_total"] == 1
    assert service_metrics["pulsar_delay_level_forwarded_total"] == 2
    assert metrics.get("pulsar_delay_level_partitions") == 10  # recorded through record_metric
    m = by[b"later"]
    props = m.properties()
    assert props[DELIVER_AT_PROP] == str(int(props[DELIVER_AT_PROP]))
    deliver_at = int(props[DELIVER_AT_PROP])
    assert start + 5000 <= deliver_at <= start + 5000 + 1000
    assert props[TARGET_PROP] == topics["business"] and props["app"] == "x"
    assert m.partition_key() == "k1" and m.event_timestamp() == 12345
    assert props[ORIGIN_PARTITION_PROP] == later.topic
    mid = later.message_id
    assert props[ORIGIN_MSG_ID_PROP].startswith(f"{mid.ledger_id()}:{mid.entry_id()}")
    assert props[PRODUCER_PROPERTY] == "test-syncer-p1"
    # Never before its forward time (publish + 2 units - lookahead; base is the producer's clock).
    assert m.publish_timestamp() >= deliver_at - 1000 - LOOKAHEAD_MS - 50
    assert by[b"soon"].publish_timestamp() >= int(by[b"soon"].properties()[DELIVER_AT_PROP]) - 1000 - LOOKAHEAD_MS
    # And it left the partition: a new consumer on the syncer's subscription finds nothing.
    assert drain(client, later.topic, "syncer", expect=1, timeout=1.5) == []


def test_restart_forwards_every_message_exactly_once(env):
    topics, client, producer = env.topics, env.client, env.producer
    n = 600
    for i in range(n):
        producer.send_async(f"m{i}".encode(), lambda res, _mid: None, delay_ms=2000 + (i % 3) * 10)
    producer.flush()
    time.sleep(1.6)  # due now (2 s unit - 0.5 s lookahead)
    # Pipelined (forwardPipelineDepth 2): batches sent but not yet acked at a stop come back too.
    for _ in range(3):  # stop mid-stream three times; the unacked rest is redelivered
        service = env.start(forwardBatchSize=50, forwardPipelineDepth=2)
        time.sleep(0.15)
        service.stop()
    service = env.start(forwardBatchSize=50, forwardPipelineDepth=2)
    got = drain(client, topics["sched"], "count", expect=n, timeout=15)
    got += drain(client, topics["sched"], "count", expect=1, timeout=1)  # no copies after the last
    service.stop()
    payloads = [m.data() for m in got]
    assert len(payloads) == n and len(set(payloads)) == n


def test_missing_business_topic_dead_lettered_and_backpressure(env):
    topics, client, producer = env.topics, env.client, env.producer
    with PulsarAdminServer() as admin_server:
        admin_server.policies["public/default"] = {"message_ttl_in_seconds": 5, "backlog_quota_map": {}}
        admin_server.backlogs[(topics["sched"], "writer")] = 50  # the writer lags
        other = topics["business"] + "-other"
        admin_server.topics.add(other)
        deleted = producer.send(b"to-deleted", delay_ms=2100)
        DelayLevelProducer(client, other, producer.near_term, strategy=producer.strategy,
                           delay_level_topic=producer.delay_level_topic).send(b"to-existing", delay_ms=2100)
        service = env.start(admin=AdminView.connect(admin_server.url, 60),
                               schedulingSubscription="writer", maxNearTermBacklog=10, backlogCheckIntervalMillis=100)
        time.sleep(3)  # both due after 1.6 s; held back while the writer lags
        held = drain(client, topics["sched"], "check", expect=1, timeout=0.5)
        held += drain(client, producer.delay_level_topic + "-DLQ", "check", expect=1, timeout=0.5)
        paused = service.metrics()
        admin_server.backlogs[(topics["sched"], "writer")] = 3  # the writer caught up
        dlq = drain(client, producer.delay_level_topic + "-DLQ", "check", expect=1, timeout=8)
        released = drain(client, topics["sched"], "check", expect=1, timeout=8)
        service.stop()
    assert [m.data() for m in dlq] == [b"to-deleted"]
    assert "does not exist" in dlq[0].properties()[ERROR_PROP]
    assert dlq[0].properties()[ORIGIN_PARTITION_PROP] == deleted.topic
    assert held == [] and paused["pulsar_delay_level_near_term_backlog"] == 50
    assert paused["pulsar_delay_level_retention_problems"] == 1  # TTL 5 s < max delay 20 s
    assert [m.data() for m in released] == [b"to-existing"]


def test_shrink_refused_while_a_removed_partition_has_parked_messages(env):
    producer = env.producer
    env.start().stop()  # 10 partitions remembered
    far = producer.send(b"far", delay_ms=19_000)
    assert far.partition == 8
    with pytest.raises(ShrinkRefusedError, match="partition 8 still holds parked messages"):
        env.start(messageMaximumDelayTimeSeconds=10)
    grown = env.start(messageMaximumDelayTimeSeconds=40)  # growing is fine
    assert len(grown.forwarders) == 20
    grown.stop()


def test_broker_backend_forwards_to_the_business_topic_with_deliver_at(env):
    # Real Pulsar delays it by deliver_at; pulsar-lite delivers at once, so this checks routing and content.
    topics, client, producer = env.topics, env.client, env.producer
    sent = producer.send(b"direct", delay_ms=2100, properties={"app": "y"})
    service = env.start(nearTermBackend="broker")
    got = drain(client, topics["business"], "check", expect=1, timeout=8)
    service.stop()
    assert [m.data() for m in got] == [b"direct"]
    props = got[0].properties()
    assert TARGET_PROP not in props and props["app"] == "y" and props[ORIGIN_PARTITION_PROP] == sent.topic
    assert got[0].publish_timestamp() >= int(props[DELIVER_AT_PROP]) - 1000 - LOOKAHEAD_MS - 50


def test_two_instances_split_the_partitions_and_each_applies_its_cancels(env):
    topics, client, producer = env.topics, env.client, env.producer
    a = producer.send(b"a", delay_ms=2100)
    b = producer.send(b"b", delay_ms=4100)
    gone = producer.send(b"gone", delay_ms=4200)
    producer.cancel(gone)
    assert (a.partition, b.partition, gone.partition) == (0, 1, 1)
    first, second = env.start(instances=2), env.start(instances=2, instance=1)
    assert ([f.k for f in first.forwarders][:3], [f.k for f in second.forwarders][:3]) == ([0, 2, 4], [1, 3, 5])
    got = drain(client, topics["sched"], "check", expect=2, timeout=10)
    got += drain(client, topics["sched"], "check", expect=1, timeout=1.5)
    assert sorted(m.data() for m in got) == [b"a", b"b"]
    assert second.metrics()["pulsar_delay_level_cancelled_total"] == 1
    with pytest.raises(ValueError, match="instance_id 2 is not below num_instances 2"):
        env.start(instances=2, instance=2)


def test_partitions_appended_by_a_grown_strategy_are_read_without_a_restart(env):
    # The syncer reads 10 partitions (20 s); a producer whose maximum grew to 40 s parks in 13.
    topics, client = env.topics, env.client
    service = env.start(partitionDiscoverySeconds=1, lookaheadMillis=30_000)  # forward as soon as read
    grown = make_producer(client, topics, max_s=40)
    try:
        far = grown.send(b"far", delay_ms=28_500)
        assert far.partition == 13
        got = drain(client, topics["sched"], "check", expect=1, timeout=10)
    finally:
        grown.close()
    assert [m.data() for m in got] == [b"far"]
    assert got[0].properties()[ORIGIN_PARTITION_PROP] == far.topic
    assert service.partitions == 14 and [f.k for f in service.forwarders][10:] == [10, 11, 12, 13]
    service.stop()
    # Remembered: a restart with the old strategy is refused while the new partitions hold messages.
    grown = make_producer(client, topics, max_s=40)
    try:
        assert grown.send(b"later", delay_ms=26_500).partition == 12
    finally:
        grown.close()
    with pytest.raises(ShrinkRefusedError, match="from 14 to 10 partitions: partition 12 still holds"):
        env.start()


def test_cancel_after_the_forward_reaches_the_writers_index(broker, tmp_path, unique):
    # Issue 11 gap 2: the cancel follows the message wherever it is. Here it was already
    # forwarded (and indexed by a real writer) when the cancel came: the writer must drop it.
    spec, sched = shipped_writer_spec(unique[-12:], "dlcx", snapshotDir=str(tmp_path / "snapshots"))
    business = spec.output
    topics = {"business": business, "sched": sched}
    client = quiet_client(broker.service_url)
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "w")).start()
    producer = make_producer(client, topics)
    released = client.subscribe(business, "check", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    watch = client.subscribe(sched, "watch", consumer_type=pulsar.ConsumerType.Shared,
                             initial_position=pulsar.InitialPosition.Earliest)
    service = make_service(client, tmp_path, topics, lookaheadMillis=3500)  # forwards 0.5 s after sending
    try:
        kept = producer.send(b"kept", delay_ms=4200)
        gone = producer.send(b"gone", delay_ms=4300)
        assert kept.partition == gone.partition == 1
        forwards = receive_payloads(watch, 2, timeout=5)  # both forwarded (and indexed) long before due
        assert sorted(forwards) == ["gone", "kept"]
        producer.cancel(gone)
        assert wait_for(lambda: service.metrics()["pulsar_delay_level_cancels_followed_total"] == 1, timeout=8)
        tombstones = receive_payloads(watch, 1, timeout=3)
        got = receive_payloads(released, 2, timeout=8)  # both due by now; only one may come
        got += receive_payloads(released, 1, timeout=1)
    finally:
        service.stop()
        runner.stop()
        producer.close()
        client.close()
    assert tombstones == [""] and got == ["kept"]


@dataclass
class SyncerContext:
    """The part of Pulsar's Context `build_syncer` reads; instances of one function share `state`
    (the function's state is per function, as Pulsar's table service keeps it)."""

    client: pulsar.Client
    user_config: Dict[str, Any]
    instance_id: int
    num_instances: int
    state: Dict[str, Any]

    def get_user_config_map(self) -> Dict[str, Any]:
        return self.user_config

    def get_function_tenant(self) -> str:
        return "public"

    def get_function_namespace(self) -> str:
        return "default"

    def get_function_name(self) -> str:
        return "syncer"

    def get_instance_id(self) -> int:
        return self.instance_id

    def get_num_instances(self) -> int:
        return self.num_instances

    def get_pulsar_client(self) -> pulsar.Client:
        return self.client

    def record_metric(self, name: str, value: float) -> None:
        pass

    def put_state(self, key: str, value: Any) -> None:
        self.state[key] = value

    def get_state(self, key: str) -> Any:
        return self.state.get(key)


def test_parallelism_1_to_2_moves_partitions_and_every_message_is_forwarded_once(env):
    """One instance forwards but never acks partition 1 (a crash between publish and ack), then
    the function runs with parallelism 2: instance 1 now owns partition 1, gets its messages
    redelivered and must recognise every one as forwarded (publishers are named per partition and
    their snapshots live in the function's shared state), while the two instances split the rest."""
    topics, client, producer = env.topics, env.client, env.producer
    user = {"delayLevelTopic": topics["business"] + "-delay-level", "schedulingTopic": topics["sched"],
            "partitionBy": "SECONDS", "unitSeconds": UNIT_S, "messageMaximumDelayTimeSeconds": 20,
            "lookaheadMillis": 30_000, "partitionDiscoverySeconds": 0}  # forward as soon as read
    state: Dict[str, Any] = {}
    single = build_syncer(SyncerContext(client, user, 0, 1, state))
    p1 = next(f for f in single.forwarders if f.k == 1)
    p1.consumer.acknowledge = lambda msg: None  # published, never acked (patched before anything is parked)
    try:
        first = [producer.send(f"a{i}".encode(), delay_ms=2100 + (i % 4) * 2000) for i in range(80)]
        assert {s.partition for s in first} == {0, 1, 2, 3}
        assert wait_for(lambda: single.metrics()["pulsar_delay_level_forwarded_total"] == 80, timeout=15)
    finally:
        single.stop()
    second = [producer.send(f"b{i}".encode(), delay_ms=2100 + (i % 4) * 2000) for i in range(80)]
    assert len(second) == 80
    pair = [build_syncer(SyncerContext(client, user, i, 2, state)) for i in range(2)]
    try:
        assert [[f.k for f in s.forwarders] for s in pair] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
        got = drain(client, topics["sched"], "check", expect=160, timeout=20)
        got += drain(client, topics["sched"], "check", expect=1, timeout=1.5)  # a copy would show here
        assert sorted(m.data() for m in got) == sorted([f"a{i}".encode() for i in range(80)] +
                                                       [f"b{i}".encode() for i in range(80)])
        # The 20 redelivered a-messages of partition 1 were recognised by instance 1, not re-sent.
        assert pair[1].metrics()["pulsar_delay_level_duplicates_total"] == 20
        assert pair[0].metrics()["pulsar_delay_level_duplicates_total"] == 0
    finally:
        for s in pair:
            s.stop()


def test_messages_another_consumer_holds_are_read_and_forwarded_first_and_once(env):
    """Another consumer of the syncer's subscription (a killed predecessor the broker has not
    dropped: pulsar-lite keeps a reset connection's consumers) holds a partition's first message,
    so the forwarder receives the later ones first. Nothing overtakes it: the later ones wait, and
    once the gap has stayed open GAP_READ_AFTER_S a Reader reads it, so all are forwarded in
    position order without waiting for the holder. When the holder lets go, its copy (if the
    forwarder's ack did not take it) is a redelivery of a handled position: dropped, never
    forwarded twice."""
    topics, client, producer = env.topics, env.client, env.producer
    sent = [producer.send(f"m{i}".encode(), delay_ms=2100) for i in range(8)]
    assert {s.partition for s in sent} == {0}
    other = client.subscribe(sent[0].topic, "syncer", consumer_type=pulsar.ConsumerType.Shared,
                             initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1)
    assert other.receive(timeout_millis=5000).data() == b"m0"
    service = env.start(lookaheadMillis=30_000, partitionDiscoverySeconds=0)  # due as soon as read
    got = drain(client, topics["sched"], "check", expect=8, timeout=10)  # while `other` still holds m0
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(8)]
    other.close()  # m0 goes back to the subscription (unless the forwarder's ack by position took it)
    assert drain(client, topics["sched"], "check", expect=1, timeout=3) == []  # no copy
    # Copies received later (the holder's, and under load the broker's redeliveries) are dropped.
    assert service.metrics()["pulsar_delay_level_forwarded_total"] == 8


def test_a_restart_after_a_cancel_starts_its_order_after_the_cancelled_position(env):
    """A cancelled message is acked without a forward, so the publisher's recovery cannot know it
    was handled: the forwarder records it before the ack. Without that record a restarted syncer
    would wait forever for that (acked) position before forwarding what follows it."""
    topics, client, producer = env.topics, env.client, env.producer
    first = producer.send(b"a", delay_ms=2100)
    cancelled = producer.send(b"b", delay_ms=2100)
    producer.cancel(cancelled)
    # No lookahead: "a" and "b" are forwarded when due (2.1 s after the send), so the syncer reads
    # the cancel first even when its start is slow; a cancel read after its target was forwarded is
    # followed to the writer instead (cancels_followed), and this scenario would not arise.
    user = {"lookaheadMillis": 0, "partitionDiscoverySeconds": 0}
    service = env.start(**user)
    got = drain(client, topics["sched"], "check", expect=1, timeout=30)
    assert service.metrics()["pulsar_delay_level_cancels_followed_total"] == 0
    assert wait_for(lambda: service.metrics()["pulsar_delay_level_cancelled_total"] == 1, timeout=30)
    service.stop()
    assert (first.partition, cancelled.partition) == (0, 0)
    producer.send(b"c", delay_ms=2100)
    env.start(**user)
    got += drain(client, topics["sched"], "check", expect=1, timeout=10)
    got += drain(client, topics["sched"], "check", expect=1, timeout=1)  # a copy would show here
    assert [m.data() for m in got] == [b"a", b"c"]
