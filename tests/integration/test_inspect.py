"""`pulsar-lifecycle inspect writer|syncer|deletion` against running functions on a broker, and
its errors (one line, before connecting)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_PARTITION_PROP
from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.model import TopicRef
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.broker import free_port
from pulsar_lifecycle.runtime.client import quiet_client, receive_messages
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.broker_fixtures import kind_of
from support.cli import assert_no_client_log_lines, assert_one_line_error, run_cli, run_json
from support.helpers import wait_for
from support.paths import REPO

BYTES = {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}


def write_config(tmp_path: Path, name: str, cfg: Dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def writer_config(tmp_path: Path, unique: str, **user: Any) -> Tuple[Path, Dict[str, Any]]:
    """The shipped writer config with this test's topics (tick topic the only input, runner ticks)."""
    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    ticks = f"persistent://public/default/ticks-{unique}"
    cfg["inputSpecs"] = {ticks: BYTES}
    cfg["output"] = f"persistent://public/default/released-{unique}"
    cfg["name"] = f"writer-{unique}"
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=ticks, tickMode="runner", tickTimeMillis=200,
                             schedulingTopic=f"persistent://public/default/sched-{unique}", **user)
    return write_config(tmp_path, "writer", cfg), cfg


def start(broker: Any, cfg: Dict[str, Any], data_dir: Path, state_url: Any = None) -> LocalRunner:
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=data_dir, state_storage_service_url=state_url)
    return LocalRunner(spec_from_config(cfg), opts).start()


def _inspect_writer_flow(broker: Any, tmp_path: Path, unique: str, state_url: Any = None, **user: Any) -> None:
    path, cfg = writer_config(tmp_path, unique, maxUnackedPerBucket=3, **user)
    data = tmp_path / "data"
    runner = start(broker, cfg, data, state_url)
    extra = ["--state-storage-service-url", state_url] if state_url else []
    client = quiet_client(broker.service_url)
    producer = DelayedProducer(client, scheduling_topic=cfg["userConfig"]["schedulingTopic"])
    try:
        t0 = now_ms()
        far = [producer.send(cfg["output"], f"far-{i}".encode(), t0 + 3_600_000 + i * 1000) for i in range(5)]
        producer.send(cfg["output"], b"near", t0 + 300)
        producer.cancel(far[0])
        assert [m.data() for m in receive_messages(client, cfg["output"], "check", 1, 30)] == [b"near"]
        args = ["inspect", "writer", "--function-config-file", str(path), "--data-dir", str(data), "--json", *extra]
        seen: Dict[str, Any] = {}

        def indexed() -> bool:  # while the writer runs
            seen.update(run_json(*args, tmp_path=tmp_path))
            idx = seen["indexes"][0]["index"]
            return idx["pending"] == 5 and idx["cancelled"] == 1
        assert wait_for(indexed, timeout=60, interval=0.5), seen
        idx = seen["indexes"][0]["index"]
        assert idx["next_release_ms"] == t0 + 3_600_000  # a cancelled message keeps its turn
        assert idx["oldest_pending"] == f"{far[0].ledger_id()}:{far[0].entry_id()}:{max(0, far[0].batch_index())}"
        sealed = [b for b in idx["buckets"] if b["sealed"]]
        assert sealed and all(b["snapshot_bytes"] > 0 for b in sealed)
        assert sum(b["pending"] for b in idx["buckets"]) == 5
        assert seen["indexes"][0]["identity_ok"] is True
        human = run_cli(*args[:-1 - len(extra)], *extra, tmp_path=tmp_path)
        assert human.returncode == 0 and "5 pending" in human.stdout and "dedup watermark" in human.stdout, human.stderr
        assert_no_client_log_lines(human)
    finally:
        producer.close()
        client.close()
        runner.stop()
    stopped = run_json(*args, tmp_path=tmp_path)["indexes"][0]
    assert stopped["index"]["pending"] == 5
    # the release publisher's dedup snapshot (written at close) follows the index
    assert stopped["dedup"]["highest_seq"] == stopped["index"]["committed_seq"] > 0
    assert stopped["dedup"]["index_id"] == stopped["index"]["index_id"]


def test_inspect_writer_directory_store_while_running_and_stopped(broker, tmp_path, unique):
    _inspect_writer_flow(broker, tmp_path, unique)


@pytest.mark.pulsar_only("the BookKeeper table service runs in the real Pulsar standalone")
def test_inspect_writer_bookkeeper_store_and_state(broker, tmp_path, unique):
    url = broker.state_storage_url
    _inspect_writer_flow(broker, tmp_path, unique, state_url=url, snapshotStorage="bookkeeper",
                         snapshotStorageServiceUrl=url)


def test_inspect_writer_errors_are_one_line(tmp_path):
    path, _ = writer_config(tmp_path, "none")
    assert_one_line_error(run_cli("inspect", "writer", "--function-config-file", str(path), "--data-dir",
                                  str(tmp_path / "empty"), tmp_path=tmp_path), "no bucket snapshot store at")
    syncer = REPO / "function-configs" / "delay-level-syncer.yaml"
    assert_one_line_error(run_cli("inspect", "writer", "--function-config-file", str(syncer), tmp_path=tmp_path),
                          "not a BucketSnapshotWriter config")
    assert_one_line_error(run_cli("inspect", "writer", tmp_path=tmp_path), "function-configs/bucket-snapshot-writer.yaml",
                          "not found")
    assert_one_line_error(run_cli("inspect", "writer", "--function-config-file", str(path),
                                  "--state-storage-service-url", "http://x:1", tmp_path=tmp_path), "bk://")


def _ensure_partitioned(broker: Any, topic: str, partitions: int) -> None:
    if kind_of(broker) == "pulsar":
        admin = PulsarAdminClient.connect([broker.admin_url])
        try:
            admin.create_partitioned_topic(TopicRef.parse(topic), partitions)
        finally:
            admin.close()


def test_inspect_syncer_counts_parked_messages_and_next_forward(broker, tmp_path, unique):
    ns = "persistent://public/default"
    business, sched, ticks = f"{ns}/orders-{unique}", f"{ns}/sched-{unique}", f"{ns}/sticks-{unique}"
    dl = f"{business}-delay-level"
    unit_s, max_s = 10, 120
    cfg = load_function_config(REPO / "function-configs" / "delay-level-syncer.yaml")
    cfg.update(name=f"syncer-{unique}", subName=f"syncer-{unique}", inputSpecs={ticks: BYTES})
    cfg["userConfig"] = dict(cfg["userConfig"], delayLevelTopic=dl, schedulingTopic=sched, partitionBy="SECONDS",
                             unitSeconds=unit_s, messageMaximumDelayTimeSeconds=max_s, lookaheadMillis=1000,
                             tickTopic=ticks, tickMode="runner", tickTimeMillis=200, partitionDiscoverySeconds=0)
    path = write_config(tmp_path, "syncer", cfg)
    strategy = DelayLevelTopicPartitionStrategy(max_s, PartitionBy.SECONDS, unit_seconds=unit_s)
    _ensure_partitioned(broker, dl, strategy.partitions)
    data = tmp_path / "data"
    runner = start(broker, cfg, data)
    client = quiet_client(broker.service_url)
    watch = client.subscribe(sched, "watch", consumer_type=pulsar.ConsumerType.Shared,
                             initial_position=pulsar.InitialPosition.Earliest)
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched),
                                  delay_level_topic=dl, strategy=strategy)
    args = ["inspect", "syncer", "--function-config-file", str(path), "--service-url", broker.service_url,
            "--data-dir", str(data), "--json"]
    if kind_of(broker) == "pulsar":
        args += ["--admin-url", broker.admin_url]
    try:
        t0 = now_ms()
        sent = {d: producer.send(f"in-{d}s".encode(), deliver_at_ms=t0 + d * 1000) for d in (13, 35, 55, 56)}
        t1 = now_ms()
        assert [sent[d].partition for d in (13, 35, 55, 56)] == [0, 2, 4, 4]
        forwarded = []

        def forwarded_one() -> bool:
            try:
                m = watch.receive(timeout_millis=200)
            except pulsar.Timeout:
                return False
            watch.acknowledge(m)
            if ORIGIN_PARTITION_PROP in m.properties():
                forwarded.append(m.data())
            return bool(forwarded)
        assert wait_for(forwarded_one, timeout=45, interval=0), "the 13 s message was not forwarded"
        assert forwarded == [b"in-13s"]
        report: Dict[str, Any] = {}

        def settled() -> bool:
            report.update(run_json(*args, tmp_path=tmp_path))
            return {p["partition"]: p["parked"] for p in report["partitions"]}.get(0) == 0
        assert wait_for(settled, timeout=30, interval=0.5), report
        parts = {p["partition"]: p for p in report["partitions"]}
        assert len(parts) == strategy.partitions
        assert {k: p["parked"] for k, p in parts.items() if p["parked"]} == {2: 1, 4: 2}
        assert report["parked"] == 3
        assert parts[0]["last_forwarded"] is not None and parts[2]["last_forwarded"] is None
        assert all(p["parked_source"] == ("admin-backlog" if kind_of(broker) == "pulsar" else "reader")
                   for p in parts.values())
        # partition 2's head (35 s) leaves one lookahead before its slice ends: base + 3 units - 1 s
        assert t0 + 29_000 <= parts[2]["next_forward_ms"] <= t1 + 29_000
        assert parts[2]["next_deliver_at_ms"] == t0 + 35_000
        assert report["next_forward_ms"] == parts[2]["next_forward_ms"]
    finally:
        producer.close()
        client.close()
        runner.stop()


def test_inspect_deletion_counts_pending_retries_and_dead_letters(broker, tmp_path, unique):
    name = f"dl_{unique}".replace(".", "_")
    topics = DeletionTopics(namespace="public/default", topic_name=name, parallelism=4)
    cfg = load_function_config(REPO / "function-configs" / "ledger-deletion-worker.yaml")
    cfg.update(name=f"worker-{unique}", subName=f"worker-{unique}", inputs=topics.input_topics())
    cfg["userConfig"] = dict(cfg["userConfig"], deletionNamespace="public/default", deletionTopicName=name)
    path = write_config(tmp_path, "worker", cfg)
    args = ["inspect", "deletion", "--function-config-file", str(path), "--service-url", broker.service_url, "--json"]
    client = quiet_client(broker.service_url)
    try:
        if kind_of(broker) == "pulsar":
            for base in (topics.deletion_topic(None), topics.retry_topic(None)):
                _ensure_partitioned(broker, base, topics.parallelism)
            for topic in topics.input_topics():  # the worker's subscription, as if it had run
                client.subscribe(topic, cfg["subName"], initial_position=pulsar.InitialPosition.Earliest).close()
            args += ["--admin-url", broker.admin_url]
        for ledger in (11, 12, 13):
            res = run_cli("deletion", "enqueue", "--service-url", broker.service_url, "--namespace", "public/default",
                          "--topic-name", name, "--topic", f"public/default/owner-{unique}", "--ledger-id", str(ledger),
                          "--send-delay-seconds", "0", tmp_path=tmp_path)
            assert res.returncode == 0, res.stderr[-2000:]
            assert_no_client_log_lines(res)
        client.create_producer(topics.retry_partition(1)).send(b"retry")
        dlq = client.create_producer(topics.dlq_topic(None))
        dlq.send(b"dead-1")
        dlq.send(b"dead-2")
        report = run_json(*args, tmp_path=tmp_path)
    finally:
        client.close()
    assert (report["pending"], report["retries"], report["dead_letters"]) == (3, 1, 2)
    sources = {t["kind"]: t["source"] for t in report["topics"]}
    assert sources["pending"] == ("admin-backlog" if kind_of(broker) == "pulsar" else "stored")
    human = run_cli(*args[:-1] if "--admin-url" not in args else [a for a in args if a != "--json"], tmp_path=tmp_path)
    assert human.returncode == 0 and "3 pending, 1 retries, 2 dead letters" in human.stdout, human.stderr


def test_inspect_syncer_and_deletion_errors_are_one_line_before_connecting(tmp_path, silent_broker):
    dead = f"pulsar://127.0.0.1:{free_port()}"
    assert_one_line_error(run_cli("inspect", "syncer", "--service-url", "http://127.0.0.1:1", tmp_path=tmp_path,
                                  cwd=REPO), "--service-url", "not a broker service URL")
    assert_one_line_error(run_cli("inspect", "deletion", "--service-url", dead, "--admin-url", "ftp://x",
                                  tmp_path=tmp_path, cwd=REPO), "--admin-url")
    writer = REPO / "function-configs" / "bucket-snapshot-writer.yaml"
    assert_one_line_error(run_cli("inspect", "syncer", "--function-config-file", str(writer), "--service-url", dead,
                                  tmp_path=tmp_path), "not a DelayLevelSyncer config")
    assert_one_line_error(run_cli("inspect", "deletion", "--service-url", dead, "--connect-timeout", "1",
                                  tmp_path=tmp_path, cwd=REPO), dead, "refused the connection")
    res = run_cli("inspect", "deletion", "--service-url", silent_broker.url, "--connect-timeout", "2",
                  tmp_path=tmp_path, cwd=REPO)
    assert_one_line_error(res, silent_broker.url, "did not answer")
