"""BookKeeper ledgers through the bookie HTTP admin API (reference §5.2, §5.3).

Endpoints used: DELETE /api/v1/ledger/delete?ledger_id=N, GET /api/v1/ledger/metadata?ledger_id=N
(customMetadata values are base64 byte arrays) and GET /api/v1/ledger/list (`{"<id>": null}`).
A missing ledger makes both metadata and (on metadata-store ledger managers) delete answer 500,
so a 500 is followed by a list probe: absent from the list means already gone.
"""
from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass
from typing import Dict, Sequence, Set

from ..exceptions import LedgerMissing
from ..model import InvalidRequestError, LedgerComponent, PendingDeleteLedgerInfo
from ..ports import DeleteResult, OwnershipCheck, OwnershipStatus, StorageError
from .http import DEFAULT_POOL_SIZE, HttpEndpoints, pooled_session

log = logging.getLogger(__name__)

# Keys Pulsar writes into ledger custom metadata (LedgerMetadataUtils).
KEY_APPLICATION = "application"
KEY_COMPONENT = "component"
KEY_MANAGED_LEDGER = "pulsar/managed-ledger"
KEY_CURSOR = "pulsar/cursor"
KEY_SCHEMA_ID = "pulsar/schemaId"
LEGACY_KEY_MANAGED_LEDGER = "psr/managed-ledger"
LEGACY_KEY_CURSOR = "psr/cursor"
COMPONENT_MANAGED_LEDGER = "managed-ledger"
COMPONENT_SCHEMA = "schema"


@dataclass
class BookieHttpClient:
    """The three bookie HTTP admin calls deletion needs."""

    endpoints: HttpEndpoints

    @classmethod
    def connect(cls, base_urls: Sequence[str], timeout: float = 10.0,
                pool_size: int = DEFAULT_POOL_SIZE) -> "BookieHttpClient":
        """A client for bookies at `base_urls` (e.g. http://bookie-1:8000), for `pool_size` concurrent callers."""
        return cls(HttpEndpoints(list(base_urls), timeout=timeout, session=pooled_session(pool_size)))

    def list_ledger_ids(self) -> Set[int]:
        """Every ledger id the cluster knows."""
        res = self.endpoints.request("GET", "/api/v1/ledger/list")
        if res.status != 200:
            raise StorageError(f"bookie ledger list answered {res.status}: {res.text[:200]!r}")
        body = res.json()
        if not isinstance(body, dict):
            raise StorageError(f"bookie ledger list is not a JSON object: {res.text[:200]!r}")
        try:
            return {int(k) for k in body}
        except ValueError as exc:
            raise StorageError(f"bookie ledger list has a non-numeric id: {exc}") from None

    def exists(self, ledger_id: int) -> bool:
        """Whether the ledger is in the cluster's ledger list."""
        return ledger_id in self.list_ledger_ids()

    def metadata(self, ledger_id: int) -> Dict[str, object]:
        """The ledger's metadata JSON; LedgerMissing when it does not exist."""
        res = self.endpoints.request("GET", "/api/v1/ledger/metadata", params={"ledger_id": ledger_id})
        if res.status == 200:
            body = res.json()
            md = body.get(str(ledger_id)) if isinstance(body, dict) else None
            if not isinstance(md, dict):
                raise StorageError(f"ledger {ledger_id}: metadata answer has no entry for it: {res.text[:200]!r}")
            return md
        if res.status >= 500 and not self.exists(ledger_id):
            raise LedgerMissing(ledger_id)
        raise StorageError(f"ledger {ledger_id}: metadata answered {res.status}: {res.text[:200]!r}")

    def custom_metadata(self, ledger_id: int) -> Dict[str, str]:
        """customMetadata decoded to text (values are base64 of UTF-8 bytes)."""
        raw = self.metadata(ledger_id).get("customMetadata") or {}
        if not isinstance(raw, dict):
            raise StorageError(f"ledger {ledger_id}: customMetadata is not an object")
        out: Dict[str, str] = {}
        for k, v in raw.items():
            try:
                out[k] = base64.b64decode(v, validate=True).decode("utf-8", errors="replace")
            except (binascii.Error, TypeError, ValueError):
                out[k] = str(v)  # tolerate servers that send plain strings
        return out

    def delete(self, ledger_id: int) -> DeleteResult:
        """Delete; a 500 for a ledger that is not in the list counts as already gone."""
        res = self.endpoints.request("DELETE", "/api/v1/ledger/delete", params={"ledger_id": ledger_id})
        if res.status == 200:
            return DeleteResult.DELETED
        if res.status >= 500 and not self.exists(ledger_id):
            return DeleteResult.NOT_FOUND
        raise StorageError(f"ledger {ledger_id}: delete answered {res.status}: {res.text[:200]!r}")


def expected_owner(request: "PendingDeleteLedgerInfo") -> Dict[str, str]:
    """The custom-metadata values a ledger of this request must carry."""
    topic = request.topic
    comp = request.ledger_component
    if comp in (LedgerComponent.MANAGED_LEDGER, LedgerComponent.MANAGED_CURSOR):
        return {KEY_COMPONENT: COMPONENT_MANAGED_LEDGER, KEY_MANAGED_LEDGER: topic.managed_ledger_name}
    if comp is LedgerComponent.SCHEMA_STORAGE:
        return {KEY_COMPONENT: COMPONENT_SCHEMA, KEY_SCHEMA_ID: topic.schema_id}
    raise InvalidRequestError(f"component {comp.value} is not stored as a BookKeeper ledger here")


def compare_owner(request: "PendingDeleteLedgerInfo", md: Dict[str, str]) -> OwnershipCheck:
    """Apply seed 001's safety rule to one ledger's custom metadata."""
    md = dict(md)
    # Old Pulsar wrote psr/...; treat them as the current keys.
    if KEY_MANAGED_LEDGER not in md and LEGACY_KEY_MANAGED_LEDGER in md:
        md[KEY_MANAGED_LEDGER] = md[LEGACY_KEY_MANAGED_LEDGER]
        md.setdefault(KEY_COMPONENT, COMPONENT_MANAGED_LEDGER)
    if KEY_CURSOR not in md and LEGACY_KEY_CURSOR in md:
        md[KEY_CURSOR] = md[LEGACY_KEY_CURSOR]
    want = expected_owner(request)
    owner_keys = (KEY_MANAGED_LEDGER, KEY_SCHEMA_ID, "pulsar/compactedTopic")
    if not any(k in md for k in owner_keys):
        return OwnershipCheck(
            OwnershipStatus.UNVERIFIABLE,
            f"ledger {request.ledger_id} has no ownership metadata (keys: {sorted(md)})",
        )
    found = {k: md.get(k) for k in want}
    if found != want:
        owner = {k: md[k] for k in (KEY_COMPONENT, *owner_keys) if k in md}
        return OwnershipCheck(
            OwnershipStatus.MISMATCH,
            f"ledger {request.ledger_id} belongs to {owner}, request names {want}",
        )
    is_cursor = KEY_CURSOR in md
    if request.ledger_component is LedgerComponent.MANAGED_CURSOR:
        if not is_cursor:
            return OwnershipCheck(OwnershipStatus.MISMATCH, f"ledger {request.ledger_id} is a data ledger, not a cursor ledger")
        cursor = request.properties.get("cursor")
        if cursor is not None and md[KEY_CURSOR] != cursor:
            return OwnershipCheck(
                OwnershipStatus.MISMATCH,
                f"ledger {request.ledger_id} belongs to cursor {md[KEY_CURSOR]!r}, request names {cursor!r}",
            )
    elif request.ledger_component is LedgerComponent.MANAGED_LEDGER and is_cursor:
        return OwnershipCheck(OwnershipStatus.MISMATCH, f"ledger {request.ledger_id} is cursor {md[KEY_CURSOR]!r}'s ledger, not a data ledger")
    return OwnershipCheck(OwnershipStatus.MATCH, f"ledger {request.ledger_id} owned by {want}")


@dataclass
class BookieLedgerStorage:
    """LedgerStorage for ledgers kept in BookKeeper (ledgerType LEDGER)."""

    client: BookieHttpClient
    name: str = "bookkeeper"

    def check_owner(self, request: "PendingDeleteLedgerInfo") -> OwnershipCheck:
        """Compare the ledger's custom metadata with the request."""
        try:
            md = self.client.custom_metadata(request.ledger_id)
        except LedgerMissing:
            return OwnershipCheck(OwnershipStatus.GONE, f"ledger {request.ledger_id} not in BookKeeper")
        return compare_owner(request, md)

    def delete(self, request: "PendingDeleteLedgerInfo") -> DeleteResult:
        """Delete the ledger through a bookie."""
        result = self.client.delete(request.ledger_id)
        log.info("bookkeeper delete topic=%s ledger=%d result=%s", request.topic_name, request.ledger_id, result.value)
        return result
