"""Confirmed orphans -> phase one of two-phase deletion (PendingDeleteLedgerInfo), never a delete.

Every request carries checkLedgerStillInUse=true, so the deletion worker asks the metadata again
and checks the ledger's own ownership metadata before it deletes anything (a second line of
defence behind the audit's rules). Components PIP-186 has no name for (compacted ledgers,
Pulsar's own bucket-snapshot ledgers) are reported, never enqueued.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ...deletion.model import (
    InvalidRequestError,
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
    TopicRef,
)
from .model import (
    COMP_BUCKET_SNAPSHOT,
    COMP_MANAGED_CURSOR,
    COMP_MANAGED_LEDGER,
    COMP_OFFLOADED,
    COMP_SCHEMA,
    topic_of_managed_ledger,
)

log = logging.getLogger(__name__)


class NotEnqueueable(ValueError):
    """This orphan has no PIP-186 request form (the reason says why); it stays in the report."""


def to_request(row: Mapping[str, Any]) -> PendingDeleteLedgerInfo:
    """The phase-one request for one confirmed orphan row (candidate columns)."""
    comp, owner, lid = row.get("component"), str(row.get("owner") or ""), int(row["ledger_id"])
    store, detail = str(row.get("store") or ""), row.get("detail")
    try:
        if comp == COMP_MANAGED_LEDGER:
            return PendingDeleteLedgerInfo(topic_of_managed_ledger(owner), LedgerComponent.MANAGED_LEDGER,
                                           LedgerType.LEDGER, lid)
        if comp == COMP_MANAGED_CURSOR:
            props = {"cursor": str(detail)} if detail else {}
            return PendingDeleteLedgerInfo(topic_of_managed_ledger(owner), LedgerComponent.MANAGED_CURSOR,
                                           LedgerType.LEDGER, lid, properties=props)
        if comp == COMP_SCHEMA:
            return PendingDeleteLedgerInfo(TopicRef.parse(owner).short_name, LedgerComponent.SCHEMA_STORAGE,
                                           LedgerType.LEDGER, lid)
        if comp == COMP_OFFLOADED:
            if store.startswith("s3://"):
                driver, meta = "aws-s3", {"bucket": store[len("s3://"):]}
            elif store.startswith("file://"):
                driver, meta = "filesystem", {"ManagedLedgerName": str(owner)}
            else:
                raise NotEnqueueable(f"offloaded ledger {lid} in {store!r}: unknown offload driver")
            oc = OffloadContext.from_uuid(str(detail), driver_name=driver, driver_metadata=meta)
            return PendingDeleteLedgerInfo(topic_of_managed_ledger(owner), LedgerComponent.MANAGED_LEDGER,
                                           LedgerType.OFFLOAD_LEDGER, lid, LedgerContext(lid, offload_context=oc))
        if comp == COMP_BUCKET_SNAPSHOT:
            props = {"bucketKey": str(detail)} if detail else {}
            return PendingDeleteLedgerInfo(TopicRef.parse(owner).short_name, LedgerComponent.DELAYED_INDEX_BUCKET,
                                           LedgerType.LEDGER, lid, properties=props)
    except (InvalidRequestError, ValueError) as exc:
        if isinstance(exc, NotEnqueueable):
            raise
        raise NotEnqueueable(f"ledger {lid} ({comp}, owner {owner!r}): {exc}") from exc
    raise NotEnqueueable(f"ledger {lid}: component {comp!r} has no PIP-186 deletion request; report only")


@dataclass
class EnqueueResult:
    """What the enqueue step did."""

    sent: List[Dict[str, Any]] = field(default_factory=list)
    skipped: List[Dict[str, Any]] = field(default_factory=list)  # with "reason"
    failed: Optional[str] = None  # the first send failure (sending stops there)


def enqueue_orphans(rows: Sequence[Mapping[str, Any]], append: Callable[[PendingDeleteLedgerInfo], Any]) -> EnqueueResult:
    """Send each row's request through `append` (LedgerDeletionService.append). Stops at the first
    failed send: the rest stay orphans and are found again by the next scan."""
    result = EnqueueResult()
    for row in rows:
        try:
            info = to_request(row)
        except NotEnqueueable as exc:
            result.skipped.append({**dict(row), "reason": str(exc)})
            continue
        try:
            mid = append(info)
        except Exception as exc:  # PendingDeleteSendError and anything the client raises
            result.failed = f"{info.describe()}: {exc}"
            log.error("event=orphan_enqueue_failed %s error=%s", info.describe(), exc)
            break
        log.info("event=orphan_enqueued %s message=%s", info.describe(), mid)
        result.sent.append({**dict(row), "request": info.describe(), "messageId": str(mid)})
    return result
