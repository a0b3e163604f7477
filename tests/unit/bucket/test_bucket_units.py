"""Pure pieces of the bucket engine: keys, bitmaps, protos, segment cutter, merge policy, config."""
from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyroaring import BitMap

from pulsar_lifecycle.bucket import BucketConfig, DelayedMessage
from pulsar_lifecycle.bucket.bitmap import LedgerBitmaps, deserialize_bitmap, serialize_bitmap
from pulsar_lifecycle.bucket.codec import (
    CorruptRecordError,
    DelayedIndex,
    JournalRecord,
    SnapshotMetadata,
    SnapshotSegment,
    SnapshotSegmentMetadata,
    decode_item,
    encode_item,
    encode_journal_add,
    encode_segment,
    frame,
    join_blobs,
    make_item,
    make_items,
    parse,
)
from pulsar_lifecycle.bucket.keys import bucket_key, is_bucket_key, parse_bucket_key
from pulsar_lifecycle.bucket.merge_policy import select_merge_window
from pulsar_lifecycle.bucket.positions import encode
from pulsar_lifecycle.bucket.records import index_id
from pulsar_lifecycle.bucket.segments import SegmentCutter, cut_bounds, cut_segments, snapshot_metadata
from pulsar_lifecycle.scheduling_protocol import (
    CANCEL_PROP,
    DELIVER_AT_PROP,
    ORIGIN_MSG_ID_PROP,
    TARGET_PROP,
    ProtocolError,
    format_origin_msg_id,
    parse_cancel_target,
    parse_deliver_at,
    parse_origin_msg_id,
)
from support.paths import REPO

PROTO_DIR = REPO / "shared" / "pulsar_lifecycle" / "bucket" / "proto"


def item(ts, ledger, entry, payload=b""):
    m = DelayedMessage(ledger, entry, -1, ts, payload)
    return (ts, ledger, entry, frame(encode_item(m, ts)))


# -- bucket key --------------------------------------------------------------------------------

def test_bucket_key_is_pulsars_format():
    assert bucket_key(1234, 1240) == "#pulsar.internal.delayed.bucket_1234_1240"
    assert parse_bucket_key("#pulsar.internal.delayed.bucket_1234_1240") == (1234, 1240)
    assert bucket_key(7, 7) == "#pulsar.internal.delayed.bucket_7_7"
    assert is_bucket_key(bucket_key(0, 9))


@pytest.mark.parametrize("bad", [
    "#pulsar.internal.delayed.bucket_1", "#pulsar.internal.delayed.bucket_1_2_3", "other_1_2",
    "#pulsar.internal.delayed.bucket_a_2", "#pulsar.internal.delayed.bucket_5_2",
    "#pulsar.internal.delayed.bucket_-1_2",
])
def test_bad_bucket_keys_are_rejected(bad):
    assert not is_bucket_key(bad)
    with pytest.raises(ValueError, match="bucket key"):
        parse_bucket_key(bad)


def test_bucket_key_arguments_are_checked():
    with pytest.raises(ValueError, match="empty"):
        bucket_key(5, 4)
    with pytest.raises(ValueError, match="non-negative"):
        bucket_key(-1, 4)


# -- bitmaps -------------------------------------------------------------------------------------

def test_bitmap_bytes_match_javas_portable_format():
    # RoaringFormatSpec, as org.roaringbitmap.RoaringBitmap.serialize writes it:
    # cookie 12346 (no run containers), 1 container, key 0 / cardinality-1 = 2, offset 16, values.
    assert serialize_bitmap(BitMap([1, 2, 3])) == bytes.fromhex("3a300000010000000000020010000000010002000300")
    # runOptimize()d [0, 100): cookie 12347 | (containers-1) << 16, run flags, key/card, 1 run (0, len-1=99).
    assert serialize_bitmap(BitMap(range(100))) == bytes.fromhex("3b3000000100006300010000006300")


def test_bitmap_round_trip_and_errors():
    bm = BitMap([0, 5, 65536, 70000, 2**32 - 1] + list(range(1000, 5000)))
    assert deserialize_bitmap(serialize_bitmap(bm)) == bm
    with pytest.raises(ValueError, match="RoaringBitmap"):
        deserialize_bitmap(b"\x01\x02\x03")


def test_ledger_bitmaps_set_operations():
    s = LedgerBitmaps()
    assert s.add(1, 5) and not s.add(1, 5)
    s.add(2, 7)
    assert s.contains(1, 5) and (2, 7) in s and not s.contains(3, 1) and len(s) == 2
    assert s.discard(1, 5) and not s.discard(1, 5) and len(s) == 1
    t = LedgerBitmaps.from_proto_map(s.to_proto_map())
    assert list(t.items()) == [(2, 7)]
    s.update_ledger(2, BitMap([7, 8, 9]))
    assert len(s) == 3
    other = LedgerBitmaps()
    other.add(2, 8)
    other.add(4, 1)
    assert list(s.intersection(other).items()) == [(2, 8)]
    with pytest.raises(ValueError, match="ledger 9"):
        LedgerBitmaps.from_proto_map({9: b"junk"})


def test_ledger_bitmaps_hold_packed_ids_and_speak_index_ids():
    ids = [index_id(e, -1) for e in range(0, 20_000)] + [index_id(e, b) for e in (3, 70_000) for b in (0, 1, 1023)]
    s = LedgerBitmaps()
    s.add_many(5, ids)
    assert len(s) == len(set(ids)) and all(s.contains(5, i) for i in ids)
    assert not s.contains(5, index_id(4, 1)) and not s.contains(5, index_id(20_000, 0) + 1)
    assert [e for _, e in s.items()] == sorted(set(ids))  # index-id order, whatever the packing
    # the manifest's format-1 maps (index ids) and format-2 maps (packed) give the same set
    old = {5: serialize_bitmap(BitMap(ids))}
    assert list(LedgerBitmaps.from_proto_map(old, packed=False).items()) == list(s.items())
    assert list(LedgerBitmaps.from_proto_map(s.to_proto_map()).items()) == list(s.items())
    # dense in memory: 20,000 unbatched ids as index ids (1,024 apart) would take ~40 KB
    assert s.size_in_bytes() < 10_000
    assert s.discard(5, index_id(70_000, 1023)) and not s.contains(5, index_id(70_000, 1023))


# -- protos --------------------------------------------------------------------------------------

def test_protos_round_trip():
    msg = DelayedMessage(ledger_id=2**40, entry_id=12, partition=3, deliver_at=1_700_000_000_123,
                         payload=b"\x00body", key="k", properties={"a": "1", "__pl_target__": "x"},
                         event_time=99, target="persistent://t/n/out")
    blob = encode_item(msg, 1_700_000_000_200)
    key, back = decode_item(blob)
    assert key == (1_700_000_000_200, 2**40, 12)
    assert back == msg
    none = DelayedMessage(1, 2, -1, 5, b"")
    assert decode_item(encode_item(none, 5))[1] == none
    seg = SnapshotSegment.FromString(join_blobs([blob, encode_item(none, 6)]))
    # entry_id holds the real entry id (index id >> 10), the batch index is field 107
    assert [(i.entry_id, i.batch_index) for i in seg.indexes] == [(0, 12), (0, 2)]
    batched = DelayedMessage(3, index_id(70_000, 5), -1, 5, b"b")
    idx = DelayedIndex.FromString(encode_item(batched, 5))
    assert (idx.entry_id, idx.batch_index) == (70_000, 5)
    assert decode_item(idx.SerializeToString())[0] == (5, 3, index_id(70_000, 5))
    meta = SnapshotMetadata(metadata_list=[SnapshotSegmentMetadata(
        delayed_index_bit_map={7: serialize_bitmap(BitMap([1, 2]))}, max_schedule_timestamp=9,
        min_schedule_timestamp=3)])
    again = SnapshotMetadata.FromString(meta.SerializeToString())
    assert deserialize_bitmap(again.metadata_list[0].delayed_index_bit_map[7]) == BitMap([1, 2])
    rec = JournalRecord.FromString(encode_journal_add([blob]))
    assert DelayedIndex.FromString(rec.add[0]) == DelayedIndex.FromString(blob)


def test_required_fields_are_checked():
    with pytest.raises(CorruptRecordError, match="required|decode"):
        parse(SnapshotSegmentMetadata, b"", "segment metadata")
    with pytest.raises(CorruptRecordError, match="decode"):
        parse(SnapshotSegment, b"\x0a\xff\xff", "segment")


def test_extension_fields_do_not_collide_and_pulsar_parser_reads_the_key():
    fields = {f.number: f.name for f in DelayedIndex.DESCRIPTOR.fields}
    assert fields[1] == "timestamp" and fields[2] == "ledger_id" and fields[3] == "entry_id"
    assert all(n >= 100 for n in fields if n > 3)  # 4 = PR #23907's delayed_operation_type
    assert all(not f.is_required for f in DelayedIndex.DESCRIPTOR.fields if f.number >= 100)
    # Pulsar's own DelayedIndex (fields 1..3 only) in a separate pool parses our bytes.
    fdp = descriptor_pb2.FileDescriptorProto(name="pulsar_only.proto", package="pulsar.delay", syntax="proto2")
    m = fdp.message_type.add(name="DelayedIndex")
    for number, name in ((1, "timestamp"), (2, "ledger_id"), (3, "entry_id")):
        m.field.add(name=name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_REQUIRED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    PulsarIndex = message_factory.GetMessageClass(pool.FindMessageTypeByName("pulsar.delay.DelayedIndex"))
    blob = encode_item(DelayedMessage(5, index_id(6, 3), 1, 100, b"payload", properties={"x": "y"}, target="t"), 123)
    theirs = PulsarIndex.FromString(blob)
    assert (theirs.timestamp, theirs.ledger_id, theirs.entry_id) == (123, 5, 6)
    assert theirs.IsInitialized()


def test_generated_code_is_up_to_date(tmp_path: Path):
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    assert protos == ["BucketIndexState.proto", "DelayedMessageIndexBucketMetadata.proto",
                      "DelayedMessageIndexBucketSegment.proto"]
    subprocess.run([sys.executable, str(PROTO_DIR.parents[3] / "scripts" / "gen_protos.py"), str(tmp_path)],
                   check=True, timeout=120)
    for name in protos:
        gen = name.replace(".proto", "_pb2.py")
        assert filecmp.cmp(tmp_path / gen, PROTO_DIR / gen, shallow=False), f"{gen} is stale: regenerate it"


# -- segment cutter ------------------------------------------------------------------------------

def test_cut_by_time_step():
    # step 10 ms: the first index at 100 sets upper = 109; 110 opens a new segment.
    items = [item(t, 1, e) for e, t in enumerate([100, 105, 109, 110, 119, 120])]
    segs = cut_segments(items, 10, -1)
    assert [(s.min_ts, s.max_ts, s.count) for s in segs] == [(100, 109, 3), (110, 119, 2), (120, 120, 1)]


def test_cut_by_count_and_equal_timestamps():
    items = [item(100, 1, e) for e in range(7)]
    segs = cut_segments(items, 300_000, 3)
    assert [s.count for s in segs] == [3, 3, 1]
    assert [s.last_key for s in segs] == [(100, 1, 2), (100, 1, 5), (100, 1, 6)]
    assert [s.count for s in cut_segments(items, 300_000, -1)] == [7]


def test_cut_matches_pulsar_rule_on_mixed_input():
    # Reference: Pulsar's loop with look-ahead, written out literally.
    import random

    rnd = random.Random(7)
    keys = sorted({(rnd.randrange(0, 5000), rnd.randrange(1, 4), rnd.randrange(0, 500)) for _ in range(700)})
    items = [item(*k) for k in keys]
    step, max_idx = 300, 40
    expected, cur, upper = [], [], None
    for i, k in enumerate(keys):
        if not cur:
            upper = k[0] + step - 1
        cur.append(k)
        nxt = keys[i + 1] if i + 1 < len(keys) else None
        if nxt is None or nxt[0] > upper or len(cur) >= max_idx:
            expected.append(cur)
            cur = []
    segs = cut_segments(items, step, max_idx)
    assert [(s.first_key, s.last_key, s.count) for s in segs] == [(c[0], c[-1], len(c)) for c in expected]


def test_segment_metadata_has_per_ledger_bitmaps_of_its_own_indexes():
    # index ids: ledger 1 entry 5 batch 0 and 2, entry 6 unbatched; ledger 2 entry 7 batch 1
    items = [item(10, 1, index_id(5, 0)), item(10, 1, index_id(5, 2)), item(11, 2, index_id(7, 1)),
             item(12, 1, index_id(6, -1)), item(500, 1, index_id(9, 0))]
    segs = cut_segments(items, 100, -1)
    meta = snapshot_metadata(segs)
    first = meta.metadata_list[0]
    assert (first.min_schedule_timestamp, first.max_schedule_timestamp) == (10, 12)
    # Pulsar's map: real entry ids; our extension: one bit per message (packed index ids:
    # entry | batch index << 22, so unbatched ids are the entry ids)
    assert deserialize_bitmap(first.delayed_index_bit_map[1]) == BitMap([5, 6])
    assert deserialize_bitmap(first.delayed_index_bit_map[2]) == BitMap([7])
    assert deserialize_bitmap(first.packed_index_bit_map[1]) == BitMap([5, 5 | 2 << 22, 6])
    assert deserialize_bitmap(first.packed_index_bit_map[2]) == BitMap([7 | 1 << 22])
    assert not len(first.index_id_bit_map)  # layout 2's map is no longer written
    assert dict(meta.metadata_list[1].delayed_index_bit_map).keys() == {1}
    seg = SnapshotSegment.FromString(segs[0].data)
    assert [(i.timestamp, i.ledger_id, i.entry_id, i.batch_index) for i in seg.indexes] == [
        (10, 1, 5, 0), (10, 1, 5, 2), (11, 2, 7, 1), (12, 1, 6, 0)]


def test_batch_rule_agrees_with_the_streaming_cutter() -> None:
    # cut_bounds (cut_segments, the Spark seeder) and SegmentCutter (the engine's merges) are the
    # same rule: equal segments, bytes and bitmaps included, on random input.
    import random

    rnd = random.Random(11)
    for step, max_idx in ((1, 1), (50, 7), (300, -1), (1000, 3)):
        keys = sorted({(rnd.randrange(0, 3000), rnd.randrange(1, 4), index_id(rnd.randrange(0, 300), rnd.randrange(-1, 3)))
                       for _ in range(400)})
        items = [item(*k, payload=bytes(rnd.randrange(256) for _ in range(rnd.randrange(4)))) for k in keys]
        streamed, cutter = [], SegmentCutter(step, max_idx)
        for it in items:
            seg = cutter.push(it)
            if seg is not None:
                streamed.append(seg)
        streamed.append(cutter.finish())
        batch = cut_segments(items, step, max_idx)
        assert [(s.data, s.count, s.first_key, s.last_key, s.metadata.SerializeToString(deterministic=True))
                for s in batch] == [(s.data, s.count, s.first_key, s.last_key,
                                     s.metadata.SerializeToString(deterministic=True)) for s in streamed]
        assert cut_bounds([k[0] for k in keys], step, max_idx) == [
            (sum(s.count for s in batch[:i]), sum(s.count for s in batch[:i + 1])) for i in range(len(batch))]
    with pytest.raises(ValueError, match="increasing"):
        cut_segments([item(5, 1, 2), item(5, 1, 1)], 10, 5)


def test_a_segment_encoded_in_one_call_equals_its_framed_items() -> None:
    import random

    rnd = random.Random(5)
    messages = [DelayedMessage(rnd.randrange(1, 1 << 40), index_id(rnd.randrange(0, 1 << 20), rnd.randrange(-1, 1000)),
                               rnd.choice((-1, 0, 7)), rnd.randrange(1, 1 << 45), bytes(rnd.randrange(256) for _ in range(rnd.randrange(200))),
                               rnd.choice((None, "", "k\u00e9y")), rnd.choice(({}, {"a": "1"}, {"z": "", "b": "\u20ac", "a": "x"})),
                               rnd.choice((0, 12345)), rnd.choice((None, "persistent://t/n/out")))
                for _ in range(300)]
    ts = [m.deliver_at + rnd.randrange(3) for m in messages]
    assert encode_segment(messages, ts) == b"".join(frame(encode_item(m, t)) for m, t in zip(messages, ts))
    assert encode_segment([], []) == b""


def test_a_batch_of_items_encoded_in_one_call_equals_its_items_encoded_one_by_one() -> None:
    import random

    rnd = random.Random(11)
    sizes = (0, 1, 100, 127, 128, 300, 16_383, 16_384, 70_000)  # element lengths of 1-3 varint bytes
    messages = [DelayedMessage(rnd.randrange(1, 1 << 40), index_id(rnd.randrange(0, 1 << 20), rnd.randrange(-1, 1000)),
                               rnd.choice((-1, 0, 7)), rnd.randrange(1, 1 << 45), bytes(rnd.randrange(256) for _ in range(rnd.choice(sizes))),
                               rnd.choice((None, "", "k\u00e9y")), rnd.choice(({}, {"a": "1"}, {"z": "", "b": "\u20ac", "a": "x"})),
                               rnd.choice((0, 12345)), rnd.choice((None, "persistent://t/n/out")))
                for _ in range(200)]
    ts = [m.deliver_at + rnd.randrange(3) for m in messages]
    assert make_items(messages, ts) == [make_item(m, t) for m, t in zip(messages, ts)]
    assert make_items(messages[:1], ts[:1]) == [make_item(messages[0], ts[0])]
    assert make_items([], []) == []


def test_cutter_rejects_bad_input():
    c = SegmentCutter(10, 5)
    c.push(item(5, 1, 1))
    with pytest.raises(ValueError, match="increasing"):
        c.push(item(5, 1, 1))
    with pytest.raises(ValueError):
        SegmentCutter(0, 5)
    with pytest.raises(ValueError):
        SegmentCutter(10, 0)


# -- merge policy --------------------------------------------------------------------------------

def test_merge_policy_pip_example():
    # PIP-195: buckets [5,3,2,4,3] -> merge the second and third (two adjacent with the least).
    assert select_merge_window([5, 3, 2, 4, 3], [True] * 5, [0] * 5, max_merge=2) == (1, 2)
    # Pulsar's code merges up to 4: windows of 4 sum to 14 and 12 -> the second.
    assert select_merge_window([5, 3, 2, 4, 3], [True] * 5, [0] * 5) == (1, 4)


def test_merge_policy_falls_back_to_smaller_windows_and_skips_ineligible():
    counts = [1, 1, 1, 1, 1, 1]
    assert select_merge_window(counts, [True, True, True, False, True, True], [0] * 6) == (0, 3)
    assert select_merge_window(counts, [True, True, False, True, False, True], [0] * 6) == (0, 2)
    assert select_merge_window(counts, [True, False, True, False, True, False], [0] * 6) is None
    assert select_merge_window([1], [True], [0]) is None


def test_merge_policy_tie_break_prefers_earliest_schedule():
    assert select_merge_window([2, 2, 2], [True] * 3, [50, 10, 5], max_merge=2) == (1, 2)
    assert select_merge_window([2, 2, 2], [True] * 3, [5, 10, 40], max_merge=2) == (0, 2)
    with pytest.raises(ValueError):
        select_merge_window([1, 2], [True], [0, 0])


# -- config and protocol -------------------------------------------------------------------------

def test_config_defaults_and_mapping():
    c = BucketConfig()
    assert (c.delayed_delivery_min_index_count_per_bucket,
            c.delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds,
            c.delayed_delivery_max_indexes_per_bucket_snapshot_segment,
            c.delayed_delivery_max_num_buckets, c.max_unacked_per_bucket) == (50000, 300, 5000, 64, 10000)
    assert c.time_step_ms == 300_000
    c2 = BucketConfig.from_mapping({"delayedDeliveryMaxNumBuckets": "-1", "maxSealDelayMillis": 1000,
                                    "max_unacked_per_bucket": 5, "topic": "t"})
    assert (c2.delayed_delivery_max_num_buckets, c2.max_seal_delay_millis, c2.max_unacked_per_bucket) == (-1, 1000, 5)
    with pytest.raises(ValueError, match="unknown userConfig key 'nope'"):
        BucketConfig.from_mapping({"nope": 1})
    with pytest.raises(ValueError, match="must be an integer"):
        BucketConfig.from_mapping({"maxUnackedPerBucket": "many"})
    with pytest.raises(ValueError, match="maxUnackedPerBucket must be >= 1, got 0"):
        BucketConfig(max_unacked_per_bucket=0)
    with pytest.raises(ValueError, match="or -1"):
        BucketConfig(delayed_delivery_max_num_buckets=-2)


def test_protocol_names_and_parsers():
    assert (DELIVER_AT_PROP, TARGET_PROP, CANCEL_PROP, ORIGIN_MSG_ID_PROP) == (
        "__pl_deliver_at__", "__pl_target__", "__pl_cancel__", "__pl_origin_msg_id__")
    assert parse_deliver_at("1700000000000") == 1_700_000_000_000
    assert parse_cancel_target("12:34") == (12, 34, -1)
    assert parse_cancel_target("12:34:5") == (12, 34, 5)
    assert format_origin_msg_id(12, 34, -1) == "12:34:-1"
    assert parse_origin_msg_id("12:34:3") == (12, 34, 3)
    for bad in ("", "-5", " 5", "1e3", "5_0", str(2**64)):
        with pytest.raises(ProtocolError, match="__pl_deliver_at__"):
            parse_deliver_at(bad)
    for bad in ("12", "12:34:5:6", "a:b", ":3", "12:-1", "12:34:x"):
        with pytest.raises(ProtocolError, match="__pl_cancel__"):
            parse_cancel_target(bad)
    with pytest.raises(ProtocolError, match="partition"):
        parse_origin_msg_id("1:2:x")


def test_delayed_message_validation_names_the_field():
    with pytest.raises(ValueError, match="entry_id"):
        DelayedMessage(1, 2**32, -1, 5, b"").validate()
    with pytest.raises(ValueError, match="deliver_at"):
        DelayedMessage(1, 2, -1, -5, b"").validate()
    with pytest.raises(ValueError, match="payload"):
        DelayedMessage(1, 2, -1, 5, "text").validate()
    with pytest.raises(ValueError, match="properties"):
        DelayedMessage(1, 2, -1, 5, b"", properties={"a": 1}).validate()
    with pytest.raises(ValueError, match="partition"):
        DelayedMessage(1, 2, -2, 5, b"").validate()


def test_encodings_do_not_depend_on_map_insertion_order() -> None:
    """The engine and the Spark seeder must write the same bytes for the same bucket: protobuf maps
    (properties, per-ledger bitmaps) are serialized deterministically
    (sorted keys), whatever order built them."""
    props = {f"p{i}": str(i) for i in range(20)}
    forward = DelayedMessage(7, 3, -1, 1_000, b"x", properties=dict(props))
    backward = DelayedMessage(7, 3, -1, 1_000, b"x", properties=dict(reversed(list(props.items()))))
    assert encode_item(forward, 1_000) == encode_item(backward, 1_000)


def test_last_entry_is_the_furthest_entry_with_its_first_item():
    seen = LedgerBitmaps()
    assert seen.last_entry() is None
    for ledger, entry, batch in [(3, 5, 0), (3, 5, 1), (3, 9, -1), (7, 2, 0), (7, 2, 1), (7, 4, 3)]:
        seen.add(ledger, encode(entry, batch))
    assert seen.last_entry() == (7, 2)  # (7, 4) has no first item in the set: not counted
