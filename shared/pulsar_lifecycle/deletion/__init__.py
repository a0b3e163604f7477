"""Two-phase ledger deletion (PIP-186): phase one (LedgerDeletionService), phase two
(DeletionEngine + DeletionWorkerRunner behind functions/ledger_deletion_worker.py)."""
from .codec import decode, encode
from .model import (
    InvalidRequestError,
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
    TopicRef,
)
from .topics import DeletionTopics

__all__ = [
    "DeletionTopics",
    "InvalidRequestError",
    "LedgerComponent",
    "LedgerContext",
    "LedgerType",
    "OffloadContext",
    "PendingDeleteLedgerInfo",
    "TopicRef",
    "decode",
    "encode",
]
