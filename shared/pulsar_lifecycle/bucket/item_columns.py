"""The engine's item encoding (codec.encode_framed) and DelayedMessage.validate over whole columns.

The Spark seeder turns millions of rows into items: one protobuf message per item costs ~2.5 us
in Python, more than Spark's own share of the job. This module writes the same framed
DelayedIndex bytes with numpy over columns (ItemColumns): the fields in field-number order with
the presence rules of codec.index_fields (key, event_time and target only when set), map entries
in the order the running protobuf's deterministic serialization writes them (probed once, see
_map_order). Nothing here is a second format: tests/unit/bucket/test_item_columns.py checks, for
random messages and edge cases, that encode_framed_columns equals encode_framed item by item and
that invalid_rows flags exactly the messages DelayedMessage.validate refuses.

numpy and pyarrow are optional dependencies (the spark extra); nothing on the writer's import
path imports this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import DelayedIndex
from .records import BATCH_BITS, MAX_BATCH_INDEX, MAX_ENTRY_ID, DelayedMessage

_U8 = np.uint8


@dataclass
class ItemColumns:
    """DelayedMessages as columns, one row per message (the fields of records.DelayedMessage).

    `props_offsets` (n + 1) delimit each row's property entries in `props_keys`/`props_values`;
    within a row the keys are unique (a dict's), in any order.
    """

    ledger: np.ndarray  # int64
    index_id: np.ndarray  # int64: records.index_id(entry, batch index)
    partition: np.ndarray  # int64
    deliver_at: np.ndarray  # uint64
    event_time: np.ndarray  # int64, 0 = none
    payload: pa.Array  # binary
    key: pa.Array  # string, null = no key
    target: pa.Array  # string, null = the writer's default
    props_offsets: np.ndarray  # int64
    props_keys: pa.Array  # string
    props_values: pa.Array  # string (a null value is kept: validate refuses it)

    def __len__(self) -> int:
        return len(self.ledger)

    def take(self, rows: np.ndarray) -> "ItemColumns":
        """These rows, in this order."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = self.props_offsets[rows], self.props_offsets[rows + 1]
        counts = ends - starts
        entries = _ranges(starts, counts)
        idx = pa.array(rows)
        eidx = pa.array(entries)
        return ItemColumns(
            ledger=self.ledger[rows], index_id=self.index_id[rows], partition=self.partition[rows],
            deliver_at=self.deliver_at[rows], event_time=self.event_time[rows],
            payload=self.payload.take(idx), key=self.key.take(idx), target=self.target.take(idx),
            props_offsets=_offsets(counts), props_keys=self.props_keys.take(eidx),
            props_values=self.props_values.take(eidx))

    def message(self, row: int) -> DelayedMessage:
        """Row `row` as a DelayedMessage (for the per-message checks and errors)."""
        lo, hi = int(self.props_offsets[row]), int(self.props_offsets[row + 1])
        keys = self.props_keys.slice(lo, hi - lo).to_pylist()
        values = self.props_values.slice(lo, hi - lo).to_pylist()
        return DelayedMessage(ledger_id=int(self.ledger[row]), entry_id=int(self.index_id[row]),
                              partition=int(self.partition[row]), deliver_at=int(self.deliver_at[row]),
                              payload=self.payload[row].as_py(), key=self.key[row].as_py(),
                              properties=dict(zip(keys, values)), event_time=int(self.event_time[row]),
                              target=self.target[row].as_py())


def from_messages(messages: Sequence[DelayedMessage]) -> ItemColumns:
    """Columns of DelayedMessages (whose fields have the types validate() accepts)."""
    counts = np.fromiter((len(m.properties) for m in messages), np.int64, len(messages))
    return ItemColumns(
        ledger=np.array([m.ledger_id for m in messages], dtype=np.int64),
        index_id=np.array([m.entry_id for m in messages], dtype=np.int64),
        partition=np.array([m.partition for m in messages], dtype=np.int64),
        deliver_at=np.array([m.deliver_at for m in messages], dtype=np.uint64),
        event_time=np.array([m.event_time for m in messages], dtype=np.int64),
        payload=pa.array([bytes(m.payload) for m in messages], pa.binary()),
        key=pa.array([m.key for m in messages], pa.string()),
        target=pa.array([m.target for m in messages], pa.string()),
        props_offsets=_offsets(counts),
        props_keys=pa.array([k for m in messages for k in m.properties], pa.string()),
        props_values=pa.array([v for m in messages for v in m.properties.values()], pa.string()))


def concat(parts: Sequence[ItemColumns]) -> ItemColumns:
    """The rows of `parts`, one after the other."""
    counts = np.concatenate([np.diff(p.props_offsets) for p in parts])
    return ItemColumns(
        ledger=np.concatenate([p.ledger for p in parts]), index_id=np.concatenate([p.index_id for p in parts]),
        partition=np.concatenate([p.partition for p in parts]),
        deliver_at=np.concatenate([p.deliver_at for p in parts]),
        event_time=np.concatenate([p.event_time for p in parts]),
        payload=pa.concat_arrays([p.payload for p in parts]), key=pa.concat_arrays([p.key for p in parts]),
        target=pa.concat_arrays([p.target for p in parts]), props_offsets=_offsets(counts),
        props_keys=pa.concat_arrays([p.props_keys for p in parts]),
        props_values=pa.concat_arrays([p.props_values for p in parts]))


def release_ts_columns(deliver_at: np.ndarray, floor: int) -> np.ndarray:
    """codec.release_ts over a column: deliver_at if deliver_at > floor else floor."""
    return np.maximum(deliver_at.astype(np.uint64), np.uint64(floor))


def invalid_rows(cols: ItemColumns) -> np.ndarray:
    """Boolean mask of the rows DelayedMessage.validate refuses (the columns' types already are
    the ones it wants; what is left are the ranges, an empty target and a null property value)."""
    bad = (cols.ledger < 0) | (cols.index_id < 0) | (cols.index_id > MAX_ENTRY_ID) | (cols.event_time < 0)
    bad |= (cols.partition < -1) | (cols.partition >= (1 << 31))
    target_len = _lengths(cols.target)
    bad |= np.asarray(cols.target.is_valid(), dtype=bool) & (target_len == 0)
    if cols.props_values.null_count:
        bad |= row_any(np.asarray(cols.props_values.is_null(), dtype=bool), cols.props_offsets)
    return bad


def row_any(entry_mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row: does any of its entries (entry_mask[offsets[i]:offsets[i + 1]]) hold?"""
    csum = np.concatenate(([0], np.cumsum(entry_mask, dtype=np.int64)))
    return csum[offsets[1:]] > csum[offsets[:-1]]


def validate_columns(cols: ItemColumns) -> None:
    """DelayedMessage.validate of every row: ValueError naming the first bad row's field."""
    bad = np.flatnonzero(invalid_rows(cols))
    if len(bad):
        cols.message(int(bad[0])).validate()
        raise AssertionError(f"row {bad[0]} flagged invalid but validate() accepted it")  # invalid_rows is wrong


def encode_framed_columns(cols: ItemColumns, ts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets): row i's framed DelayedIndex (= codec.encode_framed(message i, ts[i])) is
    bytes[offsets[i]:offsets[i + 1]]; the rows' items concatenated are a SnapshotSegment."""
    n = len(cols)
    ts = ts.astype(np.uint64)
    ledger = cols.ledger.astype(np.uint64)
    ids = cols.index_id.astype(np.uint64)
    entry, batch = ids >> np.uint64(BATCH_BITS), ids & np.uint64(MAX_BATCH_INDEX)
    event = cols.event_time.astype(np.uint64)
    has_event = event != 0
    part = cols.partition.astype(np.int64)
    zigzag = (((part << 1) ^ (part >> 31)) & 0xFFFFFFFF).astype(np.uint64)  # sint32
    pay_start, pay_len = _starts_lengths(cols.payload)
    key_start, key_len = _starts_lengths(cols.key)
    tgt_start, tgt_len = _starts_lengths(cols.target)
    has_key = np.asarray(cols.key.is_valid(), dtype=bool)
    has_tgt = np.asarray(cols.target.is_valid(), dtype=bool)
    sizes = {name: _varint_len(v) for name, v in (
        ("ts", ts), ("ledger", ledger), ("entry", entry), ("deliver", cols.deliver_at), ("event", event),
        ("part", zigzag), ("batch", batch), ("pay", pay_len), ("key", key_len), ("tgt", tgt_len))}
    props = _PropEntries(cols)
    length = (3 + sizes["ts"] + sizes["ledger"] + sizes["entry"] + 2 + sizes["deliver"] + 2 + sizes["pay"] + pay_len
              + has_key * (2 + sizes["key"] + key_len) + props.row_bytes + has_event * (2 + sizes["event"])
              + has_tgt * (2 + sizes["tgt"] + tgt_len) + 2 + sizes["part"] + 2 + sizes["batch"])
    len_size = _varint_len(length.astype(np.uint64))
    offsets = _offsets(1 + len_size + length)
    out = np.empty(int(offsets[-1]), dtype=_U8)
    if n == 0:
        return out, offsets
    w = _Writer(out, offsets[:-1].copy())
    w.tag(b"\x0a")
    w.varint(length.astype(np.uint64), len_size)
    w.tag(b"\x08")
    w.varint(ts, sizes["ts"])
    w.tag(b"\x10")
    w.varint(ledger, sizes["ledger"])
    w.tag(b"\x18")
    w.varint(entry, sizes["entry"])
    w.tag(b"\xa0\x06")  # 100 deliver_at
    w.varint(cols.deliver_at.astype(np.uint64), sizes["deliver"])
    w.tag(b"\xaa\x06")  # 101 payload
    w.varint(pay_len, sizes["pay"])
    w.copy(_data(cols.payload), pay_start, pay_len)
    w.string(b"\xb2\x06", has_key, _data(cols.key), key_start, key_len, sizes["key"])  # 102 key
    props.write(w)  # 103 properties
    w.masked_varint(b"\xc0\x06", has_event, event, sizes["event"])  # 104 event_time
    w.string(b"\xca\x06", has_tgt, _data(cols.target), tgt_start, tgt_len, sizes["tgt"])  # 105 target
    w.tag(b"\xd0\x06")  # 106 partition
    w.varint(zigzag, sizes["part"])
    w.tag(b"\xd8\x06")  # 107 batch_index
    w.varint(batch, sizes["batch"])
    return out, offsets


class _Writer:
    """Writes one field of every row at the rows' cursors `pos` and advances them."""

    def __init__(self, out: np.ndarray, pos: np.ndarray) -> None:
        self.out = out
        self.pos = pos

    def tag(self, tag: bytes, rows: Optional[np.ndarray] = None) -> None:
        pos = self.pos if rows is None else self.pos[rows]
        for k, b in enumerate(tag):
            self.out[pos + k] = b
        if rows is None:
            self.pos += len(tag)
        else:
            self.pos[rows] += len(tag)

    def varint(self, values: np.ndarray, sizes: np.ndarray, rows: Optional[np.ndarray] = None) -> None:
        if rows is None:
            _put_varint(self.out, self.pos, values.astype(np.uint64), sizes)
            self.pos += sizes
        else:
            _put_varint(self.out, self.pos[rows], values[rows].astype(np.uint64), sizes[rows])
            self.pos[rows] += sizes[rows]

    def copy(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: Optional[np.ndarray] = None) -> None:
        if rows is None:
            _put_bytes(self.out, self.pos, data, starts, lengths)
            self.pos += lengths
        else:
            _put_bytes(self.out, self.pos[rows], data, starts[rows], lengths[rows])
            self.pos[rows] += lengths[rows]

    def masked_varint(self, tag: bytes, mask: np.ndarray, values: np.ndarray, sizes: np.ndarray) -> None:
        if mask.any():
            rows = np.flatnonzero(mask)
            self.tag(tag, rows)
            self.varint(values, sizes, rows)

    def string(self, tag: bytes, mask: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
               sizes: np.ndarray) -> None:
        if mask.any():
            rows = np.flatnonzero(mask)
            self.tag(tag, rows)
            self.varint(lengths.astype(np.uint64), sizes, rows)
            self.copy(data, starts, lengths, rows)


class _PropEntries:
    """Field 103 (map<string, string>): one MapEntry {1: key, 2: value} per property, in the
    order protobuf's deterministic serialization writes them."""

    def __init__(self, cols: ItemColumns) -> None:
        n = len(cols)
        self.offsets = cols.props_offsets
        self.count = int(self.offsets[-1] - self.offsets[0])
        self.row_bytes = np.zeros(n, dtype=np.int64)
        if not self.count:
            return
        counts = np.diff(self.offsets)
        parent = np.repeat(np.arange(n, dtype=np.int64), counts)
        entries = _ranges(self.offsets[:-1], counts)
        keys, values = cols.props_keys.take(pa.array(entries)), cols.props_values.take(pa.array(entries))
        if (counts > 1).any():
            order = _map_entry_order(parent, keys)
            keys, values, parent = keys.take(pa.array(order)), values.take(pa.array(order)), parent[order]
        self.parent = parent
        self.key_start, self.key_len = _starts_lengths(keys)
        self.val_start, self.val_len = _starts_lengths(values)
        self.key_data, self.val_data = _data(keys), _data(values)
        self.key_size, self.val_size = _varint_len(self.key_len), _varint_len(self.val_len)
        self.entry_len = 2 + self.key_size + self.key_len + self.val_size + self.val_len
        self.entry_size = _varint_len(self.entry_len.astype(np.uint64))
        total = 2 + self.entry_size + self.entry_len
        # Row sums of the entries (the entries of a row are contiguous, rows in order).
        csum = np.concatenate(([0], np.cumsum(total)))
        first = np.concatenate(([0], np.cumsum(counts)))
        self.row_bytes = csum[first[1:]] - csum[first[:-1]]
        self.within = csum[:-1] - csum[first[:-1]][parent]  # an entry's offset inside its row's field

    def write(self, w: _Writer) -> None:
        if not self.count:
            return
        sub = _Writer(w.out, w.pos[self.parent] + self.within)
        sub.tag(b"\xba\x06")
        sub.varint(self.entry_len.astype(np.uint64), self.entry_size)
        sub.tag(b"\x0a")
        sub.varint(self.key_len.astype(np.uint64), self.key_size)
        sub.copy(self.key_data, self.key_start, self.key_len)
        sub.tag(b"\x12")
        sub.varint(self.val_len.astype(np.uint64), self.val_size)
        sub.copy(self.val_data, self.val_start, self.val_len)
        w.pos += self.row_bytes


def _probe_map_order() -> str:
    """How this protobuf runtime orders map keys when serializing deterministically: "bytes"
    (plain byte order: the pure-Python and C++ runtimes) or "upb" (a key before its own prefixes:
    "ab" < "a"; upb compares the common prefix, then the longer key first)."""
    idx = DelayedIndex(timestamp=1, ledger_id=1, entry_id=1)
    for k in ("a", "ab", "b"):
        idx.properties[k] = ""
    data = idx.SerializeToString(deterministic=True)
    found = [data.index(b"\x0a" + bytes((len(k),)) + k.encode() + b"\x12") for k in ("a", "ab", "b")]
    a, ab, b = found
    if a < ab < b:
        return "bytes"
    if ab < a < b:
        return "upb"
    raise RuntimeError(f"unknown map-key order of this protobuf runtime: {data!r}")


_MAP_ORDER = _probe_map_order()


def _map_entry_order(parent: np.ndarray, keys: pa.Array) -> np.ndarray:
    """Indexes of the entries ordered by row, then by key as protobuf orders map keys. UTF-8 has
    no 0xFF byte, so key bytes + 0xFF sort a key after every longer key it is a prefix of (upb)."""
    sort_keys = keys.cast(pa.binary())
    if _MAP_ORDER == "upb":
        sort_keys = pc.binary_join_element_wise(sort_keys, pa.scalar(b"\xff", pa.binary()),
                                                        pa.scalar(b"", pa.binary()))
    table = pa.table({"p": pa.array(parent), "k": sort_keys})
    return np.asarray(pc.sort_indices(table, sort_keys=[("p", "ascending"), ("k", "ascending")]))


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenated index ranges [start, start + count)."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    first = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) + np.repeat(starts.astype(np.int64) - first, counts)


def _varint_len(values: np.ndarray) -> np.ndarray:
    """Bytes of the base-128 varint of each value (uint64 or non-negative ints)."""
    v = values.astype(np.uint64)
    size = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        more = v >= np.uint64(1 << (7 * k))
        if not more.any():
            break
        size += more
    return size


def _put_varint(out: np.ndarray, pos: np.ndarray, values: np.ndarray, sizes: np.ndarray) -> None:
    top = int(sizes.max()) if len(sizes) else 0
    for k in range(top):
        byte = ((values >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(_U8)
        byte |= (sizes > k + 1).astype(_U8) << 7
        if k == 0:
            out[pos] = byte
        else:
            sel = sizes > k
            out[pos[sel] + k] = byte[sel]


def _put_bytes(out: np.ndarray, pos: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Copy data[starts[i]:starts[i] + lengths[i]] to out[pos[i]:...] for every row."""
    total = int(lengths.sum())
    if not total:
        return
    first = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64)
    out[within + np.repeat(pos - first, lengths)] = data[within + np.repeat(starts - first, lengths)]


def _starts_lengths(arr: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """Byte starts and lengths of a (large) string/binary array's values (0 for nulls)."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    off = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32, count=n + 1,
                        offset=arr.offset * (8 if wide else 4)).astype(np.int64)
    lengths = np.diff(off)
    if arr.null_count:
        lengths = np.where(np.asarray(arr.is_valid(), dtype=bool), lengths, 0)
    return off[:-1], lengths


def _lengths(arr: pa.Array) -> np.ndarray:
    return _starts_lengths(arr)[1]


def _data(arr: pa.Array) -> np.ndarray:
    """The value bytes of a string/binary array (offsets index into them)."""
    buf = arr.buffers()[2] if len(arr) else None
    return np.frombuffer(buf, dtype=_U8) if buf is not None else np.zeros(0, dtype=_U8)


def as_segments(data: np.ndarray, offsets: np.ndarray, bounds: Sequence[Tuple[int, int]]) -> List[bytes]:
    """The SnapshotSegment bytes of each [start, end) range of encoded rows."""
    return [data[offsets[s]:offsets[e]].tobytes() for s, e in bounds]
