"""The LedgerStorage contract: verify who owns a ledger, then delete it idempotently.

Implementations: BookKeeper through the bookie HTTP admin API (bookie_http), tiered storage on
S3-compatible object stores (s3) and the filesystem offloader (filesystem), and the bucket
scheduler's snapshot store (snapshot).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .exceptions import StorageError
from .model import PendingDeleteLedgerInfo

__all__ = ["DeleteResult", "LedgerStorage", "OwnershipCheck", "OwnershipStatus", "StorageError"]

class OwnershipStatus(enum.Enum):
    """What the ledger's own metadata says about the request."""

    MATCH = "MATCH"  # the ledger belongs to the requested topic and component
    MISMATCH = "MISMATCH"  # it belongs to someone else: never delete
    GONE = "GONE"  # the ledger no longer exists: counts as deleted
    UNVERIFIABLE = "UNVERIFIABLE"  # it exists but carries no ownership metadata


@dataclass(frozen=True)
class OwnershipCheck:
    """Outcome of an ownership check with a human-readable detail for logs and the DLQ."""

    status: OwnershipStatus
    detail: str = ""


class DeleteResult(enum.Enum):
    """Outcome of a successful delete call."""

    DELETED = "DELETED"
    NOT_FOUND = "NOT_FOUND"  # already gone: counts as deleted


@runtime_checkable
class LedgerStorage(Protocol):
    """Where a ledger's bytes live. Both calls raise StorageError on transient failures and
    InvalidRequestError when the request can never be served by this storage."""

    name: str

    def check_owner(self, request: "PendingDeleteLedgerInfo") -> OwnershipCheck:
        """Read the ledger's own metadata and compare it with the request."""

    def delete(self, request: "PendingDeleteLedgerInfo") -> DeleteResult:
        """Delete the ledger; deleting a missing ledger is not an error."""
