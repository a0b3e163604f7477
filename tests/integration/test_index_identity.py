"""The bucket index and the dedup state recognise each other (issue 8, item 2): a wiped,
replaced or elsewhere-pointed index is refused with an error naming both places, and a new
index numbers its releases above anything an earlier one published."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Dict, Optional

import pulsar
import pytest

from pulsar_lifecycle.bucket.proto.BucketIndexState_pb2 import ReleaseCursor
from pulsar_lifecycle.bucket.storage import MemorySnapshotStorage
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.index_identity import (
    SEQ_BASE_SHIFT,
    STATE_KEY,
    IndexMismatchError,
    check_index_identity,
    known_identity,
)
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import receive_payloads, shipped_writer_spec

NOW = 1_790_000_000_000


class DictState:
    def __init__(self) -> None:
        self.values: Dict[str, bytes] = {}

    def get(self, key: str) -> Optional[bytes]:
        return self.values.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = bytes(value)


def check(storage, state, published=0, replace=""):
    return check_index_identity(storage, state, state_location="STATE-LOC", published_seq=published,
                                replace_index_id=replace, clock_ms=lambda: NOW)


def test_a_new_index_gets_an_id_in_both_places_and_a_time_based_sequence_base():
    st, state = MemorySnapshotStorage(), DictState()
    res = check(st, state)
    assert res.fresh and res.seq_base == NOW << SEQ_BASE_SHIFT
    assert st.get_index_id() == res.index_id == state.get(STATE_KEY).decode()
    cur = ReleaseCursor.FromString(st.get_cursor())
    assert cur.seq == NOW << SEQ_BASE_SHIFT and not cur.has_watermark
    again = check(st, state)  # the same pair on the next start: nothing changes
    assert again.index_id == res.index_id and not again.fresh and again.seq_base == 0


def test_only_the_usual_restart_is_known_without_the_release_producer():
    # known_identity lets the writer recover while its producer opens: it must answer only when
    # the store's index is the one the state follows, and write nothing.
    st, state = MemorySnapshotStorage(), DictState()
    assert known_identity(st, state) is None  # a new index: its base needs the producer's last id
    res = check(st, state)
    assert known_identity(st, state) == check(st, state) == type(res)(res.index_id, False, 0)
    state.put(STATE_KEY, b"another-index")
    before = (st.get_index_id(), st.get_cursor(), dict(state.values))
    assert known_identity(st, state) is None  # a mismatch: check_index_identity refuses it
    assert (st.get_index_id(), st.get_cursor(), dict(state.values)) == before
    with pytest.raises(IndexMismatchError):
        check(st, state)


def test_the_base_stays_above_what_the_topic_holds_even_with_a_clock_behind():
    st, state = MemorySnapshotStorage(), DictState()
    published = (NOW << SEQ_BASE_SHIFT) + 12345  # an earlier index on a machine whose clock ran ahead
    assert check(st, state, published=published).seq_base == published


def test_a_wiped_index_is_refused_naming_both_places_until_replaced_explicitly():
    st, state = MemorySnapshotStorage(), DictState()
    old = check(st, state).index_id
    wiped = MemorySnapshotStorage()
    with pytest.raises(IndexMismatchError) as ei:
        check(wiped, state, published=5)
    msg = str(ei.value)
    assert "memory snapshot storage" in msg and "STATE-LOC" in msg and old in msg
    assert f"replaceIndexId={old}" in msg
    assert wiped.get_index_id() is None and wiped.get_cursor() is None  # refused before writing anything
    new = check(wiped, state, published=(NOW << SEQ_BASE_SHIFT) + 7, replace=old)
    assert new.fresh and new.index_id != old and new.seq_base == (NOW << SEQ_BASE_SHIFT) + 7
    assert state.get(STATE_KEY).decode() == new.index_id
    assert check(wiped, state, replace=old).index_id == new.index_id  # a stale replaceIndexId is harmless


def test_an_index_of_another_deployment_is_refused():
    a, b, state = MemorySnapshotStorage(), MemorySnapshotStorage(), DictState()
    check(a, state)
    check(b, DictState())
    b.journal_append(b"x")
    with pytest.raises(IndexMismatchError, match="dropped as duplicates"):
        check(b, state)
    with pytest.raises(IndexMismatchError):  # replaceIndexId only ever adopts an empty index
        check(b, state, replace=a.get_index_id())


def test_an_index_from_before_ids_is_adopted():
    st, state = MemorySnapshotStorage(), DictState()
    st.put_cursor(ReleaseCursor(has_watermark=False, seq=42).SerializeToString())
    res = check(st, state)
    assert not res.fresh and res.seq_base == 0 and st.get_index_id() == state.get(STATE_KEY).decode()
    assert ReleaseCursor.FromString(st.get_cursor()).seq == 42  # existing numbering kept


# -- through the local runner on the real embedded broker --------------------------------------

def _spec(unique: str, **user):
    # No snapshotDir: the shipped default, inside --data-dir under the local runner.
    return shipped_writer_spec(unique, "i", **user)


def _run(broker, data_dir: Path, spec):
    return LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=data_dir)).start()


@pytest.mark.integration
def test_restart_from_another_working_directory_releases_pending_and_new(broker, tmp_path, unique, monkeypatch):
    """The issue's case: same --data-dir, another working directory. The index lives in --data-dir
    now, so the 50 pending and the 50 new messages are all released, each once."""
    spec, sched = _spec(unique)
    data = tmp_path / "data"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    client = quiet_client(broker.service_url)
    out = client.subscribe(spec.output, "count", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        monkeypatch.chdir(tmp_path / "a")
        runner = _run(broker, data, spec)
        for i in range(50):
            dp.send(spec.output, f"pending{i}".encode(), now_ms() + 3000)
        time.sleep(1.0)  # indexed and acked, not yet due
        runner.stop()
        assert (data / "buckets").is_dir() and not (tmp_path / "a" / ".pulsar-lifecycle").exists()
        monkeypatch.chdir(tmp_path / "b")
        runner = _run(broker, data, spec)
        for i in range(50):
            dp.send(spec.output, f"new{i}".encode(), now_ms() + 500)
        got = receive_payloads(out, 100, 40)
        runner.stop()
    finally:
        dp.close()
        client.close()
    assert sorted(got) == sorted([f"pending{i}" for i in range(50)] + [f"new{i}" for i in range(50)])


@pytest.mark.integration
def test_wiped_snapshot_dir_is_refused_then_replaced_explicitly(broker, tmp_path, unique, caplog):
    """Snapshot directory wiped while the function state survives: the writer refuses (nothing
    consumed, one error naming both places); with replaceIndexId it starts a new index whose
    releases are not dropped as duplicates."""
    spec, sched = _spec(unique)
    data = tmp_path / "data"
    client = quiet_client(broker.service_url)
    out = client.subscribe(spec.output, "count", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        runner = _run(broker, data, spec)
        for i in range(20):
            dp.send(spec.output, f"first{i}".encode(), now_ms() + 200)
        assert len(receive_payloads(out, 20, 30)) == 20
        runner.stop()
        index_dir = next((data / "buckets").iterdir())
        old_id = (index_dir / "index-id").read_text()
        shutil.rmtree(index_dir)
        runner = _run(broker, data, spec)
        for i in range(20):
            dp.send(spec.output, f"second{i}".encode(), now_ms() + 200)
        deadline = time.monotonic() + 20
        while "event=bucket_index_mismatch" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        refused = receive_payloads(out, 1, 2)
        runner.stop()
        assert refused == []
        line = next(r.getMessage() for r in caplog.records if "event=bucket_index_mismatch" in r.getMessage())
        assert str(index_dir.resolve()) in line and str(data / "state") in line and old_id in line
        spec2, _ = _spec(unique, replaceIndexId=old_id)
        runner = _run(broker, data, spec2)
        got = receive_payloads(out, 20, 30)
        runner.stop()
    finally:
        dp.close()
        client.close()
    assert sorted(got) == sorted(f"second{i}" for i in range(20))
