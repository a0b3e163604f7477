"""Encoding between DelayedMessage and the PIP-195 protobufs.

Inside the engine an item is a tuple (ts, ledger_id, entry_id, framed) where `framed` is the
serialized `pulsar.delay.DelayedIndex` (release key + our extension fields) already framed as
one element of a repeated field 1. A SnapshotSegment and a journal add-record are both just
framed items joined, so items move between the journal, the mutable bucket and snapshots
without re-encoding.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

from google.protobuf.message import DecodeError

from .proto import BucketIndexState_pb2 as state_pb2
from .proto import DelayedMessageIndexBucketMetadata_pb2 as metadata_pb2
from .proto import DelayedMessageIndexBucketSegment_pb2 as segment_pb2
from .records import DelayedMessage, ReleaseKey

Item = Tuple[int, int, int, bytes]  # (ts, ledger_id, entry_id, framed serialized DelayedIndex)

DelayedIndex = segment_pb2.DelayedIndex
SnapshotSegment = segment_pb2.SnapshotSegment
SnapshotMetadata = metadata_pb2.SnapshotMetadata
SnapshotSegmentMetadata = metadata_pb2.SnapshotSegmentMetadata
Manifest = state_pb2.Manifest
BucketRef = state_pb2.BucketRef
ReleaseCursor = state_pb2.ReleaseCursor
JournalRecord = state_pb2.JournalRecord
CancelOp = state_pb2.CancelOp

_FIELD1_LEN_TAG = b"\x0a"  # field 1, wire type 2: SnapshotSegment.indexes / JournalRecord.add


class CorruptRecordError(ValueError):
    """Stored bytes could not be decoded as the record they should hold."""


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame(blob: bytes) -> bytes:
    """`blob` as one element of a repeated length-delimited field 1."""
    n = len(blob)
    return _FIELD1_LEN_TAG + (bytes((n,)) if n < 0x80 else varint(n)) + blob


def encode_item(message: DelayedMessage, ts: int) -> bytes:
    """Serialized DelayedIndex for `message` with release-key timestamp `ts`."""
    idx = DelayedIndex(
        timestamp=ts,
        ledger_id=message.ledger_id,
        entry_id=message.entry_id,
        deliver_at=message.deliver_at,
        payload=bytes(message.payload),
        partition=message.partition,
    )
    if message.key is not None:
        idx.key = message.key
    if message.properties:
        idx.properties.update(message.properties)
    if message.event_time:
        idx.event_time = message.event_time
    if message.target is not None:
        idx.target = message.target
    return idx.SerializeToString()


def index_to_message(idx: "segment_pb2.DelayedIndex") -> DelayedMessage:
    """The DelayedMessage an index carries. An index written by Pulsar itself (no extension
    fields) yields an empty payload with deliver_at = timestamp and partition -1."""
    return DelayedMessage(
        ledger_id=idx.ledger_id,
        entry_id=idx.entry_id,
        partition=idx.partition if idx.HasField("partition") else -1,
        deliver_at=idx.deliver_at if idx.HasField("deliver_at") else idx.timestamp,
        payload=idx.payload,
        key=idx.key if idx.HasField("key") else None,
        properties=dict(idx.properties),
        event_time=idx.event_time,
        target=idx.target if idx.HasField("target") else None,
    )


def decode_item(blob: bytes) -> Tuple[ReleaseKey, DelayedMessage]:
    """(release key, message) of a serialized DelayedIndex."""
    idx = parse(DelayedIndex, blob, "DelayedIndex")
    return (idx.timestamp, idx.ledger_id, idx.entry_id), index_to_message(idx)


def encode_framed(message: DelayedMessage, ts: int) -> bytes:
    """frame(encode_item(message, ts)): the item bytes stored in segments and the journal."""
    return frame(encode_item(message, ts))


def release_ts(deliver_at: int, floor: int) -> int:
    """The release-key timestamp of an item added while `floor` is the lowest allowed one
    (last released ts + 1, or the durable horizon + 1 after a restart; 1 on a fresh index)."""
    return deliver_at if deliver_at > floor else floor


def make_item(message: DelayedMessage, ts: int) -> Item:
    """The engine's item for `message` with release-key timestamp `ts`: (ts, ledger, entry, framed)."""
    return (ts, message.ledger_id, message.entry_id, encode_framed(message, ts))


def decode_framed(framed: bytes) -> Tuple[ReleaseKey, DelayedMessage]:
    """(release key, message) of one framed item."""
    seg = parse(SnapshotSegment, framed, "framed DelayedIndex")
    if len(seg.indexes) != 1:
        raise CorruptRecordError(f"framed item holds {len(seg.indexes)} indexes, expected 1")
    idx = seg.indexes[0]
    return (idx.timestamp, idx.ledger_id, idx.entry_id), index_to_message(idx)


def parse(cls, data: bytes, what: str):
    """Parse protobuf `cls` from `data`, raising CorruptRecordError naming `what`."""
    try:
        msg = cls.FromString(bytes(data))
    except (DecodeError, ValueError, TypeError) as exc:
        raise CorruptRecordError(f"cannot decode {what} ({len(data)} bytes): {exc}") from exc
    missing = msg.FindInitializationErrors() if hasattr(msg, "FindInitializationErrors") else []
    if missing:
        raise CorruptRecordError(f"{what} lacks required fields: {', '.join(missing)}")
    return msg


def parse_segment(data: bytes, what: str = "SnapshotSegment") -> "segment_pb2.SnapshotSegment":
    """Decode a snapshot segment (entry >= 1)."""
    return parse(SnapshotSegment, data, what)


def segment_items(segment: "segment_pb2.SnapshotSegment") -> List[Item]:
    """A decoded segment's indexes as engine items (re-serialized and framed, key order kept)."""
    return [(i.timestamp, i.ledger_id, i.entry_id, frame(i.SerializeToString())) for i in segment.indexes]


def join_blobs(blobs: Iterable[bytes]) -> bytes:
    """SnapshotSegment / JournalRecord.add bytes for these serialized DelayedIndex blobs."""
    return b"".join(frame(b) for b in blobs)


def encode_journal_add(blobs: Sequence[bytes]) -> bytes:
    """A JournalRecord holding an add batch."""
    return join_blobs(blobs)


def encode_journal_cancel(ledger_id: int, entry_id: int) -> bytes:
    """A JournalRecord holding one cancel."""
    return JournalRecord(cancel=[CancelOp(ledger_id=ledger_id, entry_id=entry_id)]).SerializeToString()
