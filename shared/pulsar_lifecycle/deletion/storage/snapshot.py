"""The bucket scheduler's snapshot store as a LedgerStorage (component DELAYED_INDEX_BUCKET).

The bucket engine plugs in through callables, so this module depends on nothing of it:
`delete(bucket_id)` removes a snapshot (returning False when it was not there), `owner(bucket_id)`
(optional) names the topic that owns the snapshot, or None when the snapshot does not exist.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from ..model import PendingDeleteLedgerInfo, TopicRef
from ..ports import DeleteResult, OwnershipCheck, OwnershipStatus, StorageError

log = logging.getLogger(__name__)


@dataclass
class SnapshotStoreStorage:
    """Deletes bucket snapshots; the request's ledgerId is the bucket id."""

    delete_fn: Callable[[int], Optional[bool]]
    owner_fn: Optional[Callable[[int], Optional[str]]] = None
    name: str = "snapshot-store"

    def check_owner(self, request: "PendingDeleteLedgerInfo") -> OwnershipCheck:
        """Compare the store's owner record (if it keeps one) with the request's topic."""
        if self.owner_fn is None:
            return OwnershipCheck(OwnershipStatus.MATCH, "snapshot store keeps no owner record; manifest decides")
        try:
            owner = self.owner_fn(request.ledger_id)
        except Exception as exc:  # the store's own errors are transient from our side
            raise StorageError(f"snapshot owner lookup bucket={request.ledger_id}: {exc}") from exc
        if owner is None:
            return OwnershipCheck(OwnershipStatus.GONE, f"bucket {request.ledger_id} has no snapshot")
        if TopicRef.parse(owner).short_name != request.topic.short_name:
            return OwnershipCheck(OwnershipStatus.MISMATCH, f"bucket {request.ledger_id} belongs to {owner}")
        return OwnershipCheck(OwnershipStatus.MATCH, f"bucket {request.ledger_id} owned by {owner}")

    def delete(self, request: "PendingDeleteLedgerInfo") -> DeleteResult:
        """Remove the snapshot."""
        try:
            existed = self.delete_fn(request.ledger_id)
        except Exception as exc:
            raise StorageError(f"snapshot delete bucket={request.ledger_id}: {exc}") from exc
        log.info("snapshot delete topic=%s bucket=%d existed=%s", request.topic_name, request.ledger_id, existed)
        return DeleteResult.NOT_FOUND if existed is False else DeleteResult.DELETED
