"""Ledger storage backends (BookKeeper bookie HTTP, S3, filesystem offloader, snapshot store)
and the Pulsar admin REST client used as the ledger in-use oracle."""
from .base import DeleteResult, LedgerStorage, OwnershipCheck, OwnershipStatus, StorageError

__all__ = ["DeleteResult", "LedgerStorage", "OwnershipCheck", "OwnershipStatus", "StorageError"]
