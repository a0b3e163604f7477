"""Which storage holds a request's ledger: by component, ledgerType and the offload driver."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .model import InvalidRequestError, LedgerComponent, LedgerType, PendingDeleteLedgerInfo
from .ports import LedgerStorage

S3_DRIVERS = frozenset({"s3", "aws-s3", "aliyun-oss", "s3-compatible"})
FILESYSTEM_DRIVERS = frozenset({"filesystem"})


@dataclass
class StorageRouter:
    """The configured storages; route() picks one or says why none fits."""

    bookkeeper: Optional[LedgerStorage] = None
    s3: Optional[LedgerStorage] = None
    filesystem: Optional[LedgerStorage] = None
    snapshot: Optional[LedgerStorage] = None

    def route(self, request: PendingDeleteLedgerInfo) -> LedgerStorage:
        """The storage for `request`; InvalidRequestError (-> DLQ) when none is configured or known."""
        if request.ledger_component is LedgerComponent.DELAYED_INDEX_BUCKET:
            return self._need(self.snapshot, "snapshot store", request)
        if request.ledger_type is LedgerType.LEDGER:
            return self._need(self.bookkeeper, "BookKeeper (bookie HTTP)", request)
        assert request.context is not None and request.context.offload_context is not None
        driver = (request.context.offload_context.driver_name or "").strip().lower()
        if driver in S3_DRIVERS:
            return self._need(self.s3, "S3 offload", request)
        if driver in FILESYSTEM_DRIVERS:
            return self._need(self.filesystem, "filesystem offload", request)
        if not driver:
            configured = [s for s in (self.s3, self.filesystem) if s is not None]
            if len(configured) == 1:
                return configured[0]
            raise InvalidRequestError(
                f"ledger {request.ledger_id}: offload context names no driver and {len(configured)} offload storages are configured"
            )
        raise InvalidRequestError(f"ledger {request.ledger_id}: offload driver {driver!r} is not supported")

    @staticmethod
    def _need(storage: Optional[LedgerStorage], label: str, request: PendingDeleteLedgerInfo) -> LedgerStorage:
        if storage is None:
            raise InvalidRequestError(f"{request.describe()}: no {label} storage is configured on this worker")
        return storage
