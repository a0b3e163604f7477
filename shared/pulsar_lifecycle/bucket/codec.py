"""Encoding between DelayedMessage and the PIP-195 protobufs.

Inside the engine an item is a tuple (ts, ledger_id, index_id, framed) where `framed` is the
serialized `pulsar.delay.DelayedIndex` (release key + our extension fields) already framed as
one element of a repeated field 1. A SnapshotSegment and a journal add-record are both just
framed items joined, so items move between the journal, the mutable bucket and snapshots
without re-encoding.

Index-id layouts. The engine keys items by index id (`entry << 10 | batchIndex`, records.py).
Layout 2 (current) writes what Pulsar means: `DelayedIndex.entry_id` is the real entry id and
the batch index goes into extension field `batch_index` (107), always written; layout 1 (before)
wrote the index id into `entry_id` and had no field 107. Readers here accept both: the absence
of field 107 marks a layout-1 index, whose `entry_id` is taken as the index id.
"""
from __future__ import annotations

from array import array
from typing import Iterable, List, Sequence, Tuple, Union

from google.protobuf.message import DecodeError

from .exceptions import CorruptRecordError
from .proto import BucketIndexState_pb2 as state_pb2
from .proto import DelayedMessageIndexBucketMetadata_pb2 as metadata_pb2
from .proto import DelayedMessageIndexBucketSegment_pb2 as segment_pb2
from .records import BATCH_BITS, DelayedMessage, ReleaseKey, split_index_id

Item = Tuple[int, int, int, bytes]  # (ts, ledger_id, index_id, framed serialized DelayedIndex)

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


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(buf: Union[bytes, bytearray, memoryview], i: int) -> Tuple[int, int]:
    """The protobuf varint at `buf[i]`: (value, index after it); IndexError when truncated."""
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def frame(blob: bytes) -> bytes:
    """`blob` as one element of a repeated length-delimited field 1."""
    n = len(blob)
    return _FIELD1_LEN_TAG + (bytes((n,)) if n < 0x80 else varint(n)) + blob


def index_fields(message: DelayedMessage, ts: int) -> dict:
    """The scalar DelayedIndex fields for `message` with release-key timestamp `ts` (layout 2:
    the real entry id in `entry_id`, the batch index in `batch_index`); the properties map is
    set by fill_properties. Together the one mapping behind encode_item and encode_segment."""
    entry_id, batch_index = split_index_id(message.entry_id)
    fields = {"timestamp": ts, "ledger_id": message.ledger_id, "entry_id": entry_id, "batch_index": batch_index,
              "deliver_at": message.deliver_at, "payload": bytes(message.payload), "partition": message.partition}
    if message.key is not None:
        fields["key"] = message.key
    if message.event_time:
        fields["event_time"] = message.event_time
    if message.target is not None:
        fields["target"] = message.target
    return fields


def fill_properties(idx: "segment_pb2.DelayedIndex", message: DelayedMessage) -> None:
    """Copy the message's properties into the index's map (item by item: protobuf's map
    update() and a dict in the constructor go through a pure-Python MutableMapping.update,
    ~0.4 us slower per item)."""
    if message.properties:
        props = idx.properties
        for k, v in message.properties.items():
            props[k] = v


def encode_item(message: DelayedMessage, ts: int) -> bytes:
    """Serialized DelayedIndex for `message` with release-key timestamp `ts`."""
    idx = DelayedIndex(**index_fields(message, ts))
    fill_properties(idx, message)
    return idx.SerializeToString(deterministic=True)


def encode_segment(messages: Sequence[DelayedMessage], ts: Sequence[int]) -> bytes:
    """The SnapshotSegment bytes of these messages in this order: the same bytes as joining
    encode_framed(m, t) of each (a repeated message field is its elements framed and
    concatenated), serialized in one call instead of one per item."""
    seg = SnapshotSegment()
    add = seg.indexes.add
    for m, t in zip(messages, ts):
        fill_properties(add(**index_fields(m, t)), m)
    return seg.SerializeToString(deterministic=True)


def index_id_of(idx: "segment_pb2.DelayedIndex") -> int:
    """The index id of a decoded DelayedIndex, of either layout."""
    if idx.HasField("batch_index"):
        return (idx.entry_id << BATCH_BITS) | idx.batch_index
    return idx.entry_id  # layout 1: entry_id holds the index id


def index_key(idx: "segment_pb2.DelayedIndex") -> ReleaseKey:
    """The release key (timestamp, ledger_id, index_id) of a decoded DelayedIndex."""
    if idx.HasField("batch_index"):
        return (idx.timestamp, idx.ledger_id, (idx.entry_id << BATCH_BITS) | idx.batch_index)
    return (idx.timestamp, idx.ledger_id, idx.entry_id)


def upgrade_index(idx: "segment_pb2.DelayedIndex") -> bool:
    """Rewrite a layout-1 DelayedIndex in place to layout 2; True when it changed."""
    if idx.HasField("batch_index"):
        return False
    idx.entry_id, idx.batch_index = split_index_id(idx.entry_id)
    return True


def upgrade_blob(blob: bytes) -> bytes:
    """A serialized DelayedIndex in layout 2 (the same bytes when it already is)."""
    idx = parse(DelayedIndex, blob, "DelayedIndex")
    return idx.SerializeToString(deterministic=True) if upgrade_index(idx) else bytes(blob)


def index_to_message(idx: "segment_pb2.DelayedIndex") -> DelayedMessage:
    """The DelayedMessage an index carries (`entry_id` = its index id). An index written by
    Pulsar itself (no extension fields) yields an empty payload with deliver_at = timestamp and
    partition -1."""
    # The properties map copied key by key: dict() of a protobuf map goes through the pure-Python
    # Mapping.keys() view, ~2.5x slower (a release from a sealed bucket decodes its message here).
    props = idx.properties
    return DelayedMessage(
        ledger_id=idx.ledger_id,
        entry_id=index_id_of(idx),
        partition=idx.partition if idx.HasField("partition") else -1,
        deliver_at=idx.deliver_at if idx.HasField("deliver_at") else idx.timestamp,
        payload=idx.payload,
        key=idx.key if idx.HasField("key") else None,
        properties={k: props[k] for k in props},
        event_time=idx.event_time,
        target=idx.target if idx.HasField("target") else None,
    )


def decode_item(blob: bytes) -> Tuple[ReleaseKey, DelayedMessage]:
    """(release key, message) of a serialized DelayedIndex."""
    idx = parse(DelayedIndex, blob, "DelayedIndex")
    return index_key(idx), index_to_message(idx)


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


def encode_batch(messages: Sequence[DelayedMessage], ts: Sequence[int]) -> Tuple[bytes, array]:
    """The framed items of `messages` with release-key timestamps `ts`, joined (the bytes of a
    journal add-record and of a SnapshotSegment of them, in this order), and where each starts
    (plus the end): the same bytes as joining encode_framed(m, t) of each, serialized in one
    protobuf call (encode_segment) and cut at the elements' frames here, without a bytes object
    per item: the journal write of an intake batch encodes each scheduling message once."""
    data = encode_segment(messages, ts)
    offsets = array("Q")
    pos = 0
    for _ in range(len(messages)):
        # One element: the field-1 tag byte, the element's length as a varint, the element.
        offsets.append(pos)
        length, i = read_varint(data, pos + 1)
        pos = i + length
    if pos != len(data):  # cannot happen: each message is exactly one element
        raise ValueError(f"encode_batch: {len(data) - pos} bytes left after {len(messages)} items")
    offsets.append(pos)
    return data, offsets


def make_items(messages: Sequence[DelayedMessage], ts: Sequence[int]) -> List[Item]:
    """`[make_item(m, t) for m, t in zip(messages, ts)]`, the same items with the same bytes, the
    batch serialized in one protobuf call (encode_batch)."""
    data, offsets = encode_batch(messages, ts)
    return [(t, m.ledger_id, m.entry_id, data[offsets[k]:offsets[k + 1]])
            for k, (m, t) in enumerate(zip(messages, ts))]


def decode_framed(framed: bytes) -> Tuple[ReleaseKey, DelayedMessage]:
    """(release key, message) of one framed item."""
    seg = parse(SnapshotSegment, framed, "framed DelayedIndex")
    if len(seg.indexes) != 1:
        raise CorruptRecordError(f"framed item holds {len(seg.indexes)} indexes, expected 1")
    idx = seg.indexes[0]
    return index_key(idx), index_to_message(idx)


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
    """A decoded segment's indexes as engine items (re-serialized in layout 2 and framed, key
    order kept)."""
    out = []
    for i in segment.indexes:
        upgrade_index(i)
        out.append(index_item(i))
    return out


def index_item(idx: "segment_pb2.DelayedIndex") -> Item:
    """A decoded layout-2 DelayedIndex as an engine item."""
    return (idx.timestamp, idx.ledger_id, (idx.entry_id << BATCH_BITS) | idx.batch_index,
            frame(idx.SerializeToString(deterministic=True)))


def join_blobs(blobs: Iterable[bytes]) -> bytes:
    """SnapshotSegment / JournalRecord.add bytes for these serialized DelayedIndex blobs."""
    return b"".join(frame(b) for b in blobs)


def encode_journal_add(blobs: Sequence[bytes]) -> bytes:
    """A JournalRecord holding an add batch."""
    return join_blobs(blobs)


def encode_journal_cancel(ledger_id: int, entry_id: int) -> bytes:
    """A JournalRecord holding one cancel."""
    return JournalRecord(cancel=[CancelOp(ledger_id=ledger_id, entry_id=entry_id)]).SerializeToString()
