"""Obsolete bucket snapshots deleted through two-phase deletion (PIP-186), both sides.

Writer side: the engine hands each exhausted or merged-away snapshot to `TwoPhaseSnapshotDeleter`,
which appends a DELAYED_INDEX_BUCKET request (ledgerId = bucket id) to the deletion topic.
Worker side: `snapshot_hooks(user_config)` answers the worker's questions from the writer's own
storage: in use = still listed in the bucket manifest; owner = the topic recorded with the
snapshot; delete = remove it from the snapshot store (missing = success).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from ..bucket.codec import Manifest
from ..bucket.storage import SnapshotNotFoundError
from ..bucket.storage_dir import DirectorySnapshotStorage
from ..deletion.model import LedgerComponent, LedgerType

log = logging.getLogger(__name__)


@dataclass
class TwoPhaseSnapshotDeleter:
    """on_snapshot_obsolete callback that records a deletion request instead of deleting."""

    service: Any  # deletion.service.LedgerDeletionService
    topic_name: str  # the scheduling topic: the snapshot's owner

    def __call__(self, bucket_id: int, bucket_key: str) -> None:
        # A failed send raises: the engine keeps the bucket in pending_delete and retries.
        mid = self.service.append_pending_delete_ledger(
            self.topic_name, bucket_id, None, LedgerComponent.DELAYED_INDEX_BUCKET, LedgerType.LEDGER,
            check_ledger_still_in_use=True, properties={"bucketKey": bucket_key},
        )
        log.info("event=bucket_snapshot_deletion_requested bucket=%d key=%s topic=%s request=%s",
                 bucket_id, bucket_key, self.topic_name, mid)

    def close(self) -> None:
        """Close the deletion service's producers and its DelayedProducer's (before the client)."""
        delayed = getattr(self.service, "delayed", None)
        if delayed is not None:
            delayed.close()
        self.service.close()


@dataclass
class SnapshotStoreHooks:
    """What LedgerDeletionWorker needs for DELAYED_INDEX_BUCKET requests, over either store."""

    storage: Any  # DirectorySnapshotStorage | BookKeeperTableSnapshotStorage

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
        from .factory import bookkeeper_snapshot_storage

        return SnapshotStoreHooks(bookkeeper_snapshot_storage(str(url), *parts))
    if not path:
        raise ValueError("snapshot_hooks needs userConfig bucketSnapshotDir (the BucketSnapshotWriter's snapshotDir) "
                         "or bucketSnapshotStorageServiceUrl + bucketSnapshotWriter (its BookKeeper table service)")
    return SnapshotStoreHooks(DirectorySnapshotStorage(Path(str(path))))
