"""The errors two-phase deletion raises on purpose, under the package root PulsarLifecycleError."""
from __future__ import annotations

from ..exceptions import PulsarLifecycleError

__all__ = ["DeletionError", "InvalidRequestError", "LedgerMissing", "PendingDeleteSendError", "StorageError"]


class DeletionError(PulsarLifecycleError):
    """Base of the deletion package's errors."""


class InvalidRequestError(DeletionError, ValueError):
    """A pending-delete request that can never be served (goes to the DLQ with this reason)."""


class StorageError(DeletionError, RuntimeError):
    """A transient ledger-storage failure (network, 5xx, throttling): the deletion is retried later."""


class PendingDeleteSendError(DeletionError, RuntimeError):
    """The pending-delete request could not be stored: the caller must NOT update metadata."""


class LedgerMissing(DeletionError):
    """The bookie says this ledger does not exist (BookieHttpClient.metadata; callers treat it as gone)."""
