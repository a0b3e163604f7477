"""Obsolete bucket snapshots deleted through two-phase deletion (PIP-186), both sides.

Writer side: the engine hands each exhausted or merged-away snapshot to `TwoPhaseSnapshotDeleter`,
which appends a DELAYED_INDEX_BUCKET request (ledgerId = bucket id) to the deletion topic.
Worker side: `snapshot_hooks(user_config)` lives in `bucket/storage/hooks.py`; this module
re-exports it under the dotted name configs use (`bucketSnapshotHooks:
pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..bucket.storage.hooks import SnapshotStoreHooks, snapshot_hooks
from ..deletion.model import LedgerComponent, LedgerType
from ..deletion.service import LedgerDeletionService

__all__ = ["SnapshotStoreHooks", "TwoPhaseSnapshotDeleter", "snapshot_hooks"]

log = logging.getLogger(__name__)


@dataclass
class TwoPhaseSnapshotDeleter:
    """on_snapshot_obsolete callback that records a deletion request instead of deleting."""

    service: LedgerDeletionService
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
