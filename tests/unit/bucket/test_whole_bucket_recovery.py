"""A snapshot's metadata carries each segment's count and the whole bucket's packed ids (our
extension of Pulsar's SnapshotMetadata), and recovery takes a bucket nothing of which was
released from them: one bitmap per ledger instead of one per segment. The result is the same
as from the segments' own bitmaps, which recovery still uses for a bucket partly released, for
a snapshot without the extension, and for one whose extension disagrees with itself."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, recovery
from pulsar_lifecycle.bucket.codec import SnapshotMetadata, parse
from pulsar_lifecycle.bucket.records import BATCH_BITS
from pulsar_lifecycle.bucket.storage.memory import MemorySnapshotStorage

BASE = 1_900_000_000_000
CONFIG = BucketConfig(max_unacked_per_bucket=200, delayed_delivery_max_indexes_per_bucket_snapshot_segment=20)


def seeded() -> Tuple[MemorySnapshotStorage, int]:
    """Buckets of batched messages (index ids with batch indexes, several ledgers), the first
    bucket partly released and committed."""
    st = MemorySnapshotStorage()
    ix = BucketIndex(st, CONFIG, clock=lambda: BASE)
    ix.recover()
    for b in range(6):
        ix.add([DelayedMessage(10 + b // 2, ((i // 7) << BATCH_BITS) | (i % 7) + 1000 * b, -1,
                               BASE + 1000 * (b * 300 + i) + 60_000, b"x") for i in range(200)])
    ix.seal()
    released = ix.pop_due(BASE + 1000 * 50 + 60_000, 1000)  # 51 of the first bucket's 200
    ix.commit(released[-1].seq)
    return st, ix.pending_count()


def state(ix: BucketIndex) -> Dict[str, Any]:
    return {"pending": {ledger: list(bm) for ledger, bm in ix._pending._maps.items()},
            "buckets": [(b.bucket_id, b.cur, b.remaining, list(b.seg_count)) for b in ix._buckets]}


def releases(ix: BucketIndex) -> List[Tuple[int, int, int]]:
    return [(r.seq, r.message.ledger_id, r.message.entry_id) for r in ix.pop_due(BASE + 10_000_000, 10_000)]


class Metadata:
    """A storage whose bucket metadata passes through `change(SnapshotMetadata)`."""

    def __init__(self, inner: MemorySnapshotStorage, change) -> None:
        self.inner, self.change = inner, change

    def get_metadata(self, bucket_id: int) -> bytes:
        meta = parse(SnapshotMetadata, self.inner.get_metadata(bucket_id), "metadata")
        self.change(meta)
        return meta.SerializeToString()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def recovered(storage: Any) -> BucketIndex:
    ix = BucketIndex(storage, CONFIG, clock=lambda: BASE + 60_000)
    ix.recover()
    return ix


def test_metadata_carries_each_segments_count_and_the_buckets_ids() -> None:
    st, pending = seeded()
    ix = recovered(st)
    for b in ix._buckets:
        meta = parse(SnapshotMetadata, st.get_metadata(b.bucket_id), "metadata")
        assert len(meta.segment_count) == len(meta.metadata_list) > 1
        assert sum(meta.segment_count) == b.index_count
        assert set(meta.packed_index_bit_map) == {ledger for sm in meta.metadata_list for ledger in sm.packed_index_bit_map}


def test_unreleased_buckets_recover_from_the_whole_bucket_sets_with_the_same_result(monkeypatch) -> None:
    st, pending = seeded()
    segment_reads: List[int] = []
    real = recovery.packed_id_bitmaps
    monkeypatch.setattr(recovery, "packed_id_bitmaps", lambda sm: segment_reads.append(1) or real(sm))
    fast = recovered(st)
    per_segment = len(segment_reads)
    segment_reads.clear()

    def strip(meta: SnapshotMetadata) -> None:
        meta.ClearField("segment_count")
        meta.ClearField("packed_index_bit_map")
    slow = recovered(Metadata(st, strip))
    # Only the partly released bucket went through its segments' bitmaps on the fast path.
    first_segments = len(parse(SnapshotMetadata, st.get_metadata(fast._buckets[0].bucket_id), "m").metadata_list)
    assert per_segment == first_segments and len(segment_reads) > per_segment
    assert fast.pending_count() == slow.pending_count() == pending
    assert state(fast) == state(slow)
    assert releases(fast) == releases(slow) and fast.pending_count() == 0


def test_an_extension_that_disagrees_with_itself_is_not_used(caplog) -> None:
    st, pending = seeded()
    baseline = state(recovered(st))

    def miscount(meta: SnapshotMetadata) -> None:
        meta.segment_count[0] += 1
    caplog.set_level(logging.WARNING, logger=recovery.__name__)
    ix = recovered(Metadata(st, miscount))
    assert state(ix) == baseline and ix.pending_count() == pending
    assert sum("event=bucket_whole_bitmap_mismatch" in r.getMessage() for r in caplog.records) == len(ix._buckets) - 1


def test_pulsars_own_snapshot_metadata_parses_the_extended_bytes() -> None:
    """Fields >= 100, optional: Pulsar's parser (fields 1..3 of its two messages) skips them."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    assert all(f.number >= 100 and not f.is_required for f in SnapshotMetadata.DESCRIPTOR.fields if f.number > 1)
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="pulsar_only_metadata.proto", package="pulsar.delay", syntax="proto2")
    seg = fdp.message_type.add(name="SnapshotSegmentMetadata")
    entry = seg.nested_type.add(name="DelayedIndexBitMapEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_UINT64, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    seg.field.add(name="delayed_index_bit_map", number=1, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED,
                  type_name=".pulsar.delay.SnapshotSegmentMetadata.DelayedIndexBitMapEntry")
    for number, name in ((2, "max_schedule_timestamp"), (3, "min_schedule_timestamp")):
        seg.field.add(name=name, number=number, type=f.TYPE_UINT64, label=f.LABEL_REQUIRED)
    meta = fdp.message_type.add(name="SnapshotMetadata")
    meta.field.add(name="metadata_list", number=1, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED,
                   type_name=".pulsar.delay.SnapshotSegmentMetadata")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    Theirs = message_factory.GetMessageClass(pool.FindMessageTypeByName("pulsar.delay.SnapshotMetadata"))
    st, _ = seeded()
    bid = recovered(st)._buckets[-1].bucket_id
    ours = parse(SnapshotMetadata, st.get_metadata(bid), "metadata")
    assert len(ours.segment_count) and len(ours.packed_index_bit_map)
    theirs = Theirs.FromString(st.get_metadata(bid))
    assert theirs.IsInitialized() and len(theirs.metadata_list) == len(ours.metadata_list)
    assert [(m.min_schedule_timestamp, m.max_schedule_timestamp, dict(m.delayed_index_bit_map))
            for m in theirs.metadata_list] == [(m.min_schedule_timestamp, m.max_schedule_timestamp,
                                               dict(m.delayed_index_bit_map)) for m in ours.metadata_list]
