"""intake.classify over a whole batch of exported rows (Arrow columns), for the Spark seeder.

The rows that make a plain DelayedMessage — position in range, a valid `__pl_deliver_at__`
within maxDelaySeconds, no cancel, an allowed or no target, no duplicate or null property — are
classified with numpy/pyarrow column operations into ItemColumns, exactly as classify builds the
message (the writer's upstream-dedup and internal properties dropped, `__pl_batch_index__` = "0"
kept for batch index 0, an empty key or target = none). Every other row (cancels, refusals,
anything unusual) goes through classify itself, one row at a time, so the rule for them is the
writer's own by construction. tests/unit/scheduler/test_intake_columns.py checks row by row,
for random rows with the protocol's edge cases, that the result equals classify's.

numpy and pyarrow are optional dependencies (the spark extra); the writer's per-message path
calls classify directly and never imports this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bucket.item_columns import ItemColumns, concat, from_messages, row_any
from ..bucket.records import BATCH_BITS, MAX_BATCH_INDEX, MAX_INDEXABLE_ENTRY_ID, DelayedMessage
from ..scheduling_protocol import BATCH_INDEX_PROP, CANCEL_PROP, DELIVER_AT_PROP, TARGET_PROP
from .intake import DEDUP_PROPERTIES, Intake, classify

# The columns classify_columns reads (what export-backlog writes under these names).
INTAKE_COLUMNS = ("ledger_id", "entry_id", "batch_index", "partition", "payload", "properties", "key", "event_time")
_MAX_FAST_DIGITS = 18  # a deliver-at of up to 18 digits fits int64; longer ones take classify's path
_DROPPED = (TARGET_PROP, BATCH_INDEX_PROP) + tuple(DEDUP_PROPERTIES)
_I64_MAX = (1 << 63) - 1


@dataclass
class ColumnIntake:
    """What classify makes of each row: the messages as columns (in row order; `item_rows` are
    their row numbers), the rows that are cancels or refusals with classify's result."""

    items: ItemColumns
    item_rows: np.ndarray
    others: List[Tuple[int, Intake]] = field(default_factory=list)  # Cancel or Invalid, in row order


def classify_columns(table: Any, now_ms: int, max_delay_ms: int,
                     allowed_target_prefixes: Tuple[str, ...]) -> ColumnIntake:
    """classify() of every row of `table` (a pyarrow Table or RecordBatch with INTAKE_COLUMNS)."""
    n = table.num_rows
    col = _columns(table)
    ledger = _ints(col["ledger_id"])
    entry = _ints(col["entry_id"])
    batch = _ints(col["batch_index"])
    partition = _ints(col["partition"])
    event_time = _ints(col["event_time"].fill_null(0))
    payload = col["payload"]
    props = col["properties"]
    offsets = np.asarray(props.offsets, dtype=np.int64)
    start = int(offsets[0]) if n else 0
    offsets = offsets - start
    keys = props.keys.slice(start, int(offsets[-1]) if n else 0)
    values = props.items.slice(start, int(offsets[-1]) if n else 0)
    if props.null_count:  # a null map holds no properties (classify sees {})
        counts = np.where(np.asarray(props.is_valid(), dtype=bool), np.diff(offsets), 0)
        keep_entry = np.repeat(counts > 0, np.diff(offsets))
        keys, values = keys.filter(pa.array(keep_entry)), values.filter(pa.array(keep_entry))
        offsets = np.concatenate(([0], np.cumsum(counts)))
    counts = np.diff(offsets)
    parent = np.repeat(np.arange(n, dtype=np.int64), counts)

    batch0 = np.maximum(batch, 0)
    fast = (entry >= 0) & (entry <= MAX_INDEXABLE_ENTRY_ID) & (batch0 <= MAX_BATCH_INDEX)
    fast &= np.asarray(payload.is_valid(), dtype=bool)
    if values.null_count:
        fast &= ~row_any(np.asarray(values.is_null(), dtype=bool), offsets)
    if (counts > 1).any():
        fast &= ~_duplicate_keys(parent, keys, offsets)
    fast &= ~row_any(_eq(keys, CANCEL_PROP), offsets)
    deliver_at = np.zeros(n, dtype=np.int64)
    is_deliver = _eq(keys, DELIVER_AT_PROP)
    has_deliver = row_any(is_deliver, offsets)
    fast &= has_deliver
    d_rows = parent[is_deliver]
    d_text = values.filter(pa.array(is_deliver))
    d_len = np.asarray(pc.binary_length(d_text).fill_null(0), dtype=np.int64)
    d_ok = np.asarray(pc.ascii_is_decimal(d_text).fill_null(False), dtype=bool) & (d_len >= 1) & (d_len <= _MAX_FAST_DIGITS)
    fast[d_rows[~d_ok]] = False
    d_good = pa.array(d_ok)
    deliver_at[d_rows[d_ok]] = np.asarray(pc.cast(d_text.filter(d_good), pa.int64()), dtype=np.int64)
    fast &= ~_too_late(deliver_at, now_ms, max_delay_ms)
    is_target = _eq(keys, TARGET_PROP)
    target = pa.nulls(n, pa.string())
    if is_target.any():
        t_rows = parent[is_target]
        t_text = values.filter(pa.array(is_target))
        t_set = np.asarray(pc.binary_length(t_text).fill_null(0), dtype=np.int64) > 0  # "" = no target
        allowed = np.zeros(len(t_rows), dtype=bool)
        for prefix in allowed_target_prefixes:
            allowed |= np.asarray(pc.starts_with(t_text, prefix).fill_null(False), dtype=bool)
        fast[t_rows[t_set & ~allowed]] = False
        where = np.full(n, -1, dtype=np.int64)
        where[t_rows[t_set]] = np.flatnonzero(t_set)
        target = t_text.take(pa.array(where, mask=where < 0))

    rows = np.flatnonzero(fast)
    items = _fast_items(rows, ledger, entry, batch, partition, event_time, deliver_at, payload, col["key"], target,
                        keys, values, offsets, parent)
    if len(rows) == n:
        return ColumnIntake(items, rows)
    others: List[Tuple[int, Intake]] = []
    slow_msgs: List[DelayedMessage] = []
    slow_rows: List[int] = []
    for i in np.flatnonzero(~fast).tolist():
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        properties = dict(zip(keys.slice(lo, hi - lo).to_pylist(), values.slice(lo, hi - lo).to_pylist()))
        res = classify(payload=payload[i].as_py(), properties=properties, key=col["key"][i].as_py(),
                       event_time=int(event_time[i]), position=(int(ledger[i]), int(entry[i]), int(partition[i]),
                                                                int(batch[i])),
                       now_ms=now_ms, max_delay_ms=max_delay_ms, allowed_target_prefixes=allowed_target_prefixes)
        if type(res) is DelayedMessage:
            slow_msgs.append(res)
            slow_rows.append(i)
        else:
            others.append((i, res))
    if slow_msgs:
        all_rows = np.concatenate((rows, np.array(slow_rows, dtype=np.int64)))
        order = np.argsort(all_rows, kind="stable")
        items = concat([items, from_messages(slow_msgs)]).take(order)
        rows = all_rows[order]
    return ColumnIntake(items, rows, others)


def _fast_items(rows: np.ndarray, ledger: np.ndarray, entry: np.ndarray, batch: np.ndarray, partition: np.ndarray,
                event_time: np.ndarray, deliver_at: np.ndarray, payload: pa.Array, key: pa.Array, target: pa.Array,
                keys: pa.Array, values: pa.Array, offsets: np.ndarray, parent: np.ndarray) -> ItemColumns:
    """ItemColumns of the fast rows: classify's DelayedMessage fields, as columns."""
    sel = pa.array(rows)
    fast_row = np.zeros(len(ledger), dtype=bool)
    fast_row[rows] = True
    # The properties classify keeps (the others are the release's business), plus the batch-index
    # marker for batch index 0 (the index id cannot tell it from "not batched").
    keep = fast_row[parent] & ~np.asarray(pc.is_in(keys, pa.array(_DROPPED, pa.string())), dtype=bool)
    marked = rows[batch[rows] == 0]
    k_keys = pa.concat_arrays([keys.filter(pa.array(keep)), pa.array([BATCH_INDEX_PROP] * len(marked), pa.string())])
    k_values = pa.concat_arrays([values.filter(pa.array(keep)), pa.array(["0"] * len(marked), pa.string())])
    k_parent = np.concatenate((parent[keep], marked))
    if len(marked):
        order = np.argsort(k_parent, kind="stable")
        k_keys, k_values, k_parent = k_keys.take(pa.array(order)), k_values.take(pa.array(order)), k_parent[order]
    # Row numbers -> positions among the fast rows (k_parent only holds fast rows).
    position = np.searchsorted(rows, k_parent)
    counts = np.bincount(position, minlength=len(rows)).astype(np.int64)
    key_sel = key.take(sel)
    key_sel = pc.if_else(pc.equal(key_sel, ""), pa.scalar(None, pa.string()), key_sel)  # `key or None`
    return ItemColumns(
        ledger=ledger[rows], index_id=(entry[rows] << BATCH_BITS) | np.maximum(batch[rows], 0),
        partition=partition[rows], deliver_at=deliver_at[rows].astype(np.uint64), event_time=event_time[rows],
        payload=payload.take(sel).cast(pa.binary()), key=key_sel.cast(pa.string()), target=target.take(sel),
        props_offsets=np.concatenate(([0], np.cumsum(counts))).astype(np.int64), props_keys=k_keys,
        props_values=k_values)


def _columns(table: Any) -> dict:
    out = {}
    for name in INTAKE_COLUMNS:
        c = table.column(name)
        out[name] = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
    return out


def _ints(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.fill_null(0) if arr.null_count else arr, dtype=np.int64)


def _eq(strings: pa.Array, value: str) -> np.ndarray:
    return np.asarray(pc.equal(strings, value).fill_null(False), dtype=bool)


def _too_late(deliver_at: np.ndarray, now_ms: int, max_delay_ms: int) -> np.ndarray:
    """classify's `deliver_at - now_ms > max_delay_ms`, without int64 overflow."""
    limit = now_ms + max_delay_ms
    if limit >= _I64_MAX:
        return np.zeros(len(deliver_at), dtype=bool)
    if limit < -_I64_MAX:
        return np.ones(len(deliver_at), dtype=bool)
    return deliver_at > limit


def _duplicate_keys(parent: np.ndarray, keys: pa.Array, offsets: np.ndarray) -> np.ndarray:
    """Rows in which some property key occurs twice (a dict keeps the last: classify's path)."""
    order = np.asarray(pc.sort_indices(pa.table({"p": pa.array(parent), "k": keys}),
                                       sort_keys=[("p", "ascending"), ("k", "ascending")]))
    sp, sk = parent[order], keys.take(pa.array(order))
    same = (sp[1:] == sp[:-1]) & np.asarray(pc.equal(sk.slice(1), sk.slice(0, len(sk) - 1)).fill_null(False),
                                            dtype=bool)
    out = np.zeros(len(offsets) - 1, dtype=bool)
    out[sp[1:][same]] = True
    return out

