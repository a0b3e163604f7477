"""The column-wise item encoding and validation (bucket/item_columns.py) against the engine's
per-message functions: encode_framed and DelayedMessage.validate, for random messages with edge
cases (empty and multi-byte strings, keys that are prefixes of each other, ids and times at the
varint and range limits, negative partitions, absent key/target/event time)."""
from __future__ import annotations

from typing import List

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from pulsar_lifecycle.bucket.codec import encode_framed, release_ts
from pulsar_lifecycle.bucket.item_columns import (
    concat,
    encode_framed_columns,
    from_messages,
    invalid_rows,
    release_ts_columns,
    validate_columns,
)
from pulsar_lifecycle.bucket.records import MAX_ENTRY_ID, DelayedMessage

TEXT = st.text(alphabet=st.sampled_from(["a", "b", "_", "é", "\u20ac", "\U0001f600", "\x00", "z"]), max_size=6)
U63 = st.one_of(st.integers(0, 300), st.sampled_from([127, 128, 16383, 16384, (1 << 32) - 1, (1 << 63) - 1]),
                st.integers(0, (1 << 63) - 1))


@st.composite
def messages(draw: st.DrawFn, valid: bool = True) -> DelayedMessage:
    lo = -3 if not valid else 0
    return DelayedMessage(
        ledger_id=draw(st.one_of(U63, st.integers(lo, 0))),
        entry_id=draw(st.one_of(st.integers(lo, 5000), st.sampled_from([MAX_ENTRY_ID] + ([MAX_ENTRY_ID + 1] if not valid else [])))),
        partition=draw(st.integers(-1 if valid else -3, (1 << 31) - 1) | st.just(-1)),
        deliver_at=draw(U63),
        payload=draw(st.binary(max_size=200)),
        key=draw(st.none() | TEXT),
        properties=draw(st.dictionaries(TEXT, TEXT, max_size=5)),
        event_time=draw(st.one_of(st.just(0), U63, st.integers(lo, 0))),
        target=draw(st.none() | TEXT.filter(lambda t: valid is False or t != "")),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), max_size=40), st.integers(0, 1 << 40))
def test_column_encoding_is_encode_framed_row_by_row(msgs: List[DelayedMessage], floor: int) -> None:
    cols = from_messages(msgs)
    ts = release_ts_columns(cols.deliver_at, floor)
    assert ts.tolist() == [release_ts(m.deliver_at, floor) for m in msgs]
    data, offsets = encode_framed_columns(cols, ts)
    assert len(offsets) == len(msgs) + 1
    got = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(msgs))]
    assert got == [encode_framed(m, t) for m, t in zip(msgs, ts.tolist())]


@settings(max_examples=60, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=20), st.lists(messages(), max_size=20), st.data())
def test_take_and_concat_keep_the_rows(a: List[DelayedMessage], b: List[DelayedMessage], data: st.DataObject) -> None:
    both = concat([from_messages(a), from_messages(b)])
    rows = data.draw(st.lists(st.integers(0, len(a) + len(b) - 1), max_size=30))
    taken = both.take(np.array(rows, dtype=np.int64))
    assert [taken.message(i) for i in range(len(rows))] == [(a + b)[r] for r in rows]
    ts = release_ts_columns(taken.deliver_at, 1)
    enc, off = encode_framed_columns(taken, ts)
    assert enc.tobytes() == b"".join(encode_framed((a + b)[r], t) for r, t in zip(rows, ts.tolist()))


def _refused(m: DelayedMessage) -> bool:
    try:
        m.validate()
    except ValueError:
        return True
    return False


@settings(max_examples=150, deadline=None)
@given(st.lists(messages(valid=False), max_size=30))
def test_invalid_rows_are_the_ones_validate_refuses(msgs: List[DelayedMessage]) -> None:
    cols = from_messages(msgs)
    assert invalid_rows(cols).tolist() == [_refused(m) for m in msgs]
    first_bad = next((m for m in msgs if _refused(m)), None)
    if first_bad is None:
        validate_columns(cols)
    else:
        with pytest.raises(ValueError) as got:
            validate_columns(cols)
        with pytest.raises(ValueError) as want:
            first_bad.validate()
        assert str(got.value) == str(want.value)


def test_a_null_property_value_is_refused_like_validate() -> None:
    m = DelayedMessage(ledger_id=1, entry_id=2, partition=-1, deliver_at=3, payload=b"", properties={"a": "x"})
    cols = from_messages([m, m])
    cols.props_values = pa.array(["x", None], pa.string())
    assert invalid_rows(cols).tolist() == [False, True]
    with pytest.raises(ValueError, match="properties must be a dict of str to str"):
        validate_columns(cols)
