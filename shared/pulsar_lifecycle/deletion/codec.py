"""Avro encoding of PendingDeleteLedgerInfo, decoded with fastavro (never msg.value()).

The writer schema is what Java's `Schema.AVRO(PendingDeleteLedgerInfo.class)` produces (Avro
reflection with always-allow-null; checked with Avro 1.12.1, see tests/java/): fields in
alphabetical order, `checkLedgerStillInUse` a plain boolean, every other field `["null", T]`
with default null, namespace `org.apache.bookkeeper.mledger.deletion`, the enums with the PIP's
symbols only. For the same values the bytes equal Java's (an empty map is written as {}).

Two things Java cannot read travel in `properties` instead (docs/deletion.md, "The record"):
* the offload context: Java cannot encode a non-null `context` (reflection over the protobuf
  LedgerInfo fails), so `context` is always written null and the LedgerInfo goes as JSON (protobuf's
  JSON mapping of MLDataFormats LedgerInfo) under `__pl_ledger_info__`;
* our DELAYED_INDEX_BUCKET component: an unknown enum symbol makes a Java reader fail, so such a
  request has ledgerComponent, ledgerType and ledgerId null (a Java reader finds nothing to
  delete) and `__pl_ledger_component__` / `__pl_ledger_type__` / `__pl_ledger_id__` properties.

Records queued by earlier versions (LEGACY_SCHEMA_DICT: topicName first, our enum symbol, the
context as a record) still decode: their first byte is a union index of a non-null topicName
(0x02), a current record's first byte is the boolean checkLedgerStillInUse (0x00 or 0x01).
"""
from __future__ import annotations

import io
import json
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

# Components and types a Java reader knows (the PIP's enums, in their order).
JAVA_COMPONENTS = ("MANAGED_LEDGER", "MANAGED_CURSOR", "SCHEMA_STORAGE")
JAVA_LEDGER_TYPES = ("LEDGER", "OFFLOAD_LEDGER")

PROP_LEDGER_INFO = "__pl_ledger_info__"
PROP_COMPONENT = "__pl_ledger_component__"
PROP_LEDGER_TYPE = "__pl_ledger_type__"
PROP_LEDGER_ID = "__pl_ledger_id__"
RESERVED_PROPERTIES = (PROP_LEDGER_INFO, PROP_COMPONENT, PROP_LEDGER_TYPE, PROP_LEDGER_ID)

# The branch Java would put after "null" in `context` is Avro 1.10's reflection of the protobuf
# class (1.12.1 cannot build it); no Java writer can fill it, and we never do (it stays null), so
# its shape never reaches the bytes. It is our earlier LedgerInfo record, which lets old records'
# contexts resolve.
_LEDGER_INFO_RECORD: Dict[str, Any] = {
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
                        {"name": "driverMetadata", "type": {"type": "map", "values": "string"}, "default": {}},
                    ],
                },
            ],
            "default": None,
        },
    ],
}

SCHEMA_DICT: Dict[str, Any] = {
    "type": "record",
    "name": "PendingDeleteLedgerInfo",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "checkLedgerStillInUse", "type": "boolean"},
        {"name": "context", "type": ["null", _LEDGER_INFO_RECORD], "default": None},
        {"name": "ledgerComponent",
         "type": ["null", {"type": "enum", "name": "LedgerComponent", "symbols": list(JAVA_COMPONENTS)}],
         "default": None},
        {"name": "ledgerId", "type": ["null", "long"], "default": None},
        {"name": "ledgerType",
         "type": ["null", {"type": "enum", "name": "LedgerType", "symbols": list(JAVA_LEDGER_TYPES)}],
         "default": None},
        {"name": "properties", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "topicName", "type": ["null", "string"], "default": None},
    ],
}

# The writer schema of earlier versions (records may still be queued in it).
LEGACY_SCHEMA_DICT: Dict[str, Any] = {
    "type": "record",
    "name": "PendingDeleteLedgerInfo",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "topicName", "type": ["null", "string"], "default": None},
        {"name": "ledgerComponent",
         "type": ["null", {"type": "enum", "name": "LedgerComponent", "symbols": list(JAVA_COMPONENTS) + [
             "DELAYED_INDEX_BUCKET"]}],
         "default": None},
        {"name": "ledgerType",
         "type": ["null", {"type": "enum", "name": "LedgerType", "symbols": list(JAVA_LEDGER_TYPES)}],
         "default": None},
        {"name": "ledgerId", "type": ["null", "long"], "default": None},
        {"name": "context", "type": ["null", _LEDGER_INFO_RECORD], "default": None},
        {"name": "checkLedgerStillInUse", "type": "boolean", "default": True},
        {"name": "properties", "type": ["null", {"type": "map", "values": "string"}], "default": None},
    ],
}

PARSED_SCHEMA = fastavro.parse_schema(SCHEMA_DICT)
PARSED_LEGACY_SCHEMA = fastavro.parse_schema(LEGACY_SCHEMA_DICT)

_LEGACY_FIRST_BYTE = 0x02  # union branch 1 (string) of the legacy first field, topicName


def ledger_info_json(ctx: LedgerContext) -> str:
    """`ctx` in protobuf's JSON mapping of MLDataFormats.ManagedLedgerInfo.LedgerInfo (int64 as
    strings, driverMetadata as [{key, value}]): Java reads it with JsonFormat.parser()."""
    out: Dict[str, Any] = {"ledgerId": str(ctx.ledger_id), "entries": str(ctx.entries), "size": str(ctx.size),
                           "timestamp": str(ctx.timestamp)}
    oc = ctx.offload_context
    if oc is not None:
        ocd: Dict[str, Any] = {"uidMsb": str(oc.uid_msb), "uidLsb": str(oc.uid_lsb), "complete": oc.complete,
                               "bookkeeperDeleted": oc.bookkeeper_deleted, "timestamp": str(oc.timestamp),
                               "driverMetadata": [{"key": k, "value": v} for k, v in oc.driver_metadata.items()]}
        if oc.driver_name is not None:
            ocd["driverName"] = oc.driver_name
        out["offloadContext"] = ocd
    return json.dumps(out, separators=(",", ":"))


def parse_ledger_info_json(text: str) -> LedgerContext:
    """Inverse of ledger_info_json; InvalidRequestError naming the property when it is not one."""
    try:
        raw = json.loads(text)
        oc = None
        raw_oc = raw.get("offloadContext")
        if raw_oc is not None:
            oc = OffloadContext(
                uid_msb=int(raw_oc["uidMsb"]), uid_lsb=int(raw_oc["uidLsb"]),
                complete=bool(raw_oc.get("complete", False)),
                bookkeeper_deleted=bool(raw_oc.get("bookkeeperDeleted", False)),
                timestamp=int(raw_oc.get("timestamp", 0)), driver_name=raw_oc.get("driverName"),
                driver_metadata={str(kv["key"]): str(kv["value"]) for kv in raw_oc.get("driverMetadata", [])},
            )
        return LedgerContext(ledger_id=int(raw["ledgerId"]), entries=int(raw.get("entries", 0)),
                             size=int(raw.get("size", 0)), timestamp=int(raw.get("timestamp", 0)),
                             offload_context=oc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed request: property {PROP_LEDGER_INFO} is not a LedgerInfo "
                                  f"({type(exc).__name__}: {exc})") from None


def to_record(info: PendingDeleteLedgerInfo) -> Dict[str, Any]:
    """The Avro datum (a dict) for `info`, as Java would write it plus our properties."""
    reserved = [k for k in info.properties if k in RESERVED_PROPERTIES]
    if reserved:
        raise InvalidRequestError(f"properties {reserved} are reserved for the codec")
    props: Dict[str, Optional[str]] = dict(info.properties)
    if info.context is not None:
        props[PROP_LEDGER_INFO] = ledger_info_json(info.context)
    component: Optional[str] = info.ledger_component.value
    ltype: Optional[str] = info.ledger_type.value
    lid: Optional[int] = info.ledger_id
    if component not in JAVA_COMPONENTS:
        # Not a ledger a Java reader knows: leave it nothing to act on.
        props[PROP_COMPONENT], props[PROP_LEDGER_TYPE], props[PROP_LEDGER_ID] = component, ltype, str(lid)
        component = ltype = lid = None
    return {
        "checkLedgerStillInUse": info.check_ledger_still_in_use,
        "context": None,
        "ledgerComponent": component,
        "ledgerId": lid,
        "ledgerType": ltype,
        "properties": props,
        "topicName": info.topic_name,
    }


def encode(info: PendingDeleteLedgerInfo) -> bytes:
    """Schemaless Avro binary, as a Pulsar AVRO producer writes the message payload."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, PARSED_SCHEMA, to_record(info))
    return buf.getvalue()


def _lift_properties(rec: Dict[str, Any]) -> Dict[str, Any]:
    """Move what travels in our reserved properties back into the fields."""
    props = dict(rec.get("properties") or {})
    if not any(k in props for k in RESERVED_PROPERTIES):
        return rec
    rec = dict(rec)
    if PROP_COMPONENT in props or PROP_LEDGER_TYPE in props or PROP_LEDGER_ID in props:
        if rec.get("ledgerComponent") is not None or rec.get("ledgerType") is not None \
                or rec.get("ledgerId") is not None:
            raise InvalidRequestError(f"malformed request: {PROP_COMPONENT}/{PROP_LEDGER_TYPE}/{PROP_LEDGER_ID} "
                                      "properties next to ledgerComponent/ledgerType/ledgerId")
        rec["ledgerComponent"] = props.pop(PROP_COMPONENT, None)
        rec["ledgerType"] = props.pop(PROP_LEDGER_TYPE, None)
        raw_id = props.pop(PROP_LEDGER_ID, None)
        try:
            rec["ledgerId"] = None if raw_id is None else int(raw_id)
        except ValueError:
            raise InvalidRequestError(f"malformed request: {PROP_LEDGER_ID}={raw_id!r} is not an integer") from None
    if PROP_LEDGER_INFO in props:
        if rec.get("context") is not None:
            raise InvalidRequestError(f"malformed request: both context and property {PROP_LEDGER_INFO}")
        rec["context"] = parse_ledger_info_json(props.pop(PROP_LEDGER_INFO))
    rec["properties"] = props
    return rec


def from_record(rec: Dict[str, Any]) -> PendingDeleteLedgerInfo:
    """Validate an Avro datum and build the request; InvalidRequestError names what is wrong."""
    rec = _lift_properties(rec)
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
    if isinstance(raw_ctx, LedgerContext):
        ctx = raw_ctx
    elif raw_ctx is not None:
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
    legacy = len(payload) > 0 and payload[0] == _LEGACY_FIRST_BYTE
    try:
        rec = fastavro.schemaless_reader(buf, PARSED_LEGACY_SCHEMA if legacy else PARSED_SCHEMA, None)
    except Exception as exc:  # fastavro raises many types on garbage (EOF, index, unicode)
        raise InvalidRequestError(f"malformed request: not a PendingDeleteLedgerInfo ({type(exc).__name__}: {exc})") from None
    if buf.tell() != len(payload):
        raise InvalidRequestError(
            f"malformed request: {len(payload) - buf.tell()} trailing bytes after the Avro record"
        )
    if not isinstance(rec, dict):
        raise InvalidRequestError(f"malformed request: not a PendingDeleteLedgerInfo record ({type(rec).__name__})")
    return from_record(rec)
