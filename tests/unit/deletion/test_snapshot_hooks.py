"""The deletion worker's DELAYED_INDEX_BUCKET hooks over both snapshot stores of the writer.

The BookKeeper variant talks gRPC to the local table-service server (tests/servers), the same
wire format as BookKeeper's stream storage.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, DirectorySnapshotStorage
from pulsar_lifecycle.bucket.storage import bookkeeper_snapshot_storage
from pulsar_lifecycle.scheduler.snapshot_deletion import snapshot_hooks
from servers.bk_table_server import TableServer, start_table_server

TOPIC = "persistent://public/default/sched-hooks"


@pytest.fixture(scope="module")
def bk_server() -> Iterator[TableServer]:
    with start_table_server() as srv:
        yield srv


@pytest.fixture(params=["directory", "bookkeeper"])
def writer_store(request, tmp_path: Path):
    """(the writer's storage, the worker's userConfig pointing at the same store)."""
    if request.param == "directory":
        return DirectorySnapshotStorage(tmp_path / "snap"), {"bucketSnapshotDir": str(tmp_path / "snap")}
    server: TableServer = request.getfixturevalue("bk_server")
    name = f"writer-{tmp_path.name[-12:]}.v1"  # '-' and '.' are not table-name characters
    storage = bookkeeper_snapshot_storage(server.url, "public", "default", name)
    return storage, {"bucketSnapshotStorageServiceUrl": server.url, "bucketSnapshotWriter": f"public/default/{name}"}


def test_hooks_answer_in_use_owner_and_delete_from_the_writers_store(writer_store):
    storage, user_config = writer_store
    obsolete: List[Tuple[int, str]] = []
    ix = BucketIndex(storage, BucketConfig(topic=TOPIC, cursor="c", max_unacked_per_bucket=5),
                     on_snapshot_obsolete=lambda bid, key: obsolete.append((bid, key)))
    ix.recover()
    ix.add([DelayedMessage(1, e, -1, 100 + e, b"x") for e in range(12)])  # two sealed buckets
    live = ix.bucket_ids()
    assert len(live) >= 2
    hooks = snapshot_hooks(user_config)
    assert all(hooks.is_bucket_in_use(b) for b in live)
    assert hooks.bucket_owner(live[0]) == TOPIC
    assert not hooks.is_bucket_in_use(max(live) + 100) and hooks.bucket_owner(max(live) + 100) is None
    # Release and commit everything: the buckets leave the manifest and are handed over.
    got = ix.pop_due(10**13, 100)
    ix.commit(got[-1].seq)
    ix.maybe_seal(10**13)
    gone = [bid for bid, _ in obsolete]
    assert set(live) <= set(gone)
    for bid in live:
        assert not hooks.is_bucket_in_use(bid)
        hooks.delete(bid)
        hooks.delete(bid)  # missing = success
        assert hooks.bucket_owner(bid) is None


def test_hooks_config_errors_name_the_keys(tmp_path: Path):
    with pytest.raises(ValueError, match="bucketSnapshotDir"):
        snapshot_hooks({})
    with pytest.raises(ValueError, match="not both"):
        snapshot_hooks({"bucketSnapshotDir": str(tmp_path), "bucketSnapshotStorageServiceUrl": "bk://127.0.0.1:1"})
    with pytest.raises(ValueError, match="bucketSnapshotWriter"):
        snapshot_hooks({"bucketSnapshotStorageServiceUrl": "bk://127.0.0.1:1", "bucketSnapshotWriter": "only-name"})
    with pytest.raises(ValueError, match="bk://"):
        snapshot_hooks({"bucketSnapshotStorageServiceUrl": "http://x:1", "bucketSnapshotWriter": "a/b/c"})
