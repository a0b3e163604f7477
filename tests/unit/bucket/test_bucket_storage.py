"""Snapshot storage backends (memory, directory, BookKeeper table service over local gRPC)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pulsar_lifecycle.bucket import (
    BucketConfig,
    BucketIndex,
    DelayedMessage,
    DirectorySnapshotStorage,
    MemorySnapshotStorage,
    SnapshotNotFoundError,
    StorageError,
)
from pulsar_lifecycle.bucket.storage import BucketSnapshotStorage, bookkeeper_partition_storage
from pulsar_lifecycle.bucket.storage.bookkeeper import BookKeeperTableSnapshotStorage
from servers.bk_table_server import TableServer, start_table_server


@pytest.fixture(scope="module")
def bk_server() -> Iterator[TableServer]:
    with start_table_server() as srv:
        yield srv


@pytest.fixture(params=["memory", "directory", "bookkeeper", "bookkeeper-partition"])
def make_storage(request, tmp_path: Path) -> Iterator[Callable[[], BucketSnapshotStorage]]:
    """A factory opening the SAME storage again (as a restarted process would)."""
    opened = []
    kind = request.param
    table = re.sub(r"\W", "_", request.node.name)[:60]
    mem = MemorySnapshotStorage()
    owner: list = []  # bookkeeper-partition: (lease store, lease) of the first open
    server = request.getfixturevalue("bk_server") if kind.startswith("bookkeeper") else None

    def _open() -> BucketSnapshotStorage:
        if kind == "memory":
            return mem
        if kind == "directory":
            st = DirectorySnapshotStorage(tmp_path / "snap")
        elif kind == "bookkeeper-partition":
            # A scheduling partition's store: every key routed by the partition prefix, every write
            # a Txn guarded by the partition lease (taken by the first open; later opens write
            # under the same lease).
            if not owner:
                st, leases, lease = bookkeeper_partition_storage(server.url, "my-tenant", "my-ns", table,
                                                                 "partition-3", "owner", 60_000)
                owner.extend([leases, lease])
                opened.append(leases)
            else:
                leases, lease = owner
                st = BookKeeperTableSnapshotStorage(table=leases.table, prefix=leases.prefix,
                                                    routing_key=leases.routing_key, fence=leases.guard(lease))
        else:
            st = BookKeeperTableSnapshotStorage(server.url, "my-tenant", "my-ns", table, chunk_size=4096)
        opened.append(st)
        return st

    yield _open
    for st in opened:
        st.close()


def test_snapshot_round_trip(make_storage):
    st = make_storage()
    segs = [b"seg-one", b"", b"s" * 10000]
    bid = st.create_snapshot(b"meta", segs, "#pulsar.internal.delayed.bucket_1_2", "persistent://t/n/x", "sub")
    assert bid > 0
    st2 = make_storage()
    assert st2.get_metadata(bid) == b"meta"
    assert st2.get_segments(bid, 1, 3) == segs
    assert st2.get_segments(bid, 2, 2) == [b""]
    assert st2.get_length(bid) >= 4 + 7 + 10000
    assert st2.list_snapshots() == [bid]
    assert st2.list_snapshots(bid) == []
    info = st2.snapshot_info(bid)
    assert info["bucket_key"] == "#pulsar.internal.delayed.bucket_1_2" and info["cursor"] == "sub"


def test_bucket_ids_increase_and_survive_reopen(make_storage):
    st = make_storage()
    a = st.create_snapshot(b"m", [b"x"], "k", "t", "c")
    b = st.create_snapshot(b"m", [b"x"], "k", "t", "c")
    st.delete(b)
    c = make_storage().create_snapshot(b"m", [b"x"], "k", "t", "c")
    assert a < b < c


def test_segment_range_and_missing_errors(make_storage):
    st = make_storage()
    bid = st.create_snapshot(b"m", [b"a", b"b"], "k", "t", "c")
    for first, last in ((0, 1), (1, 3), (2, 1)):
        with pytest.raises(StorageError, match="out of range|start at 1"):
            st.get_segments(bid, first, last)
    with pytest.raises(SnapshotNotFoundError):
        st.get_metadata(bid + 100)
    with pytest.raises(SnapshotNotFoundError):
        st.get_segments(bid + 100, 1, 1)
    with pytest.raises(StorageError, match="positive"):
        st.get_metadata(0)


def test_delete_is_idempotent(make_storage):
    st = make_storage()
    bid = st.create_snapshot(b"m", [b"a"], "k", "t", "c")
    st.delete(bid)
    st.delete(bid)  # missing = success
    st.delete(bid + 7)
    with pytest.raises(SnapshotNotFoundError):
        st.get_metadata(bid)
    assert st.list_snapshots() == []


def test_streamed_snapshot_and_abort(make_storage):
    st = make_storage()
    w = st.begin_snapshot("k", "t", "c")
    for i in range(5):
        w.add_segment(bytes([i]) * 100)
    assert w.finish(b"M") == w.bucket_id
    assert st.get_segments(w.bucket_id, 5, 5) == [bytes([4]) * 100]
    w2 = st.begin_snapshot("k", "t", "c")
    w2.add_segment(b"x")
    w2.abort()
    assert st.list_snapshots() == [w.bucket_id]
    with pytest.raises(SnapshotNotFoundError):
        st.get_metadata(w2.bucket_id)


def test_journal_append_read_truncate(make_storage):
    st = make_storage()
    ids = [st.journal_append(b"r%d" % i) for i in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    st2 = make_storage()
    assert st2.journal_read() == [(i, b"r%d" % n) for n, i in enumerate(ids)]
    st2.journal_truncate(ids[2])
    assert [r for r, _ in make_storage().journal_read()] == ids[3:]
    st3 = make_storage()
    st3.journal_truncate(ids[4])
    assert st3.journal_read() == []
    nxt = make_storage().journal_append(b"after")
    assert nxt > ids[4]
    big = os.urandom(20000)
    rid = st3.journal_append(big)
    assert make_storage().journal_read()[-1] == (rid, big)


def test_manifest_and_cursor_replace(make_storage):
    st = make_storage()
    assert st.get_manifest() is None and st.get_cursor() is None
    st.put_manifest(b"one")
    st.put_cursor(b"c1")
    st.put_manifest(os.urandom(50000))  # chunked on BookKeeper
    big = os.urandom(30000)
    st.put_manifest(big)
    st.put_cursor(b"c2")
    st2 = make_storage()
    assert st2.get_manifest() == big and st2.get_cursor() == b"c2"
    st2.put_manifest(b"small again")
    assert make_storage().get_manifest() == b"small again"


def test_engine_restart_on_every_backend(make_storage):
    cfg = BucketConfig(max_unacked_per_bucket=7, delayed_delivery_max_indexes_per_bucket_snapshot_segment=3,
                       delayed_delivery_max_num_buckets=3)
    ix = BucketIndex(make_storage(), cfg)
    ix.recover()
    msgs = [DelayedMessage(10 + i // 20, i % 20, 0, 1000 + (i * 37) % 50, b"p%d" % i, properties={"i": str(i)})
            for i in range(60)]
    assert all(ix.add(msgs))
    first = ix.pop_due(1020, 15)
    ix.commit(first[9].seq)
    ix2 = BucketIndex(make_storage(), cfg)
    ix2.recover()
    again = ix2.pop_due(10_000, 1000)
    assert [r.seq for r in again] == list(range(11, 61))
    assert [(r.seq, r.message.entry_id, r.message.ledger_id) for r in again[:5]] == [
        (r.seq, r.message.entry_id, r.message.ledger_id) for r in first[10:15]
    ]
    assert sorted((r.message.ledger_id, r.message.entry_id) for r in first[:10] + again) == sorted(
        (m.ledger_id, m.entry_id) for m in msgs
    )
    assert all(r.message.properties["i"] for r in again)


# -- directory backend specifics ------------------------------------------------------------

def test_directory_torn_journal_tail_is_dropped(tmp_path: Path):
    st = DirectorySnapshotStorage(tmp_path)
    a = st.journal_append(b"first")
    st.close()
    with open(tmp_path / "journal.log", "ab") as fh:
        fh.write(b"\x10\x00\x00\x00garbage")  # a crash in the middle of an append
    st2 = DirectorySnapshotStorage(tmp_path)
    assert st2.journal_read() == [(a, b"first")]
    b = st2.journal_append(b"second")
    assert DirectorySnapshotStorage(tmp_path).journal_read() == [(a, b"first"), (b, b"second")]


def test_directory_corrupt_snapshot_is_detected(tmp_path: Path):
    st = DirectorySnapshotStorage(tmp_path)
    bid = st.create_snapshot(b"meta", [b"segment-bytes"], "k", "t", "c")
    path = next((tmp_path / "snapshots").iterdir())
    data = bytearray(path.read_bytes())
    data[2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="corrupt"):
        st.get_segments(bid, 1, 1)
    path.write_bytes(b"short")
    with pytest.raises(StorageError, match="truncated|not a bucket snapshot"):
        st.get_metadata(bid)


def test_directory_counter_never_reuses_ids(tmp_path: Path):
    st = DirectorySnapshotStorage(tmp_path)
    bid = st.create_snapshot(b"m", [b"a"], "k", "t", "c")
    (tmp_path / "next_bucket_id").unlink()  # lost counter: existing files still bound the ids
    assert DirectorySnapshotStorage(tmp_path).create_snapshot(b"m", [], "k", "t", "c") > bid


def test_directory_leaves_no_temp_files(tmp_path: Path):
    st = DirectorySnapshotStorage(tmp_path)
    st.create_snapshot(b"m", [b"a"], "k", "t", "c")
    w = st.begin_snapshot("k", "t", "c")
    w.add_segment(b"x")
    w.abort()
    st.put_manifest(b"m")
    st.journal_append(b"j")
    st.journal_truncate(10)
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


# -- BookKeeper backend specifics ------------------------------------------------------------

def test_bookkeeper_interrupted_snapshot_is_listed_and_deleted(bk_server: TableServer):
    st = BookKeeperTableSnapshotStorage(bk_server.url, "my-tenant", "my-ns", "interrupted", chunk_size=1024)
    try:
        w = st.begin_snapshot("k", "t", "c")
        w.add_segment(b"a" * 3000)  # chunked
        w.add_segment(b"b")
        # the process dies here: no finish(), no abort()
        assert st.list_snapshots() == [w.bucket_id]
        with pytest.raises(SnapshotNotFoundError, match="never completed"):
            st.get_metadata(w.bucket_id)
        st.delete(w.bucket_id)
        assert st.list_snapshots() == []
    finally:
        st.close()


def test_bookkeeper_interrupted_journal_truncation_is_finished(bk_server: TableServer):
    st = BookKeeperTableSnapshotStorage(bk_server.url, "my-tenant", "my-ns", "jtrunc")
    try:
        ids = [st.journal_append(b"%d" % i) for i in range(4)]
        # Simulate a crash right after the start moved: meta says first=3, gc from 1.
        st._put_value(st._k("journal/meta"), f"{ids[2]},{ids[0]}".encode(), replace=True)
        st2 = BookKeeperTableSnapshotStorage(bk_server.url, "my-tenant", "my-ns", "jtrunc")
        assert [r for r, _ in st2.journal_read()] == ids[2:]
        assert st2._get_raw(st2._jkey(ids[0])) is None  # garbage below the start was collected
        st2.close()
    finally:
        st.close()


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partition"])
def test_bookkeeper_values_above_the_record_limit_with_the_default_chunks(bk_server: TableServer, partitioned: bool):
    """The table service writes each put as one log record of at most 1 MB - 8 KB (the server
    stand-in refuses larger ones as the real store does, with error 500): a journal batch of
    1.5-1.7 MB (an intake gap's follower reads up to 20,000 messages) and a large manifest must go
    through in chunks of the default size, plain and under a partition's lease."""
    table = f"over-limit-{'p' if partitioned else 'u'}"
    if partitioned:
        st, leases, _lease = bookkeeper_partition_storage(bk_server.url, "my-tenant", "my-ns", table,
                                                          "partition-0", "owner", 60_000)
        closing = [st, leases]
    else:
        st = BookKeeperTableSnapshotStorage(bk_server.url, "my-tenant", "my-ns", table)
        closing = [st]
    try:
        record, manifest = os.urandom(3 * 1024 * 1024), os.urandom(1_100_000)
        rid = st.journal_append(record)
        st.put_manifest(manifest)
        assert st.journal_read()[-1] == (rid, record)
        assert st.get_manifest() == manifest
    finally:
        for c in closing:
            c.close()


def test_bookkeeper_chunk_size_above_the_record_limit_is_refused():
    with pytest.raises(ValueError, match="refuses a record above 1040384"):
        BookKeeperTableSnapshotStorage("bk://127.0.0.1:1", chunk_size=1 << 20)


def test_bookkeeper_unreachable_is_a_clear_error():
    with pytest.raises(StorageError, match="unreachable"):
        BookKeeperTableSnapshotStorage("bk://127.0.0.1:1", connect_timeout=0.3)
    with pytest.raises(ValueError, match="service_url"):
        BookKeeperTableSnapshotStorage(None)
