"""Phase two's decision procedure, free of Pulsar I/O: one request in, one Decision out.

Order of checks (seeds 000/001, issue 4):
1. decode and validate (malformed, unknown component/type -> DLQ);
2. tenant scope (a tenant's deletion topic may only name that tenant's topics -> else DLQ);
3. in-use check through the oracle (in use or stale cache -> retry later);
4. ownership: the ledger's own metadata must name the request's topic/component (mismatch or
   unverifiable -> DLQ, nothing deleted; gone -> done); skipped for ids this process appended;
5. delete (not found counts as deleted; failure -> retry later).
A retry that would exceed maxRedeliverCount goes to the DLQ instead, with the last reason.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Optional

from .cache import InUseState
from .codec import decode
from .model import InvalidRequestError, PendingDeleteLedgerInfo
from .oracle import InUseVerdict, LedgerInUseOracle
from .ports import DeleteResult, OwnershipStatus, StorageError
from .routing import StorageRouter
from .topics import DeletionTopics, check_tenant
from .trusted import TrustedLedgerRegistry

log = logging.getLogger(__name__)


class Action(enum.Enum):
    """What the adapter does with the message."""

    ACK = "ACK"
    RETRY = "RETRY"  # reconsume later through the RETRY topic
    DEAD_LETTER = "DEAD_LETTER"


class DeletionOutcome(enum.Enum):
    """Why."""

    DELETED = "DELETED"
    ALREADY_GONE = "ALREADY_GONE"
    IN_USE = "IN_USE"
    STALE_CACHE = "STALE_CACHE"
    FAILED = "FAILED"  # transient storage/admin failure
    REJECTED = "REJECTED"  # malformed, unsupported, cross-tenant
    OWNER_MISMATCH = "OWNER_MISMATCH"  # forged or misrouted: never deleted
    UNVERIFIABLE = "UNVERIFIABLE"  # exists without ownership metadata


@dataclass(frozen=True)
class Decision:
    """The engine's answer for one message."""

    action: Action
    outcome: DeletionOutcome
    reason: str
    request: Optional[PendingDeleteLedgerInfo] = None
    attempts: int = 0  # RECONSUMETIMES the message arrived with
    storage: Optional[str] = None
    verdict: Optional[InUseVerdict] = None

    @property
    def next_attempts(self) -> int:
        """RECONSUMETIMES to put on the retry message."""
        return self.attempts + 1


@dataclass
class DeletionEngine:
    """Decides and performs (through the injected oracle and storages) deletions, one per call."""

    oracle: LedgerInUseOracle
    router: StorageRouter
    topics: DeletionTopics
    trusted: Optional[TrustedLedgerRegistry] = None
    max_redeliver_count: int = 10

    def __post_init__(self) -> None:
        if self.max_redeliver_count < 1:
            raise ValueError(f"maxRedeliverCount must be >= 1, got {self.max_redeliver_count}")

    def handle(self, payload: bytes, attempts: int = 0, source_topic: Optional[str] = None,
               request: Optional[PendingDeleteLedgerInfo] = None) -> Decision:
        """Process one message body that arrived `attempts` reconsumes ago on `source_topic`.

        `request` is the payload already decoded (the worker decodes once, to learn the ledger
        before it schedules the deletion); None decodes it here.

        Thread-safe: the worker runs several deletions at once. The oracle's cache loads each
        topic once for all of them and the trusted registry is locked; nothing else here keeps
        state between calls.
        """
        if request is None:
            try:
                request = decode(payload)
            except InvalidRequestError as exc:
                return self._dead(DeletionOutcome.REJECTED, str(exc), None, attempts)
        try:
            if self.topics.scope == "tenant":
                if not source_topic:
                    raise InvalidRequestError("tenant scope: the source topic of the request is unknown")
                check_tenant(self.topics, self.topics.classify(source_topic), request.topic)
            return self._process(request, attempts)
        except InvalidRequestError as exc:
            return self._dead(DeletionOutcome.REJECTED, str(exc), request, attempts)
        except ValueError as exc:  # classify(): not one of our topics
            return self._dead(DeletionOutcome.REJECTED, f"request arrived on a foreign topic: {exc}", request, attempts)

    # ------------------------------------------------------------------------------------------
    def _process(self, req: PendingDeleteLedgerInfo, attempts: int) -> Decision:
        verdict: Optional[InUseVerdict] = None
        if req.check_ledger_still_in_use:
            try:
                verdict = self.oracle.check(req)
            except StorageError as exc:
                return self._retry(DeletionOutcome.FAILED, f"in-use check failed: {exc}", req, attempts)
            if verdict.state is InUseState.IN_USE:
                return self._retry(DeletionOutcome.IN_USE, verdict.detail, req, attempts, verdict=verdict)
            if verdict.state is InUseState.STALE:
                return self._retry(DeletionOutcome.STALE_CACHE, verdict.detail, req, attempts, verdict=verdict)
        storage = self.router.route(req)
        trusted = self.trusted is not None and req.key in self.trusted
        if not trusted:
            try:
                owner = storage.check_owner(req)
            except StorageError as exc:
                return self._retry(DeletionOutcome.FAILED, f"ownership check failed: {exc}", req, attempts, storage.name, verdict)
            if owner.status is OwnershipStatus.MISMATCH:
                log.warning("ownership mismatch %s: %s", req.describe(), owner.detail)
                return self._dead(DeletionOutcome.OWNER_MISMATCH, f"ownership mismatch: {owner.detail}", req, attempts, storage.name, verdict)
            if owner.status is OwnershipStatus.UNVERIFIABLE:
                return self._dead(DeletionOutcome.UNVERIFIABLE, f"ownership unverifiable: {owner.detail}", req, attempts, storage.name, verdict)
            if owner.status is OwnershipStatus.GONE:
                self._forget(req)
                log.info("already gone %s: %s", req.describe(), owner.detail)
                return Decision(Action.ACK, DeletionOutcome.ALREADY_GONE, owner.detail, req, attempts, storage.name, verdict)
        try:
            result = storage.delete(req)
        except StorageError as exc:
            return self._retry(DeletionOutcome.FAILED, f"delete failed: {exc}", req, attempts, storage.name, verdict)
        self._forget(req)
        if result is DeleteResult.NOT_FOUND:
            log.info("already gone %s storage=%s", req.describe(), storage.name)
            return Decision(Action.ACK, DeletionOutcome.ALREADY_GONE, "not found at delete", req, attempts, storage.name, verdict)
        log.info("deleted %s storage=%s trusted=%s", req.describe(), storage.name, trusted)
        return Decision(Action.ACK, DeletionOutcome.DELETED, "deleted", req, attempts, storage.name, verdict)

    def _forget(self, req: PendingDeleteLedgerInfo) -> None:
        if self.trusted is not None:
            self.trusted.discard(req.key)

    def _retry(
        self,
        outcome: DeletionOutcome,
        reason: str,
        req: PendingDeleteLedgerInfo,
        attempts: int,
        storage: Optional[str] = None,
        verdict: Optional[InUseVerdict] = None,
    ) -> Decision:
        if attempts + 1 > self.max_redeliver_count:
            return self._dead(
                outcome, f"gave up after {attempts} retries (maxRedeliverCount={self.max_redeliver_count}): {reason}",
                req, attempts, storage, verdict,
            )
        log.info("retry later %s attempt=%d reason=%s", req.describe(), attempts + 1, reason)
        return Decision(Action.RETRY, outcome, reason, req, attempts, storage, verdict)

    def _dead(
        self,
        outcome: DeletionOutcome,
        reason: str,
        req: Optional[PendingDeleteLedgerInfo],
        attempts: int,
        storage: Optional[str] = None,
        verdict: Optional[InUseVerdict] = None,
    ) -> Decision:
        log.warning("dead-letter %s reason=%s", req.describe() if req else "<undecodable>", reason)
        return Decision(Action.DEAD_LETTER, outcome, reason, req, attempts, storage, verdict)
