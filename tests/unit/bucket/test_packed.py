"""Packed columns (packed.py) and the mutable bucket built on them: the same order, bytes and
segments as the item tuples they replace."""
from __future__ import annotations

import math
import random
from typing import List, Tuple

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pulsar_lifecycle.bucket import DelayedMessage
from pulsar_lifecycle.bucket.bitmap import LedgerBitmaps
from pulsar_lifecycle.bucket.codec import (
    DelayedIndex,
    SnapshotSegment,
    encode_batch,
    encode_framed,
    frame,
    index_key,
    index_to_message,
    make_item,
    parse_segment,
)
from pulsar_lifecycle.bucket.exceptions import CorruptRecordError
from pulsar_lifecycle.bucket.mutable_bucket import MutableBucket
from pulsar_lifecycle.bucket.packed import PackedSegment, frame_offsets, key_int
from pulsar_lifecycle.bucket.segments import cut_segments

U64 = st.integers(0, (1 << 64) - 1)
U32 = st.integers(0, (1 << 32) - 1)


def msg(ledger: int, entry: int, at: int, **kw) -> DelayedMessage:
    return DelayedMessage(ledger_id=ledger, entry_id=entry, partition=3, deliver_at=at, payload=b"x%d" % entry, **kw)


@settings(max_examples=300, deadline=None)
@given(st.tuples(U64, U64, U32), st.tuples(U64, U64, U32))
def test_key_int_orders_like_the_release_key(a: Tuple[int, int, int], b: Tuple[int, int, int]) -> None:
    assert (key_int(*a) < key_int(*b)) == (a < b)
    assert (key_int(*a) == key_int(*b)) == (a == b)


def test_encode_batch_is_the_framed_items_joined_and_cut_at_each() -> None:
    messages = [msg(1, e, 1000 + e, key="k" if e % 2 else None, properties={"p": "v" * e}) for e in range(40)]
    messages.append(DelayedMessage(2, 7, -1, 5, b"y" * 300))  # a length needing a 2-byte varint
    ts = [m.deliver_at + 1 for m in messages]
    data, offsets = encode_batch(messages, ts)
    framed = [encode_framed(m, t) for m, t in zip(messages, ts)]
    assert data == b"".join(framed)  # the journal record's bytes are unchanged
    assert [data[offsets[k]:offsets[k + 1]] for k in range(len(messages))] == framed
    assert encode_batch([], []) == (b"", type(offsets)("Q", [0]))


def test_frame_offsets_refuses_bytes_that_are_not_only_field_1_elements() -> None:
    data = b"".join(encode_framed(msg(1, e, 10), 10) for e in range(3))
    assert frame_offsets(data, 3) is not None
    assert frame_offsets(data, 2) is None  # trailing element
    assert frame_offsets(data + b"\x10\x01", 3) is None  # another field
    assert frame_offsets(data[:-1], 3) is None  # truncated


def test_a_packed_segment_holds_the_keys_bytes_and_messages_of_its_indexes() -> None:
    items = sorted(make_item(msg(4, e * 1024 + e % 3, 2000 + e // 2, properties={"a": str(e)}), 2000 + e // 2)
                   for e in range(25))
    data = cut_segments(items, 10**9, -1)[0].data
    seg = PackedSegment.parse(data)
    decoded = parse_segment(data).indexes
    assert len(seg) == 25
    assert [seg.key(i) for i in range(25)] == [index_key(i) for i in decoded] == [it[:3] for it in items]
    assert [seg.framed(i) for i in range(25)] == [it[3] for it in items]
    assert [seg.message(i) for i in range(25)] == [index_to_message(i) for i in decoded]
    assert bytes(seg.data) == data  # kept as read, not re-encoded


def test_a_layout_1_segment_is_packed_in_layout_2() -> None:
    # Layout 1: entry_id holds the index id and there is no batch_index field (codec.py).
    old = SnapshotSegment(indexes=[DelayedIndex(timestamp=5, ledger_id=9, entry_id=(3 << 10) | 2, deliver_at=5,
                                                payload=b"p", partition=1)])
    seg = PackedSegment.parse(old.SerializeToString())
    assert seg.key(0) == (5, 9, (3 << 10) | 2)
    idx = DelayedIndex.FromString(seg.framed(0)[2:])
    assert (idx.entry_id, idx.batch_index) == (3, 2)
    assert seg.message(0).entry_id == (3 << 10) | 2 and seg.message(0).payload == b"p"


def test_a_damaged_segment_is_refused_by_name() -> None:
    data = cut_segments([make_item(msg(1, 1, 10), 10)], 10**9, -1)[0].data
    with pytest.raises(CorruptRecordError, match="bucket 7 segment 2"):
        PackedSegment.parse(data[:-3], "bucket 7 segment 2")


def _items(rng: random.Random, n: int, ledger0: int) -> List[tuple]:
    return [make_item(msg(ledger0 + e % 3, e, t), t) for e, t in ((e, rng.randrange(1000, 1100)) for e in range(n))]


@pytest.mark.parametrize("seed", range(5))
def test_mutable_bucket_releases_in_key_order_across_many_adds_and_pops(seed: int) -> None:
    rng = random.Random(seed)
    mb = MutableBucket()
    added: List[tuple] = []
    released: List[tuple] = []
    entry = 0
    for _ in range(120):
        n = rng.choice((1, 1, 2, 5, 30))
        batch = [make_item(msg(1 + rng.randrange(3), entry + k, t), t)
                 for k, t in enumerate(rng.randrange(1000, 1500) for _ in range(n))]
        entry += n
        ts = [it[0] for it in batch]
        data = b"".join(it[3] for it in batch)
        offsets = [0]
        for it in batch:
            offsets.append(offsets[-1] + len(it[3]))
        mb.add_encoded(ts, [it[1] for it in batch], [it[2] for it in batch], data, offsets,
                       min(it[1] for it in batch), max(it[1] for it in batch), now_ms=1)
        added += batch
        # Runs of similar size are merged: never more than about log2(items) of them.
        assert len(mb._runs) <= math.log2(mb.pending + 1) + 2
        for _ in range(rng.randrange(0, 4)):
            if mb.head() is not None:
                smallest = min(set(added) - set(released))
                assert mb.head()[:3] == smallest[:3]
                released.append(mb.pop())
                assert released[-1] == smallest  # the smallest pending item, with its bytes
    rest = [mb.pop() for _ in range(mb.pending)]
    assert rest == sorted(set(added) - set(released)) and mb.head() is None
    assert sorted(released + rest) == sorted(added)  # every item once
    assert len(mb) == len(added) and mb.pending == 0


def test_a_seal_cuts_the_same_segments_from_the_columns_as_from_the_items() -> None:
    rng = random.Random(7)
    mb = MutableBucket()
    items = _items(rng, 300, 20)
    mb.add(items[:100], 20, 22, now_ms=1)
    mb.add(items[100:], 20, 22, now_ms=2)
    for _ in range(40):
        mb.pop()  # released items are still written by a seal
    watermark = sorted(items)[10][:3]
    expected = cut_segments([it for it in sorted(items) if it[:3] > watermark], 20_000, 16)
    got, start, end = mb.segments_after(watermark, 20_000, 16)
    assert [(s.data, s.count, s.first_key, s.last_key) for s in got] == \
        [(s.data, s.count, s.first_key, s.last_key) for s in expected]
    assert [s.metadata.SerializeToString(deterministic=True) for s in got] == \
        [s.metadata.SerializeToString(deterministic=True) for s in expected]
    assert (start, end) == (20, 22)
    assert mb.segments_after(sorted(items)[-1][:3], 20_000, 16) == ([], -1, -1)


def test_frame_is_what_the_columns_cut_at() -> None:
    blob = DelayedIndex(timestamp=1, ledger_id=2, entry_id=3, batch_index=0, payload=b"z" * 200).SerializeToString()
    mb = MutableBucket()
    mb.add([(1, 2, 3 << 10, frame(blob))], 2, 2, now_ms=0)
    assert mb.pop() == (1, 2, 3 << 10, frame(blob))


def test_optimizing_ledger_bitmaps_keeps_the_set_and_shrinks_batched_ids() -> None:
    sets = LedgerBitmaps()
    ids = list(range(20_000))  # index ids: entries of 1,024-message batches
    for ledger in (3, 4, 900):
        sets.add_many(ledger, ids)
    before = sets.size_in_bytes()
    members = list(sets.items())
    sets.optimize(3, 4)  # ledger 900 is outside the range: left as it is
    assert list(sets.items()) == members and len(sets) == 3 * 20_000
    assert sets.size_in_bytes() < before * 2 / 3
    sets.optimize(0, 1 << 40)  # a range wider than the ledgers held: walks the ledgers instead
    assert list(sets.items()) == members and sets.size_in_bytes() < before / 3
