"""Avro encoding of PendingDeleteLedgerInfo, decoded with fastavro (never msg.value()).

The schema mirrors what Pulsar's `Schema.AVRO(PendingDeleteLedgerInfo.class)` generates: reflect
with nullable fields (`["null", T]`), the enums LedgerComponent/LedgerType, and the LedgerInfo
context. DELAYED_INDEX_BUCKET is appended as the last LedgerComponent symbol so that readers of
the PIP's three-symbol enum keep their indexes.
"""
from __future__ import annotations

import io
from typing import Any, Dict, Optional

import fastavro

from .model import (
    InvalidRequestError,
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
)

NAMESPACE = "org.apache.bookkeeper.mledger.deletion"

SCHEMA_DICT: Dict[str, Any] = {
    "type": "record",
    "name": "PendingDeleteLedgerInfo",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "topicName", "type": ["null", "string"], "default": None},
        {
            "name": "ledgerComponent",
            "type": [
                "null",
                {
                    "type": "enum",
                    "name": "LedgerComponent",
                    "symbols": [c.value for c in LedgerComponent],
                },
            ],
            "default": None,
        },
        {
            "name": "ledgerType",
            "type": ["null", {"type": "enum", "name": "LedgerType", "symbols": [t.value for t in LedgerType]}],
            "default": None,
        },
        {"name": "ledgerId", "type": ["null", "long"], "default": None},
        {
            "name": "context",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "LedgerInfo",
                    "fields": [
                        {"name": "ledgerId", "type": "long"},
                        {"name": "entries", "type": "long", "default": 0},
                        {"name": "size", "type": "long", "default": 0},
                        {"name": "timestamp", "type": "long", "default": 0},
                        {
                            "name": "offloadContext",
                            "type": [
                                "null",
                                {
                                    "type": "record",
                                    "name": "OffloadContext",
                                    "fields": [
                                        {"name": "uidMsb", "type": "long"},
                                        {"name": "uidLsb", "type": "long"},
                                        {"name": "complete", "type": "boolean", "default": True},
                                        {"name": "bookkeeperDeleted", "type": "boolean", "default": False},
                                        {"name": "timestamp", "type": "long", "default": 0},
                                        {"name": "driverName", "type": ["null", "string"], "default": None},
                                        {
                                            "name": "driverMetadata",
                                            "type": {"type": "map", "values": "string"},
                                            "default": {},
                                        },
                                    ],
                                },
                            ],
                            "default": None,
                        },
                    ],
                },
            ],
            "default": None,
        },
        {"name": "checkLedgerStillInUse", "type": "boolean", "default": True},
        {"name": "properties", "type": ["null", {"type": "map", "values": "string"}], "default": None},
    ],
}

PARSED_SCHEMA = fastavro.parse_schema(SCHEMA_DICT)


def to_record(info: PendingDeleteLedgerInfo) -> Dict[str, Any]:
    """The Avro datum (a dict) for `info`."""
    ctx: Optional[Dict[str, Any]] = None
    if info.context is not None:
        oc = info.context.offload_context
        ctx = {
            "ledgerId": info.context.ledger_id,
            "entries": info.context.entries,
            "size": info.context.size,
            "timestamp": info.context.timestamp,
            "offloadContext": None
            if oc is None
            else {
                "uidMsb": oc.uid_msb,
                "uidLsb": oc.uid_lsb,
                "complete": oc.complete,
                "bookkeeperDeleted": oc.bookkeeper_deleted,
                "timestamp": oc.timestamp,
                "driverName": oc.driver_name,
                "driverMetadata": dict(oc.driver_metadata),
            },
        }
    return {
        "topicName": info.topic_name,
        "ledgerComponent": info.ledger_component.value,
        "ledgerType": info.ledger_type.value,
        "ledgerId": info.ledger_id,
        "context": ctx,
        "checkLedgerStillInUse": info.check_ledger_still_in_use,
        "properties": dict(info.properties) if info.properties else None,
    }


def encode(info: PendingDeleteLedgerInfo) -> bytes:
    """Schemaless Avro binary, as a Pulsar AVRO producer writes the message payload."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, PARSED_SCHEMA, to_record(info))
    return buf.getvalue()


def from_record(rec: Dict[str, Any]) -> PendingDeleteLedgerInfo:
    """Validate an Avro datum and build the request; InvalidRequestError names what is wrong."""
    for required in ("topicName", "ledgerComponent", "ledgerType", "ledgerId"):
        if rec.get(required) is None:
            raise InvalidRequestError(f"malformed request: field {required} is missing")
    try:
        component = LedgerComponent(rec["ledgerComponent"])
    except ValueError:
        raise InvalidRequestError(f"unknown ledger component {rec['ledgerComponent']!r}") from None
    try:
        ltype = LedgerType(rec["ledgerType"])
    except ValueError:
        raise InvalidRequestError(f"unknown ledger type {rec['ledgerType']!r}") from None
    ctx = None
    raw_ctx = rec.get("context")
    if raw_ctx is not None:
        raw_oc = raw_ctx.get("offloadContext")
        oc = None
        if raw_oc is not None:
            oc = OffloadContext(
                uid_msb=raw_oc["uidMsb"],
                uid_lsb=raw_oc["uidLsb"],
                complete=raw_oc.get("complete", True),
                bookkeeper_deleted=raw_oc.get("bookkeeperDeleted", False),
                timestamp=raw_oc.get("timestamp", 0),
                driver_name=raw_oc.get("driverName"),
                driver_metadata=dict(raw_oc.get("driverMetadata") or {}),
            )
        ctx = LedgerContext(
            ledger_id=raw_ctx["ledgerId"],
            entries=raw_ctx.get("entries", 0),
            size=raw_ctx.get("size", 0),
            timestamp=raw_ctx.get("timestamp", 0),
            offload_context=oc,
        )
    return PendingDeleteLedgerInfo(
        topic_name=rec["topicName"],
        ledger_component=component,
        ledger_type=ltype,
        ledger_id=rec["ledgerId"],
        context=ctx,
        check_ledger_still_in_use=bool(rec.get("checkLedgerStillInUse", True)),
        properties=dict(rec.get("properties") or {}),
    )


def decode(payload: bytes) -> PendingDeleteLedgerInfo:
    """Decode a message payload; any malformation raises InvalidRequestError with the cause."""
    if not isinstance(payload, (bytes, bytearray)):
        raise InvalidRequestError(f"malformed request: payload is {type(payload).__name__}, not bytes")
    buf = io.BytesIO(bytes(payload))
    try:
        rec = fastavro.schemaless_reader(buf, PARSED_SCHEMA, None)
    except Exception as exc:  # fastavro raises many types on garbage (EOF, index, unicode)
        raise InvalidRequestError(f"malformed request: not a PendingDeleteLedgerInfo ({type(exc).__name__}: {exc})") from None
    if buf.tell() != len(payload):
        raise InvalidRequestError(
            f"malformed request: {len(payload) - buf.tell()} trailing bytes after the Avro record"
        )
    return from_record(rec)
