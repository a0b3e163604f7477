"""classify_columns (scheduler/intake_columns.py) against the writer's per-message classify: for
random exported rows with the protocol's edge cases (malformed, too long, non-ASCII or too late
deliver-at, cancels, targets in and out of the allowed prefixes, empty key/target, dedup and
internal properties, duplicate and null property values, positions out of range, batch index 0
and -1, null maps and event times) every row must come out as classify makes it."""
from __future__ import annotations

from typing import Any, Dict, List

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings

from pulsar_lifecycle.bucket.records import DelayedMessage
from pulsar_lifecycle.dedup.recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY
from pulsar_lifecycle.scheduler.intake import classify
from pulsar_lifecycle.scheduler.intake_columns import INTAKE_COLUMNS, classify_columns
from pulsar_lifecycle.scheduling_protocol import BATCH_INDEX_PROP, CANCEL_PROP, DELIVER_AT_PROP, TARGET_PROP

NOW = 1_767_225_600_000
SCHEMA = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("batch_index", pa.int32()),
                    ("partition", pa.int32()), ("payload", pa.binary()), ("properties", pa.map_(pa.string(), pa.string())),
                    ("key", pa.string()), ("event_time", pa.int64())])
DELIVER = st.one_of(st.integers(0, NOW + 10**7).map(str), st.sampled_from(
    ["", "12a", "+5", " 5", "٥", "0012", "9" * 18, "9" * 19, "18446744073709551616", "-3", str(NOW + 10**9)]))
TARGET = st.sampled_from(["", "persistent://t/ns/out", "persistent://t/other/x", "persistent://t/ns", "non"])
PROP = st.one_of(
    st.tuples(st.just(DELIVER_AT_PROP), DELIVER), st.tuples(st.just(TARGET_PROP), TARGET),
    st.tuples(st.just(CANCEL_PROP), st.sampled_from(["5:6", "5:6:2", "5:4194304", "x", "5:6:1024"])),
    st.tuples(st.sampled_from([BATCH_INDEX_PROP, PRODUCER_PROPERTY, SEQUENCE_PROPERTY, "a", "ab", "é", ""]),
              st.one_of(st.sampled_from(["", "v", "0"]), st.none())))


@st.composite
def rows(draw: st.DrawFn) -> Dict[str, Any]:
    props: List[Any] = draw(st.lists(PROP, max_size=4))
    if draw(st.booleans()):
        props.insert(0, (DELIVER_AT_PROP, str(NOW + draw(st.integers(-1000, 1000)))))
    return {
        "ledger_id": draw(st.integers(0, 1 << 40)),
        "entry_id": draw(st.one_of(st.integers(0, 100), st.sampled_from([-1, 4194303, 4194304]))),
        "batch_index": draw(st.sampled_from([-1, 0, 1, 1023, 1024])),
        "partition": draw(st.sampled_from([-1, 0, 3])),
        "payload": draw(st.binary(max_size=20)),
        "properties": None if draw(st.integers(0, 20)) == 0 else props,
        "key": draw(st.sampled_from([None, "", "k", "é"])),
        "event_time": draw(st.sampled_from([None, 0, 5, NOW])),
    }


def _per_row(r: Dict[str, Any], prefixes: tuple, max_delay_ms: int) -> Any:
    return classify(payload=r["payload"], properties=dict(r["properties"] or []), key=r["key"],
                    event_time=int(r["event_time"] or 0),
                    position=(r["ledger_id"], r["entry_id"], r["partition"], r["batch_index"]),
                    now_ms=NOW, max_delay_ms=max_delay_ms, allowed_target_prefixes=prefixes)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows(), max_size=30), st.sampled_from([(), ("persistent://t/ns/",), ("persistent://t/", "non")]),
       st.sampled_from([0, 5000, 10**12, 1 << 63]), st.integers(0, 3))
def test_classify_columns_is_classify_row_by_row(data: List[Dict[str, Any]], prefixes: tuple, max_delay_ms: int,
                                                 cut: int) -> None:
    table = pa.Table.from_pylist(data, schema=SCHEMA)
    if cut and len(data) > cut:  # a sliced batch (Spark hands over slices of larger buffers)
        table = table.slice(cut)
        data = data[cut:]
    got = classify_columns(table, NOW, max_delay_ms, prefixes)
    want = [_per_row(r, prefixes, max_delay_ms) for r in data]
    result: List[Any] = [None] * len(data)
    for j, row in enumerate(got.item_rows.tolist()):
        result[row] = got.items.message(j)
    for row, res in got.others:
        result[row] = res
    assert result == want
    assert sorted(got.item_rows.tolist()) == got.item_rows.tolist()
    assert all(type(w) is DelayedMessage for w in (want[r] for r in got.item_rows.tolist()))


def test_a_plain_batch_takes_no_per_row_path() -> None:
    n = 1000
    table = pa.table({
        "ledger_id": np.full(n, 7), "entry_id": np.arange(n), "batch_index": pa.array(np.full(n, -1), pa.int32()),
        "partition": pa.array(np.full(n, -1), pa.int32()), "payload": pa.array([b"x"] * n, pa.binary()),
        "properties": pa.array([[(DELIVER_AT_PROP, str(NOW + i))] for i in range(n)], pa.map_(pa.string(), pa.string())),
        "key": pa.nulls(n, pa.string()), "event_time": pa.array(np.zeros(n, np.int64)),
    }).select(list(INTAKE_COLUMNS))
    got = classify_columns(table, NOW, 10**9, ())
    assert got.others == [] and len(got.items) == n
    assert got.items.deliver_at.tolist() == [NOW + i for i in range(n)]
    assert got.items.message(5) == _per_row(table.slice(5, 1).to_pylist()[0], (), 10**9)
