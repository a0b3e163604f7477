"""The LedgerStorage contract on every backend: bookie HTTP (local server speaking the bookie
admin API), S3 (moto's server), the filesystem offloader and the bucket snapshot store."""
from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from pulsar_lifecycle.bucket.storage import DirectorySnapshotStorage, SnapshotNotFoundError
from pulsar_lifecycle.bucket.storage.hooks import SnapshotStoreHooks
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType, TopicRef
from pulsar_lifecycle.deletion.ports import OwnershipStatus
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient, BookieLedgerStorage
from pulsar_lifecycle.deletion.storage.filesystem import FileSystemOffloadStorage
from pulsar_lifecycle.deletion.storage.s3 import S3OffloadStorage, object_keys
from pulsar_lifecycle.deletion.storage.snapshot import SnapshotStoreStorage
from servers.bookie_http_server import BookieHttpServer, pulsar_metadata
from support.deletion import req, s3_client
from support.ledger_storage_contract import LedgerBackend, LedgerStorageContract

U = "12345678-1234-5678-9abc-def012345678"


class TestBookieHttp(LedgerStorageContract):
    @pytest.fixture
    def backend(self) -> Iterator[LedgerBackend]:
        ids = itertools.count(1)
        with BookieHttpServer() as server:
            def add(topic: str) -> int:
                lid = next(ids)
                server.add_ledger(lid, pulsar_metadata(topic))
                return lid

            yield LedgerBackend(BookieLedgerStorage(BookieHttpClient.connect([server.url])), add, server.exists,
                                lambda lid, topic: req(topic, lid))


class TestS3Offload(LedgerStorageContract):
    @pytest.fixture
    def backend(self, s3_server: str) -> LedgerBackend:
        client = s3_client(s3_server)
        bucket = f"offload-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        ids = itertools.count(1)

        def add(topic: str) -> int:
            lid = next(ids)
            md = {"ManagedLedgerName": TopicRef.parse(topic).managed_ledger_name,
                  "S3ManagedLedgerOffloaderFormatVersion": "1"}
            data, index = object_keys(U, lid)
            client.put_object(Bucket=bucket, Key=data, Body=b"d" * 100, Metadata={**md, "role": "data"})
            client.put_object(Bucket=bucket, Key=index, Body=b"i" * 10, Metadata={**md, "role": "index"})
            return lid

        def exists(lid: int) -> bool:
            keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}
            return bool(keys & set(object_keys(U, lid)))

        return LedgerBackend(S3OffloadStorage(client, default_bucket=bucket), add, exists,
                             lambda lid, topic: req(topic, lid, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U, driver="aws-s3"))


class TestFileSystemOffload(LedgerStorageContract):
    FOREIGN_STATUS = OwnershipStatus.GONE  # the owner is the directory: another topic's ledger is elsewhere

    @pytest.fixture
    def backend(self, tmp_path: Path) -> LedgerBackend:
        ids = itertools.count(1)
        where = {}

        def add(topic: str) -> int:
            lid = next(ids)
            path = tmp_path / TopicRef.parse(topic).managed_ledger_name / f"{lid}-{U}"
            path.mkdir(parents=True)
            (path / "data").write_bytes(b"x")
            (path / "index").write_bytes(b"y")
            where[lid] = path
            return lid

        return LedgerBackend(FileSystemOffloadStorage(str(tmp_path)), add, lambda lid: lid in where and where[lid].exists(),
                             lambda lid, topic: req(topic, lid, ltype=LedgerType.OFFLOAD_LEDGER, uuid=U, driver="filesystem"))


class TestSnapshotStore(LedgerStorageContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[LedgerBackend]:
        store = DirectorySnapshotStorage(tmp_path / "buckets")
        hooks = SnapshotStoreHooks(store)  # what the worker loads with bucketSnapshotHooks

        def add(topic: str) -> int:
            return store.create_snapshot(b"metadata", [b"segment"], "k", f"persistent://{topic}", "")

        def exists(bid: int) -> bool:
            try:
                store.snapshot_info(bid)
            except SnapshotNotFoundError:
                return False
            return True

        yield LedgerBackend(SnapshotStoreStorage(hooks.delete, hooks.bucket_owner), add, exists,
                            lambda bid, topic: req(topic, bid, LedgerComponent.DELAYED_INDEX_BUCKET))
        store.close()
