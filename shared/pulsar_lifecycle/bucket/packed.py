"""Items held as packed columns instead of one Python object per item.

An item's release key goes into three `array` columns (timestamp, ledger id, index id) and its
framed DelayedIndex bytes into one shared buffer, delimited by an offsets column. A pending item
so costs its bytes plus 32 bytes of columns, where a tuple of ints and a bytes object cost about
200 bytes more and, being small objects allocated among the intake's short-lived ones, kept
CPython's allocator arenas alive after they were freed (the RSS did not come down after a seal).

The framed bytes are exactly what the journal and the snapshot segments hold (codec.py), so
columns move to and from storage without re-encoding. Release keys compare as one int
(`key_int`): timestamp, ledger id and index id in fixed-width fields, the same order as the
tuple (ts, ledger, index id).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

from .codec import (
    DelayedIndex,
    frame,
    index_to_message,
    parse_segment,
    read_varint,
    upgrade_index,
)
from .records import BATCH_BITS, DelayedMessage, ReleaseKey

_TAG = 0x0A  # field 1, length-delimited: one element of SnapshotSegment.indexes / JournalRecord.add


def key_int(ts: int, ledger: int, entry: int) -> int:
    """The release key as one int ordered like the tuple: ledger ids are 64-bit and index ids
    32-bit (records.MAX_ENTRY_ID), so the fields cannot overlap."""
    return (ts << 96) | (ledger << 32) | entry


def frame_offsets(data: bytes, count: int) -> Optional[array]:
    """Start of each of the `count` framed elements of `data` plus its end, or None when `data`
    is not exactly `count` field-1 elements (another field, trailing bytes)."""
    offsets = array("Q")
    pos, end = 0, len(data)
    try:
        for _ in range(count):
            if data[pos] != _TAG:
                return None
            offsets.append(pos)
            length, pos = read_varint(data, pos + 1)
            pos += length
    except IndexError:
        return None
    if pos != end:
        return None
    offsets.append(end)
    return offsets


@dataclass(eq=False)
class PackedItems:
    """Items as columns: row i has release key (ts[i], ledger[i], entry[i]) and framed bytes
    data[offsets[i]:offsets[i + 1]]."""

    ts: array = field(default_factory=lambda: array("Q"))
    ledger: array = field(default_factory=lambda: array("Q"))
    entry: array = field(default_factory=lambda: array("Q"))
    offsets: array = field(default_factory=lambda: array("Q", [0]))
    data: bytearray = field(default_factory=bytearray)

    def __len__(self) -> int:
        return len(self.ts)

    def key(self, row: int) -> ReleaseKey:
        """The release key of row `row`."""
        return (self.ts[row], self.ledger[row], self.entry[row])

    def key_int(self, row: int) -> int:
        """key_int of row `row`."""
        return (self.ts[row] << 96) | (self.ledger[row] << 32) | self.entry[row]

    def framed(self, row: int) -> bytes:
        """The framed DelayedIndex bytes of row `row`."""
        return bytes(self.data[self.offsets[row]:self.offsets[row + 1]])

    def message(self, row: int) -> DelayedMessage:
        """The DelayedMessage of row `row`, decoded from its bytes."""
        start, end = self.offsets[row], self.offsets[row + 1]
        data = self.data
        # Skip the frame: its tag, then its length (one byte below 128 bytes of item).
        inner = start + 2 if data[start + 1] < 0x80 else read_varint(data, start + 1)[1]
        # The bytes were decoded whole when they came in (a segment's parse, the intake's own
        # encoding), so no second check here: this runs once per released message.
        return index_to_message(DelayedIndex.FromString(bytes(data[inner:end])))

    def append_encoded(self, ts: Sequence[int], ledgers: Sequence[int], entries: Sequence[int], data: bytes,
                       offsets: Sequence[int]) -> None:
        """Append rows whose framed bytes are `data` cut at `offsets` (len(ts) + 1 of them, from 0)."""
        base = len(self.data)
        self.ts.extend(ts)
        self.ledger.extend(ledgers)
        self.entry.extend(entries)
        self.data += data
        self.offsets.extend(base + o for o in offsets[1:])

    def append_items(self, items: Sequence[Tuple[int, int, int, bytes]]) -> None:
        """Append engine items (ts, ledger, index id, framed bytes)."""
        for ts, ledger, entry, framed in items:
            self.ts.append(ts)
            self.ledger.append(ledger)
            self.entry.append(entry)
            self.data += framed
            self.offsets.append(len(self.data))


class PackedSegment(PackedItems):
    """A decoded snapshot segment (its items in key order) as columns over its own bytes."""

    @classmethod
    def parse(cls, data: bytes, what: str = "SnapshotSegment") -> "PackedSegment":
        """Decode segment bytes (CorruptRecordError naming `what` when they are not one). A
        layout-1 segment (no batch_index field) is rewritten in layout 2, as the engine keeps
        items (codec.py)."""
        seg = parse_segment(data, what)
        out = cls()
        ts, ledger, entry = out.ts, out.ledger, out.entry
        upgraded = False
        for idx in seg.indexes:
            if not idx.HasField("batch_index"):
                upgrade_index(idx)
                upgraded = True
            ts.append(idx.timestamp)
            ledger.append(idx.ledger_id)
            entry.append((idx.entry_id << BATCH_BITS) | idx.batch_index)
        offsets = None if upgraded else frame_offsets(data, len(ts))
        if offsets is None:
            # Re-framed from the decoded indexes (layout 1, or bytes with other fields): rare.
            blobs = [frame(idx.SerializeToString(deterministic=True)) for idx in seg.indexes]
            data = b"".join(blobs)
            offsets = array("Q", [0])
            for b in blobs:
                offsets.append(offsets[-1] + len(b))
        out.offsets = offsets
        out.data = bytearray(data)
        return out
