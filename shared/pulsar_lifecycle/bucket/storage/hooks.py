"""The ledger-deletion worker's view of a writer's snapshot store (component DELAYED_INDEX_BUCKET).

`snapshot_hooks(user_config)` answers the worker's questions from the writer's own storage:
in use = still listed in the bucket manifest; owner = the topic recorded with the snapshot;
delete = remove it from the snapshot store (missing = success).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from ..codec import Manifest
from . import bookkeeper_snapshot_storage
from .base import BucketSnapshotStorage, SnapshotNotFoundError
from .directory import DirectorySnapshotStorage

__all__ = ["SnapshotStoreHooks", "snapshot_hooks"]


@dataclass
class SnapshotStoreHooks:
    """What LedgerDeletionWorker needs for DELAYED_INDEX_BUCKET requests, over either store."""

    storage: BucketSnapshotStorage

    def is_bucket_in_use(self, bucket_id: int) -> bool:
        raw = self.storage.get_manifest()
        if not raw:
            return False
        manifest = Manifest()
        manifest.ParseFromString(raw)
        return any(ref.bucket_id == bucket_id for ref in manifest.buckets)

    def bucket_owner(self, bucket_id: int) -> Optional[str]:
        try:
            return str(self.storage.snapshot_info(bucket_id).get("topic") or "") or None
        except (SnapshotNotFoundError, FileNotFoundError):
            return None

    def delete(self, bucket_id: int) -> None:
        self.storage.delete(bucket_id)


def snapshot_hooks(user_config: Mapping[str, Any]) -> SnapshotStoreHooks:
    """`bucketSnapshotHooks: pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks`.

    Reads the writer's store: `bucketSnapshotDir` (its `snapshotDir`), or
    `bucketSnapshotStorageServiceUrl` (its `snapshotStorageServiceUrl`, `bk://host:port`) with
    `bucketSnapshotWriter` (its `tenant/namespace/name`) for the BookKeeper table service.
    """
    path = user_config.get("bucketSnapshotDir")
    url = user_config.get("bucketSnapshotStorageServiceUrl")
    writer = user_config.get("bucketSnapshotWriter")
    if path and url:
        raise ValueError("snapshot_hooks: set bucketSnapshotDir or bucketSnapshotStorageServiceUrl, not both")
    if url:
        parts = str(writer or "").split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError("snapshot_hooks with bucketSnapshotStorageServiceUrl needs bucketSnapshotWriter "
                             f"'<tenant>/<namespace>/<name>' of the BucketSnapshotWriter, got {writer!r}")
        if not str(url).startswith("bk://"):
            raise ValueError(f"bucketSnapshotStorageServiceUrl must be bk://host:port, got {url!r}")
        return SnapshotStoreHooks(bookkeeper_snapshot_storage(str(url), *parts))
    if not path:
        raise ValueError("snapshot_hooks needs userConfig bucketSnapshotDir (the BucketSnapshotWriter's snapshotDir) "
                         "or bucketSnapshotStorageServiceUrl + bucketSnapshotWriter (its BookKeeper table service)")
    return SnapshotStoreHooks(DirectorySnapshotStorage(Path(str(path))))
