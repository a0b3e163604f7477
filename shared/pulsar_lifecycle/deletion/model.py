"""The PendingDeleteLedgerInfo record of PIP-186 and the names derived from it.

Field names follow the PIP (topicName, ledgerComponent, ledgerType, ledgerId, context,
checkLedgerStillInUse, properties). `context` mirrors the parts of
MLDataFormats.ManagedLedgerInfo.LedgerInfo that deletion needs: the offload context with the
offload UUID (uidMsb/uidLsb) and the offload driver's name and metadata.
"""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ..topics import TopicName, TopicNameError
from .exceptions import InvalidRequestError

_MASK64 = (1 << 64) - 1
# What Java's URLEncoder leaves alone; Pulsar encodes the local topic name with it.


class LedgerComponent(enum.Enum):
    """Who owns the ledger. DELAYED_INDEX_BUCKET is ours: bucket-scheduler snapshots."""

    MANAGED_LEDGER = "MANAGED_LEDGER"
    MANAGED_CURSOR = "MANAGED_CURSOR"
    SCHEMA_STORAGE = "SCHEMA_STORAGE"
    DELAYED_INDEX_BUCKET = "DELAYED_INDEX_BUCKET"


class LedgerType(enum.Enum):
    """Where the ledger's data lives: BookKeeper (LEDGER) or tiered storage (OFFLOAD_LEDGER)."""

    LEDGER = "LEDGER"
    OFFLOAD_LEDGER = "OFFLOAD_LEDGER"


@dataclass(frozen=True)
class TopicRef(TopicName):
    """A persistent topic named by a deletion request; a bad name is an InvalidRequestError."""

    @classmethod
    def parse(cls, name: str) -> "TopicRef":
        """Accepts `t/ns/topic` (the PIP's form) or `persistent://t/ns/topic`."""
        if isinstance(name, str) and "://" in name and name.split("://", 1)[0] != "persistent":
            raise InvalidRequestError(f"topic {name!r}: only persistent topics own ledgers")
        try:
            t = TopicName.parse(name)
        except TopicNameError as exc:
            raise InvalidRequestError(str(exc)) from None
        return cls(t.tenant, t.namespace, t.local_name)

    @property
    def managed_ledger_name(self) -> str:
        """The persistence name Pulsar writes into `pulsar/managed-ledger` ledger metadata."""
        return self.persistence_name

    @property
    def schema_id(self) -> str:
        """The schema id (`pulsar/schemaId`): the partitioned base name without domain."""
        return self.base.short_name


@dataclass(frozen=True)
class OffloadContext:
    """The offload part of a LedgerInfo: UUID halves plus the driver's name and metadata."""

    uid_msb: int
    uid_lsb: int
    complete: bool = True
    bookkeeper_deleted: bool = False
    timestamp: int = 0
    driver_name: Optional[str] = None
    driver_metadata: Dict[str, str] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        """The UUID as Java's `new UUID(msb, lsb).toString()` prints it."""
        return str(uuid.UUID(int=((self.uid_msb & _MASK64) << 64) | (self.uid_lsb & _MASK64)))

    @classmethod
    def from_uuid(cls, value: str, **kw) -> "OffloadContext":
        """Build the msb/lsb pair from a UUID string (signed 64-bit halves, as Java stores them)."""
        n = uuid.UUID(value).int
        msb, lsb = n >> 64, n & _MASK64
        to_signed = lambda v: v - (1 << 64) if v >= (1 << 63) else v  # noqa: E731
        return cls(uid_msb=to_signed(msb), uid_lsb=to_signed(lsb), **kw)


@dataclass(frozen=True)
class LedgerContext:
    """The LedgerInfo carried as the request's context (None for plain BookKeeper ledgers)."""

    ledger_id: int
    entries: int = 0
    size: int = 0
    timestamp: int = 0
    offload_context: Optional[OffloadContext] = None


@dataclass(frozen=True)
class PendingDeleteLedgerInfo:
    """One pending deletion: the message body of the deletion topic (PIP-186)."""

    topic_name: str
    ledger_component: LedgerComponent
    ledger_type: LedgerType
    ledger_id: int
    context: Optional[LedgerContext] = None
    check_ledger_still_in_use: bool = True
    properties: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.ledger_component, LedgerComponent):
            raise InvalidRequestError(f"unknown ledger component {self.ledger_component!r}")
        if not isinstance(self.ledger_type, LedgerType):
            raise InvalidRequestError(f"unknown ledger type {self.ledger_type!r}")
        if not isinstance(self.ledger_id, int) or isinstance(self.ledger_id, bool) or self.ledger_id < 0:
            raise InvalidRequestError(f"ledger id must be a non-negative integer, got {self.ledger_id!r}")
        TopicRef.parse(self.topic_name)  # raises with the reason
        if self.ledger_type is LedgerType.OFFLOAD_LEDGER:
            if self.context is None or self.context.offload_context is None:
                raise InvalidRequestError(
                    f"ledger {self.ledger_id}: OFFLOAD_LEDGER needs a context with an offload context (UUID)"
                )
            if self.context.ledger_id != self.ledger_id:
                raise InvalidRequestError(
                    f"ledger {self.ledger_id}: context names ledger {self.context.ledger_id}"
                )

    @property
    def topic(self) -> TopicRef:
        """The owning topic, parsed."""
        return TopicRef.parse(self.topic_name)

    @property
    def key(self) -> Tuple[str, int, str, str]:
        """Identity of the deletion (topic, ledger, component, type) for the trusted-id registry."""
        return (self.topic.short_name, self.ledger_id, self.ledger_component.value, self.ledger_type.value)

    @property
    def storage_key(self) -> Tuple[str, int]:
        """The stored thing this request deletes, whatever topic it names.

        BookKeeper ledger ids are cluster-wide, and an offloaded ledger keeps its id, so the id
        with the kind of store identifies it; a forged request for another topic's ledger has the
        same key as the real one. The worker never runs two requests with one key at once.
        """
        kind = "bucket" if self.ledger_component is LedgerComponent.DELAYED_INDEX_BUCKET else self.ledger_type.value
        return (kind, self.ledger_id)

    def describe(self) -> str:
        """Short text with the ids, for log lines and DLQ reasons."""
        return (
            f"topic={self.topic_name} ledger={self.ledger_id} "
            f"component={self.ledger_component.value} type={self.ledger_type.value}"
        )
