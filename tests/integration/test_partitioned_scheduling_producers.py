"""Every producer of the shipped system into a partitioned writer's scheduling topic (issue 41,
item 2): `DelayedProducer` (the broker's partitions, through pulsar-client's message router),
`delayed send` (the writer config's `schedulingTopicPartitions`, partitions by name) and the
deletion service's phase-one delay, keyed and unkeyed, into a 4-partition scheduling topic read
by two writer instances. Each keyed message lands on the partition Java's JavaStringHash gives
its key, unkeyed ones spread; every message is released once and none early; cancels of
messages on different partitions reach that partition's writer and are answered on its reply
topic, through the library and through `delayed cancel`.

Real Pulsar only for the partitioned topic itself (pulsar-lite cannot create one); the by-name
path runs on pulsar-lite too."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List

import pulsar
import pytest
import yaml

from pulsar_lifecycle.dedup.partition_router import java_string_hash
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType
from pulsar_lifecycle.deletion.service import LedgerDeletionService
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduling_protocol import CANCEL_OUTCOME_PROP, MessageRef
from pulsar_lifecycle.timing import DelayedProducer
from support.broker_fixtures import kind_of
from support.cli import run_cli
from support.crash_runs import ReleaseCount, create_partitioned_topic, topic_stats
from support.helpers import shipped_writer_spec, wait_for

pytestmark = [pytest.mark.integration]
PARTITIONS = 4
CANCELLED = ("k-b", "u-2")  # `delayed cancel` of a keyed and an unkeyed message
UNKEYED_DUE_MS = 25_000  # the unkeyed messages' delay, one of which per partition is cancelled


def _start_writer(broker: Any, tmp_path: Path, unique: str) -> tuple:
    """(runner, spec, scheduling topic, writer config file): the writer over 4 scheduling
    partitions, two instances; on real Pulsar the scheduling topic is created partitioned first."""
    spec, sched = shipped_writer_spec(unique[-8:], "ps-", schedulingTopicPartitions=PARTITIONS,
                                      partitionLeaseSeconds=5)
    if kind_of(broker) == "pulsar":
        create_partitioned_topic(broker.admin_url, sched, PARTITIONS)
    spec.parallelism = 2
    spec.input_specs[next(iter(spec.input_specs))]["receiverQueueSize"] = 1
    cfg_file = tmp_path / "writer.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "name": spec.name, "className": "bucket_snapshot_writer.BucketSnapshotWriter",
        "inputSpecs": {t: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}
                       for t in spec.input_specs},
        "output": spec.output, "parallelism": 2, "processingGuarantees": "MANUAL",
        "userConfig": dict(spec.user_config)}))
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url,
                                               data_dir=tmp_path / "data")).start()
    return runner, spec, sched, cfg_file


def _read_answer(reader: Any, cancel_id: Any, timeout_s: float = 20.0) -> str:
    """The writer's outcome for the cancel with id `cancel_id` on a reply topic reader."""
    want = MessageRef.of(cancel_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            m = reader.read_next(timeout_millis=500)
        except pulsar.Timeout:
            continue
        origin = MessageRef.parse(m.properties().get("__pl_origin_msg_id__", "0:0:-1"))
        if (origin.ledger_id, origin.entry_id) == (want.ledger_id, want.entry_id):
            return m.properties()[CANCEL_OUTCOME_PROP]
    return "no answer"


@pytest.mark.pulsar_only("a partitioned scheduling topic: pulsar-lite cannot create partitioned topics")
def test_delayed_producer_routes_keyed_and_unkeyed_per_partition_and_cancels_where_the_message_is(
        broker, tmp_path, unique):
    runner, spec, sched, _cfg = _start_writer(broker, tmp_path, unique)
    client = quiet_client(broker.service_url)
    producer = DelayedProducer(client, scheduling_topic=sched)  # the broker's 4 partitions
    target = f"persistent://public/default/ps-orders-{unique[-8:]}"
    try:
        out = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest)
        now = int(time.time() * 1000)
        keyed: Dict[bytes, pulsar.MessageId] = {}
        unkeyed: Dict[bytes, pulsar.MessageId] = {}
        for i in range(24):
            keyed[f"keyed-{i}".encode()] = producer.send(target, f"keyed-{i}".encode(), now + 3000 + 50 * i,
                                                         key=f"customer-{i}")
            unkeyed[f"plain-{i}".encode()] = producer.send(target, f"plain-{i}".encode(),
                                                           now + UNKEYED_DUE_MS + 50 * i)
        for i, mid in enumerate(keyed.values()):
            assert mid.partition() == java_string_hash(f"customer-{i}") % PARTITIONS, (i, mid.partition())
        assert {mid.partition() for mid in unkeyed.values()} == set(range(PARTITIONS))
        # Cancel one unkeyed message on each partition (due 25 s from now or later: the four
        # cancels and their answers take seconds on a loaded host), each answered on the reply
        # topic of the partition that holds it.
        victims = {}
        for payload, mid in unkeyed.items():
            victims.setdefault(mid.partition(), (payload, mid))
        assert sorted(victims) == list(range(PARTITIONS))
        for k, (payload, mid) in victims.items():
            reply = producer.cancel_reply_topic(mid)
            assert reply == f"{sched}-partition-{k}-CANCEL-REPLY"
            reader = client.create_reader(reply, pulsar.MessageId.earliest)
            try:
                cancel_id = producer.cancel(mid, reply_to=reply)
                assert cancel_id.partition() in (-1, k)
                answer = _read_answer(reader, cancel_id)
                assert answer == "cancelled", (k, payload, f"answered {int(time.time() * 1000) - now} ms after the "
                                               f"sends; the message was due {UNKEYED_DUE_MS} ms or later after them")
            finally:
                reader.close()
        expected = set(keyed) | set(unkeyed)
        expected -= {payload for payload, _ in victims.values()}
        count = ReleaseCount()
        count.pump(out, 40, until=len(expected))
        count.pump(out, 2)  # a duplicate or a cancelled message would show up here
        count.assert_exactly_once_never_early(expected)
        for k in range(PARTITIONS):  # every partition took messages
            assert topic_stats(broker.admin_url, f"{sched}-partition-{k}").get("msgInCounter", 0) > 0
    finally:
        producer.close()
        client.close()
        runner.stop()


def _cli_send(service_url: str, cfg_file: Path, tmp_path: Path, target: str, payload: str, *extra: str) -> str:
    # The ones cancelled later are due later: each CLI run takes a second or two on real Pulsar.
    res = run_cli("delayed", "send", target, payload, "--in", "25s" if payload in CANCELLED else "4s", "--service-url", service_url,
                  "--writer-config", str(cfg_file), "--syncer-config", "none", *extra, tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def test_delayed_send_and_cancel_through_the_partitions_the_writer_reads(broker, tmp_path, unique):
    """`delayed send` routes by the writer config's schedulingTopicPartitions (by name: pulsar-lite
    has no partitioned topics); `delayed cancel` of a message on partition k is answered by k's writer."""
    _send_and_cancel_via_cli(broker, tmp_path, unique)


@pytest.mark.pulsar_only("the same into a partitioned topic the broker has (the module runs on pulsar-lite otherwise)")
def test_delayed_send_and_cancel_into_a_partitioned_scheduling_topic(broker, tmp_path, unique):
    _send_and_cancel_via_cli(broker, tmp_path, unique)


def _send_and_cancel_via_cli(broker: Any, tmp_path: Path, unique: str) -> None:
    runner, spec, sched, cfg_file = _start_writer(broker, tmp_path, unique)
    client = quiet_client(broker.service_url)
    target = f"persistent://public/default/ps-cli-{unique[-8:]}"
    try:
        out = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest)
        ids: Dict[str, str] = {}
        for name, extra in (("k-a", ["--key", "alpha"]), ("k-b", ["--key", "bravo"]), ("k-c", ["--key", "charlie"]),
                            ("u-1", []), ("u-2", [])):
            ids[name] = _cli_send(broker.service_url, cfg_file, tmp_path, target, name, *extra)
        for name, key in (("k-a", "alpha"), ("k-b", "bravo"), ("k-c", "charlie")):
            assert ids[name].endswith(f"@{java_string_hash(key) % PARTITIONS}"), (name, ids[name])
        assert all("@" in i for i in ids.values()), ids
        # Cancel a keyed and an unkeyed message: each on its own partition, each answered.
        cancelled: List[str] = []
        for name in CANCELLED:
            res = run_cli("delayed", "cancel", ids[name], "--service-url", broker.service_url,
                          "--writer-config", str(cfg_file), tmp_path=tmp_path)
            assert res.returncode == 0 and "cancelled" in res.stdout, (name, ids[name], res.stdout, res.stderr[-2000:])
            cancelled.append(name)
        count = ReleaseCount()
        expected = {n.encode() for n in ids if n not in cancelled}
        count.pump(out, 40, until=len(expected))
        count.pump(out, 2)
        count.assert_exactly_once_never_early(expected)
    finally:
        client.close()
        runner.stop()


@pytest.mark.pulsar_only("a partitioned scheduling topic: pulsar-lite cannot create partitioned topics")
def test_the_deletion_services_delay_goes_through_a_partitioned_scheduling_topic(broker, tmp_path, unique):
    runner, spec, sched, _cfg = _start_writer(broker, tmp_path, unique)
    client = quiet_client(broker.service_url)
    topics = DeletionTopics(namespace="public/default", topic_name=f"ps-del-{unique[-8:]}", parallelism=2)
    delayed = DelayedProducer(client, scheduling_topic=sched)
    service = LedgerDeletionService(client, topics=topics, delayed=delayed, send_delay_seconds=2)
    consumers = [client.subscribe(topics.deletion_partition(k), "check", consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest) for k in range(2)]
    try:
        sent_at = int(time.time() * 1000)
        ids = [service.append_pending_delete_ledger(f"persistent://public/default/owner-{i}", 1000 + i, None,
                                                    LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER)
               for i in range(8)]
        assert all(0 <= mid.partition() < PARTITIONS for mid in ids)
        assert len({mid.partition() for mid in ids}) > 1  # unkeyed: spread over the partitions
        got: List[pulsar.Message] = []

        def arrived() -> bool:
            for c in consumers:
                try:
                    m = c.receive(timeout_millis=100)
                except pulsar.Timeout:
                    continue
                got.append(m)
                c.acknowledge(m)
            return len(got) >= len(ids)
        assert wait_for(arrived, timeout=40), len(got)
        assert all(int(m.properties()["__pl_released_at__"]) >= sent_at + 2000 for m in got)
    finally:
        service.close()
        delayed.close()
        client.close()
        runner.stop()
