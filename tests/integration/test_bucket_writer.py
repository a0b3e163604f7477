"""BucketSnapshotWriter through the local run mode on the real embedded broker."""
from __future__ import annotations

import time

import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.service import ERROR_PROP, RELEASED_AT_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, ORIGIN_MSG_ID_PROP, MessageRef
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import drain
from support.paths import REPO
from support.writer import INTAKES, start_writer, writer_spec

pytestmark = pytest.mark.integration
ROOT = REPO


@pytest.mark.parametrize("intake", INTAKES)
def test_messages_leave_on_time_with_payload_key_properties(broker, tmp_path, unique, intake):
    spec, sched = writer_spec(unique, tmp_path, intake)
    runner = start_writer(broker, tmp_path, spec)
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        base = now_ms()
        sent = {}
        for i in range(30):
            at = base + (i % 6) * 400  # 0..2 s, some already due
            mid = dp.send(spec.output, f"p{i}".encode(), at, properties={"k": str(i)}, key=f"key{i}",
                          event_timestamp=1_000_000 + i)
            sent[f"p{i}"] = (at, mid)
        got = drain(client, spec.output, "check", expect=30, timeout=30)
        arrival = time.time() * 1000
    finally:
        dp.close()
        runner.stop()
        client.close()
    assert sorted(m.data().decode() for m in got) == sorted(sent)
    for m in got:
        at, mid = sent[m.data().decode()]
        props = m.properties()
        i = props["k"]
        assert props[DELIVER_AT_PROP] == str(at)
        # The whole position of the scheduling message, batch index 0 included (issue 9 defect b:
        # DelayedProducer batches, so this was "<ledger>:<entry>:<partition>" without the ":0").
        assert props[ORIGIN_MSG_ID_PROP] == MessageRef(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index()).format()
        assert MessageRef.parse(props[ORIGIN_MSG_ID_PROP]).batch_index == mid.batch_index()
        assert m.partition_key() == f"key{i}" and m.event_timestamp() == 1_000_000 + int(i)
        assert int(props[RELEASED_AT_PROP]) >= at, f"released {at - int(props[RELEASED_AT_PROP])} ms early"
    assert arrival >= max(at for at, _ in sent.values())


@pytest.mark.parametrize("intake", INTAKES)
def test_cancel_and_invalid_messages(broker, tmp_path, unique, intake):
    spec, sched = writer_spec(unique, tmp_path, intake)
    runner = start_writer(broker, tmp_path, spec)
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    raw = client.create_producer(sched, batching_enabled=False)
    try:
        keep = dp.send_after(spec.output, b"keep", 1500)
        drop = dp.send_after(spec.output, b"drop", 1500)
        dp.cancel(drop)
        raw.send(b"no-time")                                      # missing deliver-at
        raw.send(b"negative", properties={DELIVER_AT_PROP: "-5"})  # malformed
        raw.send(b"far", properties={DELIVER_AT_PROP: str(now_ms() + 10**12)})  # beyond maxDelaySeconds
        dp.send("persistent://other/ns/elsewhere", b"bad-target", now_ms())
        got = drain(client, spec.output, "check", expect=2, timeout=6)
        invalid = drain(client, f"{sched}-INVALID", "check", expect=4, timeout=15)
    finally:
        dp.close()
        runner.stop()
        client.close()
    assert [m.data() for m in got] == [b"keep"]
    assert keep is not None
    reasons = {m.data(): m.properties()[ERROR_PROP] for m in invalid}
    assert set(reasons) == {b"no-time", b"negative", b"far", b"bad-target"}
    assert "__pl_deliver_at__" in reasons[b"no-time"] and "maxDelaySeconds" in reasons[b"far"]
    assert "allowedTargetPrefix" in reasons[b"bad-target"]


def test_metrics_with_pulsar_names_on_the_local_endpoint(broker, tmp_path, unique):
    import urllib.request

    spec, sched = writer_spec(unique, tmp_path, metricsIntervalSeconds=1, maxUnackedPerBucket=5)
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path, metrics_port=0)
    runner = LocalRunner(spec, opts).start()
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        for i in range(12):
            dp.send(spec.output, f"m{i}".encode(), now_ms() + 60_000)
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline and not ('state="succeed",type="create"' in text
                                                   and "pulsar_delayed_message_index_loaded{" in text
                                                   and " 12.0" in text.split("pulsar_delayed_message_index_loaded{", 1)[1].split("\n", 1)[0]):
            time.sleep(0.3)
            text = urllib.request.urlopen(f"http://127.0.0.1:{runner.metrics_port}/metrics", timeout=5).read().decode()
    finally:
        dp.close()
        client.close()
        runner.stop()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")}
    fq = f'fqfn="{spec.fqfn}"'
    assert lines[f"pulsar_delayed_message_index_bucket_total{{{fq}}}"] >= 2  # sealed buckets + the mutable one
    assert lines[f"pulsar_delayed_message_index_loaded{{{fq}}}"] == 12
    assert lines[f"pulsar_delayed_message_index_bucket_snapshot_size_bytes{{{fq}}}"] > 0
    assert lines[f'pulsar_delayed_message_index_bucket_op_count{{{fq},state="succeed",type="create"}}'] >= 2
    assert any(k.startswith("pulsar_function_user_metric_count") for k in lines)


def _writer_context(client, spec, tmp_path, user):
    """A LocalContext of the writer `spec` with `user` as its userConfig and its state in tmp_path."""
    import logging

    from pulsar_lifecycle.runtime.context import FunctionIdentity, LocalContext
    from pulsar_lifecycle.runtime.metrics import FunctionMetrics
    from pulsar_lifecycle.state.directory import DirectoryStateStore

    return LocalContext(
        identity=FunctionIdentity("public", "default", spec.name, 0, "fid", "1"), client=client, consumers={},
        input_topics=list(spec.inputs), output_topic=spec.output, output_serde_class_name="serde.IdentitySerDe",
        user_config=user, secrets={}, state=DirectoryStateStore(tmp_path / "state", "public", "default", "w"),
        metrics=FunctionMetrics(spec.fqfn), logger=logging.getLogger("test"))


def _two_failed_builds(ctx):
    """The errors of two build_service attempts that must fail (the failures kept alive, as a
    runtime that logs them would: no GC closing the directory's lock)."""
    from pulsar_lifecycle.scheduler.factory import build_service

    infos = []
    for _ in range(2):
        with pytest.raises(Exception) as info:
            build_service(ctx)
        infos.append(info)
    return [str(i.value) for i in infos]


def test_a_failed_start_releases_the_snapshot_directory(broker, tmp_path, unique):
    """build_service fails (here: the direct-intake subscribe) after taking the snapshot-directory
    lock; the next attempt must fail for the same reason, not "directory in use"."""
    spec, _ = writer_spec(unique, tmp_path)
    client = quiet_client(broker.service_url)
    try:
        errors = _two_failed_builds(_writer_context(
            client, spec, tmp_path, dict(spec.user_config, schedulingTopic="persistent://public/default")))
    finally:
        client.close()
    assert "in use" not in errors[1], errors
    assert errors[0] == errors[1]


def test_a_restart_whose_recovery_fails_while_the_producer_opens_fails_alike_and_frees_the_directory(
        broker, tmp_path, unique):
    """On the usual restart the index recovers on a thread while the release producer opens
    (factory._assemble). A recovery that fails there is the start's error, and the directory's
    lock is given back only once that thread is done: the next attempt fails alike, not "in use"."""
    from pulsar_lifecycle.scheduler.factory import build_service

    spec, _ = writer_spec(unique, tmp_path)
    client = quiet_client(broker.service_url)
    try:
        ctx = _writer_context(client, spec, tmp_path, dict(spec.user_config))
        build_service(ctx).stop()  # a new index: its id in the store and in the state
        (tmp_path / "snapshots" / "cursor.bin").write_bytes(b"\xff\xff not a cursor")
        errors = _two_failed_builds(ctx)
    finally:
        client.close()
    assert "cursor" in errors[0].lower(), errors
    assert errors[0] == errors[1], errors
