"""Checked durable writes: short writes are completed or fail, a full disk is an error naming the
file and errno, and nothing reported durable is lost after space returns."""
from __future__ import annotations

import errno
import os
import urllib.request

import pulsar
import pytest

from pulsar_lifecycle import durable
from pulsar_lifecycle.bucket import BucketIndex
from pulsar_lifecycle.bucket.config import BucketConfig
from pulsar_lifecycle.bucket.records import DelayedMessage
from pulsar_lifecycle.bucket.storage import StorageError
from pulsar_lifecycle.bucket.storage.directory import DirectorySnapshotStorage
from pulsar_lifecycle.durable import DurableWriteError
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.service import PERSIST_FAILURES_METRIC
from pulsar_lifecycle.state.directory import DirectoryStateStore
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.diskfull import SmallDisk
from support.helpers import drain, receive_payloads, shipped_writer_spec, wait_for


def _short_writes(monkeypatch, most: int) -> list:
    """os.write writes at most `most` bytes per call (what a signal or a nearly full disk does)."""
    real = os.write
    calls: list = []

    def write(fd, data):
        calls.append(len(data))
        return real(fd, bytes(memoryview(data)[:most]))
    monkeypatch.setattr(os, "write", write)
    return calls


def test_write_all_completes_short_writes(tmp_path, monkeypatch):
    calls = _short_writes(monkeypatch, 7)
    data = bytes(range(256)) * 40
    durable.atomic_write(tmp_path / "f", data)
    assert (tmp_path / "f").read_bytes() == data
    assert len(calls) == -(-len(data) // 7)  # looped until every byte was written


def test_zero_progress_is_enospc_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(DurableWriteError) as ei:
        durable.atomic_write(tmp_path / "f", b"x" * 100)
    assert ei.value.errno == errno.ENOSPC
    assert str(tmp_path) in str(ei.value) and "ENOSPC" in str(ei.value) and "wrote 0 of 100" in str(ei.value)
    assert os.listdir(tmp_path) == []  # the temporary file is gone


@pytest.fixture
def disk(tmp_path, monkeypatch):
    d = SmallDisk(tmp_path / "disk", size_mb=4, monkeypatch=monkeypatch)
    yield d
    d.close()


def test_state_store_keeps_the_old_value_on_a_full_disk(disk, caplog):
    store = DirectoryStateStore(disk.path, "public", "default", "fn")
    store.put("k", b"old")
    disk.fill()
    with pytest.raises(DurableWriteError) as ei:
        store.put("k", b"n" * 50_000)  # the case: 8,192 of 50,000 bytes and no error
    assert ei.value.errno == errno.ENOSPC and "ENOSPC" in str(ei.value)
    with pytest.raises(DurableWriteError):
        store.incr("c", 5)
    assert "event=durable_write_failed" in caplog.text
    disk.release()
    assert store.get("k") == b"old" and store.get_counter("c") is None
    store.put("k", b"new")
    assert store.get("k") == b"new"
    assert not [p for p in disk.path.rglob("*.tmp")]


def test_journal_append_on_a_full_disk_fails_and_leaves_no_torn_record(disk):
    st = DirectorySnapshotStorage(disk.path / "idx")
    ok = [st.journal_append(f"r{i}".encode() * 100) for i in range(3)]
    size = (disk.path / "idx" / "journal.log").stat().st_size
    disk.fill()
    for _ in range(3):
        with pytest.raises(StorageError) as ei:
            st.journal_append(b"x" * 20_000)
        assert "ENOSPC" in str(ei.value) and "journal.log" in str(ei.value)
    assert (disk.path / "idx" / "journal.log").stat().st_size == size  # cut back at once
    disk.release()
    later = st.journal_append(b"after")
    st.close()
    reopened = DirectorySnapshotStorage(disk.path / "idx")
    records = reopened.journal_read()
    assert [r for r, _ in records] == ok + [later]
    assert records[-1][1] == b"after" and records[0][1] == b"r0" * 100


def test_snapshot_manifest_cursor_fail_cleanly_on_a_full_disk(disk):
    st = DirectorySnapshotStorage(disk.path / "idx")
    st.put_manifest(b"m1")
    st.put_cursor(b"c1")
    disk.fill()
    with pytest.raises(StorageError, match="ENOSPC"):
        st.put_manifest(b"m" * 30_000)
    with pytest.raises(StorageError, match="ENOSPC"):
        st.put_cursor(b"c" * 30_000)
    with pytest.raises(StorageError, match="ENOSPC"):
        w = st.begin_snapshot("key", "topic", "cursor")
        w.add_segment(b"s" * 200_000)
        w.finish(b"meta")
    disk.release()
    assert st.get_manifest() == b"m1" and st.get_cursor() == b"c1"
    assert st.list_snapshots() == [] and not list(disk.path.rglob("*.tmp"))


def _msg(i: int, at: int) -> DelayedMessage:
    return DelayedMessage(1, i, -1, at, b"p" * 300 + str(i).encode())


def test_index_on_a_full_disk_loses_nothing_it_reported_durable(disk):
    """BucketIndex.add returning is the ack point: everything it returned for survives a restart
    after the disk filled up and was freed; what it raised for is simply not there (redelivered)."""
    cfg = BucketConfig(max_unacked_per_bucket=200, delayed_delivery_max_indexes_per_bucket_snapshot_segment=50)
    ix = BucketIndex(DirectorySnapshotStorage(disk.path / "idx"), cfg)
    ix.recover()
    acked, i = [], 0
    while len(acked) < 500:
        batch = [_msg(i + k, 10_000 + i + k) for k in range(20)]
        ix.add(batch)
        acked += [m.entry_id for m in batch]
        i += 20
    disk.fill()
    refused = 0
    with pytest.raises(Exception) as ei:
        for _ in range(200):  # a sealed bucket or a journal append hits the full disk
            batch = [_msg(i + k, 10_000 + i + k) for k in range(20)]
            ix.add(batch)
            acked += [m.entry_id for m in batch]
            i += 20
            ix.seal()
    refused += 1
    assert "ENOSPC" in str(ei.value) or "ENOSPC" in repr(ei.value.__cause__)
    ix.storage.close()
    disk.release()
    ix2 = BucketIndex(DirectorySnapshotStorage(disk.path / "idx"), cfg)
    ix2.recover()
    released = [r.message.entry_id for r in ix2.pop_due(10**12, 100_000)]
    assert sorted(released) == sorted(set(released))
    assert set(acked) <= set(released), f"{len(set(acked) - set(released))} acked items lost"
    assert refused == 1


@pytest.mark.integration
def test_writer_on_a_full_disk_acks_nothing_and_loses_nothing(broker, tmp_path, unique, disk, caplog):
    """The issue's scenario in process: the snapshot directory's filesystem fills up while
    scheduling messages arrive; the writer logs and counts the failure, acks none of them, and
    releases every message exactly once after the space returns."""
    spec, sched = shipped_writer_spec(unique, "d", snapshotDir=str(disk.path / "snapshots"), metricsIntervalSeconds=1)
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "data",
                                               metrics_port=0)).start()
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    counted = client.subscribe(spec.output, "count", initial_position=pulsar.InitialPosition.Earliest,
                               consumer_type=pulsar.ConsumerType.Shared)

    def metrics() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{runner.metrics_port}/metrics", timeout=5).read().decode()

    try:
        for i in range(50):
            dp.send(spec.output, f"before{i}".encode(), now_ms() + 500)
        assert len(drain(client, spec.output, "warmup", expect=50, timeout=30)) == 50
        disk.fill()
        for i in range(100):
            dp.send(spec.output, f"full{i}".encode(), now_ms() + 1000)
        assert wait_for(lambda: "event=scheduler_persist_failed" in caplog.text, timeout=30), caplog.text[-3000:]
        assert wait_for(lambda: f'metric="{PERSIST_FAILURES_METRIC}"' in metrics(), timeout=15)
        disk.release()
        got = receive_payloads(counted, 150, 60)
    finally:
        dp.close()
        client.close()
        runner.stop()
    counts = {k: got.count(k) for k in set(got)}
    expected = {f"before{i}" for i in range(50)} | {f"full{i}" for i in range(100)}
    assert set(counts) == expected, f"missing {sorted(expected - set(counts))[:5]}"
    assert all(v == 1 for v in counts.values()), {k: v for k, v in counts.items() if v > 1}
