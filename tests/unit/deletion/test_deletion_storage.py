"""Storage backends and the admin client against local servers over 127.0.0.1 (and moto's S3)."""
from __future__ import annotations

import os

import pytest

from pulsar_lifecycle.deletion.admin import PulsarAdminClient, ledger_ids_from_internal_stats
from pulsar_lifecycle.deletion.model import InvalidRequestError, LedgerComponent, LedgerType, TopicRef
from pulsar_lifecycle.deletion.ports import DeleteResult, OwnershipStatus, StorageError
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient, BookieLedgerStorage
from pulsar_lifecycle.deletion.storage.filesystem import FileSystemOffloadStorage
from pulsar_lifecycle.deletion.storage.s3 import S3OffloadStorage, object_keys
from pulsar_lifecycle.deletion.storage.snapshot import SnapshotStoreStorage
from servers.bookie_http_server import BookieHttpServer, pulsar_metadata
from support.deletion import req, s3_client

T = "public/default/orders-partition-0"


# -- admin internalStats ---------------------------------------------------------------------
def test_internal_stats_ids(admin_server):
    admin_server.set_topic(T, ledgers=[10, 11], cursors={"sub": 12, "idle": -1}, schema_ledgers=[3], compacted_ledger=20)
    admin = PulsarAdminClient.connect([admin_server.url])
    assert admin.in_use_ledger_ids(TopicRef.parse(T)) == {3, 10, 11, 12, 20}
    assert admin.in_use_ledger_ids(TopicRef.parse("public/default/missing-partition-1")) is None
    assert admin.calls == 2


def test_partitioned_internal_stats_for_base_names(admin_server):
    admin_server.set_partitioned("public/default/p", 2)
    admin_server.set_topic("public/default/p-partition-0", ledgers=[1], schema_ledgers=[7])
    admin_server.set_topic("public/default/p-partition-1", ledgers=[2], cursors={"s": 5})
    admin = PulsarAdminClient.connect([admin_server.url])
    assert admin.in_use_ledger_ids(TopicRef.parse("public/default/p")) == {1, 2, 5, 7}
    assert admin_server.calls_for("public/default/p", "partitioned-internalStats") == 1


def test_environment_proxies_still_apply_though_read_once(admin_server, monkeypatch):
    admin_server.set_topic(T, ledgers=[1])
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(StorageError, match="no endpoint reachable"):
        PulsarAdminClient.connect([admin_server.url], timeout=2).in_use_ledger_ids(TopicRef.parse(T))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert PulsarAdminClient.connect([admin_server.url]).in_use_ledger_ids(TopicRef.parse(T)) == {1}


def test_admin_errors_and_failover(admin_server):
    admin_server.set_topic(T, ledgers=[1])
    # The first URL refuses connections; the client moves on to the live one.
    admin = PulsarAdminClient.connect(["http://127.0.0.1:9", admin_server.url], timeout=2)
    for _ in range(3):
        assert admin.in_use_ledger_ids(TopicRef.parse(T)) == {1}
    admin_server.fail_rate = 1.0
    with pytest.raises(StorageError, match="500"):
        admin.in_use_ledger_ids(TopicRef.parse(T))
    with pytest.raises(StorageError, match="unexpected shape"):
        ledger_ids_from_internal_stats({"ledgers": [{"noId": 1}]})


def test_create_partitioned_topic(admin_server):
    admin = PulsarAdminClient.connect([admin_server.url])
    ref = TopicRef.parse("pulsar/system/__ledger_deletion")
    assert admin.create_partitioned_topic(ref, 4) is True
    assert admin.create_partitioned_topic(ref, 4) is False
    assert admin_server.partitioned["pulsar/system/__ledger_deletion"] == 4


# -- bookie HTTP -----------------------------------------------------------------------------
def test_bookie_owner_checks(bookie_server):
    bookie_server.add_ledger(1, pulsar_metadata(T))
    bookie_server.add_ledger(2, pulsar_metadata(T, cursor="sub"))
    bookie_server.add_ledger(3, pulsar_metadata("public/default/orders", component="schema"))
    bookie_server.add_ledger(4, pulsar_metadata("public/default/other-partition-0"))
    bookie_server.add_ledger(5, {"foo": "bar"})
    st = BookieLedgerStorage(BookieHttpClient.connect([bookie_server.url]))
    assert st.check_owner(req(T, 1)).status is OwnershipStatus.MATCH
    assert st.check_owner(req(T, 2, LedgerComponent.MANAGED_CURSOR)).status is OwnershipStatus.MATCH
    assert st.check_owner(req(T, 2, LedgerComponent.MANAGED_CURSOR, cursor="other")).status is OwnershipStatus.MISMATCH
    assert st.check_owner(req(T, 2)).status is OwnershipStatus.MISMATCH  # a cursor ledger is not a data ledger
    assert st.check_owner(req(T, 3, LedgerComponent.SCHEMA_STORAGE)).status is OwnershipStatus.MATCH
    forged = st.check_owner(req(T, 4))
    assert forged.status is OwnershipStatus.MISMATCH and "other-partition-0" in forged.detail
    assert st.check_owner(req(T, 5)).status is OwnershipStatus.UNVERIFIABLE
    assert st.check_owner(req(T, 99)).status is OwnershipStatus.GONE


@pytest.mark.parametrize("manager", ["zk", "metadata-store"])
def test_bookie_delete_is_idempotent(manager):
    with BookieHttpServer(ledger_manager=manager) as server:
        server.add_ledger(1, pulsar_metadata(T))
        st = BookieLedgerStorage(BookieHttpClient.connect([server.url]))
        assert st.delete(req(T, 1)) is DeleteResult.DELETED
        assert not server.exists(1)
        again = st.delete(req(T, 1))
        assert again is (DeleteResult.DELETED if manager == "zk" else DeleteResult.NOT_FOUND)


def test_bookie_failures_are_transient():
    with BookieHttpServer(fail_rate=1.0) as server:
        server.add_ledger(1, pulsar_metadata(T))
        st = BookieLedgerStorage(BookieHttpClient.connect([server.url]))
        with pytest.raises(StorageError):
            st.check_owner(req(T, 1))
        with pytest.raises(StorageError):
            st.delete(req(T, 1))
        assert server.exists(1)


# -- S3 through moto's server ------------------------------------------------------------------
U = "12345678-1234-5678-9abc-def012345678"


def _put_offloaded(client, bucket, uuid, ledger_id, owner):
    data, index = object_keys(uuid, ledger_id)
    md = {"ManagedLedgerName": owner, "S3ManagedLedgerOffloaderFormatVersion": "1"} if owner else {}
    client.put_object(Bucket=bucket, Key=data, Body=b"d" * 100, Metadata={**md, "role": "data"})
    client.put_object(Bucket=bucket, Key=index, Body=b"i" * 10, Metadata={**md, "role": "index"})


def _keys(client, bucket):
    return {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}


def test_s3_offload_storage(s3_server):
    client = s3_client(s3_server)
    client.create_bucket(Bucket="offload")
    ml = TopicRef.parse(T).managed_ledger_name
    _put_offloaded(client, "offload", U, 7, ml)
    _put_offloaded(client, "offload", U, 8, "public/default/persistent/other")
    _put_offloaded(client, "offload", U, 9, None)
    st = S3OffloadStorage(client, default_bucket="offload")
    r7 = req(T, 7, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U, driver="aws-s3")
    assert st.check_owner(r7).status is OwnershipStatus.MATCH
    assert st.check_owner(req(T, 8, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U)).status is OwnershipStatus.MISMATCH
    assert st.check_owner(req(T, 9, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U)).status is OwnershipStatus.UNVERIFIABLE
    assert st.delete(r7) is DeleteResult.DELETED
    assert not any(k.endswith("-ledger-7") or k.endswith("-ledger-7-index") for k in _keys(client, "offload"))
    assert st.check_owner(r7).status is OwnershipStatus.GONE
    assert st.delete(r7) is DeleteResult.DELETED  # S3 deletes are idempotent
    other = req(T, 7, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U)
    other = other.__class__(**{**other.__dict__, "context": other.context.__class__(
        7, offload_context=other.context.offload_context.__class__(1, 2, driver_metadata={"bucket": "elsewhere"}))})
    with pytest.raises(InvalidRequestError, match="not one this worker manages"):
        st.check_owner(other)


def test_s3_unreachable_is_transient():
    from pulsar_lifecycle.deletion.storage.s3 import make_s3_client

    client = make_s3_client("http://127.0.0.1:9", "us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    st = S3OffloadStorage(client, default_bucket="b")
    with pytest.raises(StorageError):
        st.delete(req(T, 1, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U))


# -- filesystem offloader ----------------------------------------------------------------------
def test_filesystem_offload_storage(tmp_path):
    st = FileSystemOffloadStorage(str(tmp_path))
    r = req(T, 5, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U, driver="filesystem")
    path = tmp_path / TopicRef.parse(T).managed_ledger_name / f"5-{U}"
    (path).mkdir(parents=True)
    (path / "data").write_bytes(b"x")
    (path / "index").write_bytes(b"y")
    assert st.check_owner(r).status is OwnershipStatus.MATCH
    assert st.delete(r) is DeleteResult.DELETED and not path.exists()
    assert st.check_owner(r).status is OwnershipStatus.GONE
    assert st.delete(r) is DeleteResult.NOT_FOUND
    assert os.listdir(tmp_path / TopicRef.parse(T).managed_ledger_name) == []


def test_filesystem_refuses_foreign_driver_metadata(tmp_path):
    from pulsar_lifecycle.deletion.model import LedgerContext, OffloadContext, PendingDeleteLedgerInfo

    oc = OffloadContext.from_uuid(U, driver_name="filesystem", driver_metadata={"ManagedLedgerName": "x/y/persistent/z"})
    r = PendingDeleteLedgerInfo(T, LedgerComponent.MANAGED_LEDGER, LedgerType.OFFLOAD_LEDGER, 5, LedgerContext(5, offload_context=oc))
    with pytest.raises(InvalidRequestError, match="driver metadata names"):
        FileSystemOffloadStorage(str(tmp_path)).check_owner(r)


# -- snapshot store ----------------------------------------------------------------------------
def test_snapshot_store_storage():
    store = {1: "public/default/t", 2: "public/default/u"}
    st = SnapshotStoreStorage(delete_fn=lambda b: store.pop(b, None) is not None, owner_fn=store.get)
    r = req("public/default/t", 1, LedgerComponent.DELAYED_INDEX_BUCKET)
    assert st.check_owner(r).status is OwnershipStatus.MATCH
    assert st.check_owner(req("public/default/t", 2, LedgerComponent.DELAYED_INDEX_BUCKET)).status is OwnershipStatus.MISMATCH
    assert st.delete(r) is DeleteResult.DELETED
    assert st.delete(r) is DeleteResult.NOT_FOUND
    assert st.check_owner(r).status is OwnershipStatus.GONE
