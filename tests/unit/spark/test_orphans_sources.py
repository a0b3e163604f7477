"""Orphan audit without Spark: metadata rules, listings and in-use sources against local servers
(bookie HTTP, admin REST, moto S3, directories), the rate limit, durable scan state, request mapping."""
from __future__ import annotations

import os
import uuid as uuidlib

import pytest

from pulsar_lifecycle.bucket.codec import Manifest
from pulsar_lifecycle.bucket.storage.directory import DirectorySnapshotStorage
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType
from pulsar_lifecycle.spark.orphans.enqueue import NotEnqueueable, enqueue_orphans, to_request
from pulsar_lifecycle.spark.orphans.model import (
    LEDGER_SPACE,
    ListingError,
    classify_bookkeeper,
    namespace_of,
    parse_duration_ms,
    parse_offload_key,
    topic_of_managed_ledger,
)
from pulsar_lifecycle.spark.orphans.sources import (
    AdminInUse,
    BookieListing,
    FilesystemListing,
    RateLimiter,
    S3OffloadListing,
    SnapshotManifestInUse,
    SnapshotStoreListing,
    snapshot_id_space,
)
from pulsar_lifecycle.spark.orphans.state import ScanRecord, ScanStateDir, ScanStateError, checked_write
from servers.bookie_http_server import pulsar_metadata
from support.deletion import s3_client


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept += s
        self.t += s


# -- pure rules ---------------------------------------------------------------------------------------
def test_metadata_names_components():
    ml = "public/default/persistent/a%20b"
    assert classify_bookkeeper(pulsar_metadata("public/default/a b".replace(" ", "%20"))) == ("managed-ledger", ml, None)
    assert classify_bookkeeper({**pulsar_metadata("public/default/t"), "pulsar/cursor": "s"})[0] == "managed-cursor"
    assert classify_bookkeeper({"psr/managed-ledger": "t/n/persistent/x", "psr/cursor": "c"}) == \
        ("managed-cursor", "t/n/persistent/x", "c")
    assert classify_bookkeeper(pulsar_metadata("t/n/x", component="schema")) == ("schema", "t/n/x", None)
    for spelling in ("compacted-ledger", "compacted-topic"):
        assert classify_bookkeeper({"component": spelling, "pulsar/compactedTopic": "persistent://t/n/x"})[0] == \
            "compacted-ledger"
    assert classify_bookkeeper({"component": "delayed-index-bucket", "pulsar/delayedIndexTopic": "persistent://t/n/x",
                                "pulsar/delayedIndexBucketKey": "#pulsar.internal.delayed.bucket_1_2"}) == \
        ("delayed-index-bucket", "persistent://t/n/x", "#pulsar.internal.delayed.bucket_1_2")
    assert classify_bookkeeper({"application": "other"}) == (None, None, None)
    assert classify_bookkeeper({"component": "managed-ledger"}) == (None, None, None)  # no owner named
    assert topic_of_managed_ledger(ml) == "public/default/a b"
    assert namespace_of(ml) == namespace_of("persistent://public/default/x") == "public/default"
    with pytest.raises(ValueError):
        topic_of_managed_ledger("public/default/t")


def test_keys_and_durations():
    u = str(uuidlib.uuid4())
    assert parse_offload_key(f"{u}-ledger-42") == (u, 42, False)
    assert parse_offload_key(f"{u}-ledger-42-index") == (u, 42, True)
    assert parse_offload_key(f"{u}-index") is None and parse_offload_key("x-ledger-1") is None
    assert [parse_duration_ms(x) for x in ("24h", "90m", "30s", "2d", "500ms", "10")] == \
        [86_400_000, 5_400_000, 30_000, 172_800_000, 500, 10_000]
    with pytest.raises(ValueError):
        parse_duration_ms("soon")


def test_rate_limiter_spaces_calls():
    clock = FakeClock()
    lim = RateLimiter(4.0, clock=clock, sleep=clock.sleep)
    for _ in range(9):
        lim.acquire()
    assert clock.slept == pytest.approx(2.0)  # 9 calls at 4/s: the 9th starts 2 s after the first


# -- listings -----------------------------------------------------------------------------------------
def test_bookie_listing_pages_and_metadata(bookie_server):
    for lid in range(1, 251):
        bookie_server.add_ledger(lid, pulsar_metadata("public/default/t", cursor="s" if lid % 2 else None), 1000 + lid)
    got = list(BookieListing([bookie_server.url]).list())
    assert sorted(x.ledger_id for x in got) == list(range(1, 251))  # page 1 holds 99: nothing skipped
    by_id = {x.ledger_id: x for x in got}
    assert by_id[3].component == "managed-cursor" and by_id[3].detail == "s" and by_id[4].component == "managed-ledger"
    assert by_id[4].created_ms == 1004 and by_id[4].owner_ns == "public/default" and by_id[4].id_space == LEDGER_SPACE
    bookie_server.fail_list_pages.add(3)
    with pytest.raises(ListingError, match="page 3 answered 500"):
        list(BookieListing([bookie_server.url]).list())


def test_admin_in_use_walks_every_topic_rate_limited(admin_server):
    admin_server.set_topic("public/default/t", ledgers=[1, 2], cursors={"s": 3, "idle": -1}, schema_ledgers=[4])
    admin_server.set_partitioned("public/default/p", 2)
    admin_server.set_topic("public/default/p-partition-0", ledgers=[5])
    admin_server.set_topic("public/default/p-partition-1", ledgers=[6], compacted_ledger=7)
    admin_server.set_topic("pulsar/system/__ledger_deletion", ledgers=[8])
    clock = FakeClock()
    src = AdminInUse([admin_server.url], RateLimiter(10.0, clock=clock, sleep=clock.sleep))
    found = src.collect()
    assert found.ids[LEDGER_SPACE] == {1, 2, 3, 4, 5, 6, 7, 8}
    assert {c.namespace for c in found.coverage} == {"public/default", "pulsar/system"}
    assert found.newest() == {LEDGER_SPACE: 8}
    # tenants + 2 namespace lists + 2 topic lists + 4 internalStats = 9 calls at 10/s
    assert src.calls == 9 and clock.slept == pytest.approx(0.8)
    admin_server.fail_topics.add("public/default/p-partition-1")
    with pytest.raises(ListingError, match="answered 500"):
        AdminInUse([admin_server.url], RateLimiter(0)).collect()


BUCKET_ORPHANS = "orphans-s3-listing"


def test_s3_listing(s3_server):
    client = s3_client(s3_server)
    # A bucket of its own: the moto server is shared by the session and the deletion tests fill
    # "offload" with ledgers of their own.
    client.create_bucket(Bucket=BUCKET_ORPHANS)
    u1, u2, u3 = (str(uuidlib.uuid4()) for _ in range(3))
    client.put_object(Bucket=BUCKET_ORPHANS, Key=f"{u1}-ledger-5", Body=b"d", Metadata={"ManagedLedgerName": "t/n/persistent/x"})
    client.put_object(Bucket=BUCKET_ORPHANS, Key=f"{u1}-ledger-5-index", Body=b"i", Metadata={"ManagedLedgerName": "t/n/persistent/x"})
    client.put_object(Bucket=BUCKET_ORPHANS, Key=f"{u2}-ledger-6-index", Body=b"i", Metadata={"ManagedLedgerName": "t/n/persistent/y"})
    client.put_object(Bucket=BUCKET_ORPHANS, Key=f"{u3}-ledger-7", Body=b"d")  # written before owner metadata existed
    client.put_object(Bucket=BUCKET_ORPHANS, Key="unrelated.txt", Body=b"x")
    clock = FakeClock()
    got = {x.ledger_id: x for x in S3OffloadListing(client, BUCKET_ORPHANS, RateLimiter(100, clock=clock, sleep=clock.sleep)).list()}
    assert set(got) == {5, 6, 7}
    assert (got[5].component, got[5].owner, got[5].detail, got[5].location) == \
        ("offloaded-ledger", "t/n/persistent/x", u1, f"{u1}-ledger-5")
    assert got[6].location.endswith("-index") and got[7].component is None and got[5].created_ms > 0
    with pytest.raises(ListingError):
        list(S3OffloadListing(client, "no-such-bucket").list())


def test_filesystem_and_snapshot_store_listing(tmp_path):
    base = tmp_path / "offload"
    u = str(uuidlib.uuid4())
    (base / "public" / "default" / "persistent" / "t" / f"42-{u}").mkdir(parents=True)
    (base / "public" / "default" / "persistent" / "t" / f"42-{u}" / "data").write_bytes(b"x")
    (base / "public" / "default" / "persistent" / "t" / "junk").mkdir()
    got = list(FilesystemListing(str(base)).list())
    assert [(x.ledger_id, x.owner, x.detail, x.component) for x in got] == \
        [(42, "public/default/persistent/t", u, "offloaded-ledger")]
    with pytest.raises(ListingError):
        list(FilesystemListing(str(tmp_path / "missing")).list())

    store = DirectorySnapshotStorage(tmp_path / "snap")
    b1 = store.create_snapshot(b"m", [b"s"], "#pulsar.internal.delayed.bucket_1_2", "persistent://public/default/sched", "c")
    b2 = store.create_snapshot(b"m", [b"s"], "#pulsar.internal.delayed.bucket_3_4", "persistent://public/default/sched", "c")
    man = Manifest(format_version=1, max_bucket_id=b2)
    man.buckets.add(bucket_id=b1, bucket_key="#pulsar.internal.delayed.bucket_1_2", start_ledger_id=1, end_ledger_id=2)
    store.put_manifest(man.SerializeToString())
    listed = {x.ledger_id: x for x in SnapshotStoreListing(str(tmp_path / "snap")).list()}
    assert set(listed) == {b1, b2} and listed[b2].detail.endswith("_3_4") and listed[b2].component == "bucket-snapshot"
    found = SnapshotManifestInUse(str(tmp_path / "snap")).collect()
    space = snapshot_id_space(str(tmp_path / "snap"))
    assert found.ids[space] == {b1} and found.newest() == {space: b2}
    (tmp_path / "snap" / "manifest.bin").write_bytes(b"\xff\xff not a manifest")
    with pytest.raises(ListingError):
        SnapshotManifestInUse(str(tmp_path / "snap")).collect()


# -- scan state ---------------------------------------------------------------------------------------
def test_scan_state_commit_confirm_and_damage(tmp_path):
    state = ScanStateDir(tmp_path)
    for i, started in enumerate((1_000, 5_000, 9_000)):
        sid = f"{started:013d}-0000000{i}"
        staging = state.staging_path(sid)
        staging.mkdir()
        (staging / "part-0.parquet").write_bytes(b"x" * (i + 1))
        (staging / "_SUCCESS").write_bytes(b"")
        files = state.seal_candidates(sid)
        state.commit(ScanRecord(sid, started, started + 10, 1, {"ORPHAN": 1}, files))
    assert state.confirming_scan(10_000, 4_000).started_ms == 5_000
    assert state.confirming_scan(10_000, 9_500) is None
    # An uncommitted scan (no record) confirms nothing, a resized file is an error.
    (state.scans / "0000000006000-0000000a.parquet").mkdir()
    assert state.confirming_scan(10_000, 3_000).started_ms == 5_000
    (state.candidates_path("0000000005000-00000001") / "part-0.parquet").write_bytes(b"truncated!")
    with pytest.raises(ScanStateError, match="bytes, the record says"):
        state.confirming_scan(10_000, 4_000)
    (state.scans / "0000000009000-00000002.json").write_bytes(b"{not json")
    with pytest.raises(ScanStateError, match="damaged"):
        state.records()


def test_checked_write_loops_short_writes_and_keeps_old_content_on_full_disk(tmp_path, monkeypatch):
    import errno

    import pulsar_lifecycle.spark.orphans.state as st

    real_write = os.write
    monkeypatch.setattr(st.os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))  # short writes
    checked_write(tmp_path / "r.json", b'{"a": 12345}')
    assert (tmp_path / "r.json").read_bytes() == b'{"a": 12345}'

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(st.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        checked_write(tmp_path / "r.json", b'{"b": 1}')
    assert (tmp_path / "r.json").read_bytes() == b'{"a": 12345}'  # the old record survives
    state = ScanStateDir(tmp_path / "s")
    with pytest.raises(ScanStateError, match="cannot commit"):
        state.commit(ScanRecord("0000000001000-00000000", 1000, 1001, 0))
    assert state.records() == []


# -- phase-one requests -------------------------------------------------------------------------------
def _row(**kw):
    base = {"store": "bookkeeper", "id_space": "ledger", "ledger_id": 5, "component": "managed-ledger",
            "owner": "public/default/persistent/a%20b-partition-1", "detail": None}
    return {**base, **kw}


def test_requests_for_each_component():
    r = to_request(_row())
    assert (r.topic_name, r.ledger_component, r.ledger_type, r.check_ledger_still_in_use) == \
        ("public/default/a b-partition-1", LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, True)
    assert to_request(_row(component="managed-cursor", detail="sub")).properties == {"cursor": "sub"}
    assert to_request(_row(component="schema", owner="public/default/t")).ledger_component is LedgerComponent.SCHEMA_STORAGE
    u = str(uuidlib.uuid4())
    s3 = to_request(_row(store="s3://offload", component="offloaded-ledger", detail=u))
    oc = s3.context.offload_context
    assert s3.ledger_type is LedgerType.OFFLOAD_LEDGER and oc.uuid == u and oc.driver_metadata == {"bucket": "offload"}
    fs = to_request(_row(store="file:///base", component="offloaded-ledger", detail=u))
    assert fs.context.offload_context.driver_name == "filesystem"
    snap = to_request(_row(store="snapshots:///x", id_space="bucket:/x", component="bucket-snapshot",
                           owner="persistent://public/default/sched", detail="#k"))
    assert snap.ledger_component is LedgerComponent.DELAYED_INDEX_BUCKET and snap.properties == {"bucketKey": "#k"}
    for comp in ("compacted-ledger", "delayed-index-bucket"):
        with pytest.raises(NotEnqueueable, match="report only"):
            to_request(_row(component=comp))
    def append(info):
        if info.ledger_id == 7:
            raise RuntimeError("broker down")
        return f"msg-{info.ledger_id}"

    rows = [_row(component="compacted-ledger"), _row(ledger_id=6), _row(ledger_id=7), _row(ledger_id=8)]
    res = enqueue_orphans(rows, append)
    # 6 sent, the compacted ledger reported only, sending stops at 7's failure (8 waits for the next scan)
    assert [s["ledger_id"] for s in res.sent] == [6] and len(res.skipped) == 1 and "broker down" in res.failed
