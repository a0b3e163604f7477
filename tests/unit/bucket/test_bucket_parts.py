"""The parts BucketIndex is made of, tested directly (no index instance): MutableBucket,
ImmutableBucket, the shared release queue, recovery steps, merge."""
from __future__ import annotations

import threading
from typing import List, Optional

from pulsar_lifecycle.bucket import BucketConfig, DelayedMessage, MemorySnapshotStorage
from pulsar_lifecycle.bucket.bitmap import LedgerBitmaps
from pulsar_lifecycle.bucket.codec import (
    decode_framed,
    encode_item,
    encode_journal_add,
    encode_journal_cancel,
    index_key,
    make_item,
    parse_segment,
)
from pulsar_lifecycle.bucket.immutable_bucket import PLACEHOLDER, ImmutableBucket, first_after
from pulsar_lifecycle.bucket.manifest import manifest_bytes
from pulsar_lifecycle.bucket.merge import merge_window, source_items, write_merged
from pulsar_lifecycle.bucket.metrics import OpMetrics
from pulsar_lifecycle.bucket.mutable_bucket import MutableBucket
from pulsar_lifecycle.bucket.packed import PackedSegment
from pulsar_lifecycle.bucket.recovery import (
    RecoveryCounters,
    read_cursor,
    read_manifest,
    recover_bucket,
    replay_journal,
)
from pulsar_lifecycle.bucket.segments import cut_segments, snapshot_metadata_bytes
from pulsar_lifecycle.bucket.shared_queue import SharedBucketQueue
from pulsar_lifecycle.bucket.snapshots import BucketSnapshots


def msg(ledger: int, entry: int, at: int) -> DelayedMessage:
    return DelayedMessage(ledger_id=ledger, entry_id=entry, partition=-1, deliver_at=at, payload=b"p%d" % entry)


def items(ledger: int, n: int, ts0: int = 1000, step: int = 10) -> list:
    return sorted(make_item(msg(ledger, e, ts0 + e * step), ts0 + e * step) for e in range(n))


class Snapshots:
    """A BucketSnapshots over a memory storage, plus the storage."""

    def __init__(self, config: Optional[BucketConfig] = None) -> None:
        self.storage = MemorySnapshotStorage()
        self.config = config or BucketConfig()
        self.files = BucketSnapshots(self.storage, self.config, OpMetrics(), threading.Lock())

    def bucket(self, its: list, per_segment: int) -> ImmutableBucket:
        segments = cut_segments(its, self.config.time_step_ms, per_segment)
        start, end = min(i[1] for i in its), max(i[1] for i in its)
        bid = self.files.write(f"k{start}", segments, snapshot_metadata_bytes(segments), "create")
        assert bid is not None
        bucket = self.files.new_bucket(bid, f"k{start}", start, end, segments)
        bucket.segments = segments  # for the tests: what install() is given
        return bucket


# -- MutableBucket -------------------------------------------------------------------------------------
def test_mutable_bucket_releases_in_key_order_and_keeps_released_items_for_the_seal():
    mb = MutableBucket()
    assert mb.empty and mb.head() is None and mb.head_ts() is None and mb.start == mb.end == -1
    mb.add(items(7, 3)[::-1], 7, 7, now_ms=50)
    mb.add([make_item(msg(5, 0, 1005), 1005)], 5, 5, now_ms=60)
    assert (mb.start, mb.end, mb.oldest_ms, len(mb)) == (5, 7, 50, 4)
    popped = [mb.pop()[:3] for _ in range(2)]
    assert popped == [(1000, 7, 0), (1005, 5, 0)]
    assert len(mb) == 4 and mb.head_ts() == 1010
    # A seal writes everything after the committed watermark, released or not.
    assert sorted(i[:3] for i in mb.items_after((1000, 7, 0))) == [(1005, 5, 0), (1010, 7, 1), (1020, 7, 2)]
    assert len(mb.items_after(None)) == 4
    mb.clear()
    assert mb.empty and mb.oldest_ms is None and (mb.start, mb.end) == (-1, -1)


def test_mutable_bucket_restore_takes_its_age_from_the_clock_only_when_it_holds_items():
    calls: List[int] = []

    def clock() -> int:
        calls.append(1)
        return 99

    empty = MutableBucket()
    empty.restore([], -1, -1, clock)
    assert calls == [] and empty.oldest_ms is None and empty.start == -1
    mb = MutableBucket()
    mb.restore(items(3, 2)[::-1], 3, 3, clock)
    assert mb.oldest_ms == 99 and mb.head()[:3] == (1000, 3, 0) and (mb.start, mb.end) == (3, 3)


# -- ImmutableBucket ------------------------------------------------------------------------------------
def test_first_after_positions_by_release_key():
    seg = PackedSegment.parse(cut_segments(items(1, 5), 10**9, 100)[0].data)
    keys = [index_key(i) for i in parse_segment(cut_segments(items(1, 5), 10**9, 100)[0].data).indexes]
    assert first_after(seg, None) == 0
    assert first_after(seg, keys[2]) == 3
    assert first_after(seg, (keys[2][0], keys[2][1], keys[2][2] - 1)) == 2
    assert first_after(seg, keys[-1]) == 5


def test_immutable_bucket_steps_through_a_segment_and_notes_its_last_key():
    snaps = Snapshots()
    b = snaps.bucket(items(4, 4), per_segment=2)
    assert (b.nseg, b.index_count, b.drained, b.loaded) == (2, 4, False, 0)
    assert b.placeholder() == (1000, PLACEHOLDER, PLACEHOLDER, b.bucket_id)
    assert b.last_key == (1030, 4, 3)  # from the cut segments
    assert b.first_unreleased(b.segments, (1010, 4, 1)) == 1
    b.cur = 1
    seg = PackedSegment.parse(snaps.storage.get_segments(b.bucket_id, 2, 2)[0])
    assert not b.use_segment(seg, (1030, 4, 3))  # nothing after the last key: unchanged
    assert b.seg is None
    assert b.use_segment(seg, (1020, 4, 2))
    assert b.head() == (1030, 4, 3, b.bucket_id) and b.loaded == 1
    b.remaining = 1
    assert not b.step()
    assert b.drained and b.seg is None and b.remaining == 0
    assert b.ref().bucket_id == b.bucket_id and b.ref().index_count == 4


# -- the shared queue -----------------------------------------------------------------------------------
def test_shared_queue_merges_buckets_and_loads_the_next_segment_when_one_empties():
    snaps = Snapshots()
    a = snaps.bucket(items(1, 4, ts0=1000, step=10), per_segment=2)  # 1000, 1010 | 1020, 1030
    b = snaps.bucket(items(2, 3, ts0=1005, step=10), per_segment=3)  # 1005, 1015, 1025
    q = SharedBucketQueue(snaps.files.read_segment, OpMetrics())
    by_id = {a.bucket_id: a, b.bucket_id: b}
    q.install(a, a.segments, {}, None)
    q.install(b, b.segments, {}, None)
    out = []
    last = None
    while q.head() is not None:
        head = q.head()
        bucket = by_id[head[3]]
        assert bucket.seg is not None
        out.append(head[:3])
        q.advance(bucket, last)
        last = head[:3]
    assert [k[0] for k in out] == [1000, 1005, 1010, 1015, 1020, 1025, 1030]
    assert a.drained and b.drained and len(q) == 0


def test_shared_queue_keeps_a_placeholder_while_a_segment_cannot_be_read():
    snaps = Snapshots()
    a = snaps.bucket(items(1, 4), per_segment=2)
    failing = {"on": True}

    def reader(bucket: ImmutableBucket, k: int) -> Optional[bytes]:
        return None if failing["on"] else snaps.files.read_segment(bucket, k)

    q = SharedBucketQueue(reader, OpMetrics())
    for seg in a.segments:
        seg.data = b""  # as after a merge: only metadata in memory, so install() must read
    q.install(a, a.segments, {}, (1010, 1, 1))  # first segment released: segment 2 is current, unread
    assert a.cur == 1 and a.seg is None and q.head() == (1020, PLACEHOLDER, PLACEHOLDER, a.bucket_id)
    assert a.remaining == 2  # approximated from the metadata
    assert not q.load_current(a, (1010, 1, 1))
    failing["on"] = False
    assert q.load_current(a, (1010, 1, 1))
    assert q.head() == (1020, 1, 2, a.bucket_id)
    q.remove_buckets({a.bucket_id})
    assert q.head() is None


# -- recovery -------------------------------------------------------------------------------------------
def test_recovery_steps_on_an_empty_storage():
    storage = MemorySnapshotStorage()
    counters = RecoveryCounters()
    assert read_cursor(storage, counters) is None
    man = read_manifest(storage, counters)
    assert man.refs == [] and man.pending_delete == {} and len(man.seen) == 0 and man.journal_cut == 0
    assert counters == RecoveryCounters()


def test_recover_bucket_positions_after_the_watermark_and_fills_pending():
    snaps = Snapshots()
    b = snaps.bucket(items(6, 6), per_segment=2)  # segments: e0 e1 | e2 e3 | e4 e5
    pending = LedgerBitmaps()
    counters = RecoveryCounters()
    ref = b.ref()
    got = recover_bucket(snaps.storage, ref, (1020, 6, 2), pending, counters)
    assert got is not None and (got.cur, got.pos, got.remaining) == (1, 1, 3)
    assert got.head() == (1030, 6, 3, b.bucket_id)
    assert len(pending) == 3
    assert [pending.contains(6, e) for e in range(6)] == [False] * 3 + [True] * 3
    assert counters.metadata == 1 and counters.segments == 1 and counters.loaded == 1
    assert recover_bucket(snaps.storage, ref, (1050, 6, 5), LedgerBitmaps(), RecoveryCounters()) is None


def test_replay_journal_skips_the_cut_and_committed_items_and_applies_cancels():
    records = [
        (1, encode_journal_add([encode_item(msg(9, 0, 1000), 1000)])),
        (2, encode_journal_add([encode_item(msg(9, 1, 1010), 1010), encode_item(msg(9, 2, 1020), 1020)])),
        (3, encode_journal_cancel(9, 2)),
        (4, encode_journal_add([encode_item(msg(9, 1, 1010), 1010)])),  # a duplicate: the first record wins
    ]
    seen, pending, tombs = LedgerBitmaps(), LedgerBitmaps(), LedgerBitmaps()
    out = replay_journal(records, journal_cut=1, watermark=(1010, 9, 1), seen=seen, pending=pending,
                         tombstones=tombs, counters=RecoveryCounters())
    assert out.used == 3 and out.journal_last == 4 and (out.start, out.end) == (9, 9)
    assert [decode_framed(i[3])[0] for i in out.items] == [(1020, 9, 2)]
    assert [seen.contains(9, e) for e in range(3)] == [False, True, True]
    assert [pending.contains(9, e) for e in range(3)] == [False, False, True]
    assert tombs.contains(9, 2)


# -- merge ----------------------------------------------------------------------------------------------
def test_merge_window_only_above_the_limit():
    snaps = Snapshots()
    bs = [snaps.bucket(items(l, 2), per_segment=2) for l in (1, 2, 3)]
    for b in bs:
        b.remaining = 2
    assert merge_window(bs, -1) is None
    assert merge_window(bs, 3) is None
    start, width = merge_window(bs, 2)
    assert 0 <= start and width >= 2 and start + width <= 3


def test_write_merged_holds_every_item_after_the_watermark_in_key_order():
    snaps = Snapshots()
    a = snaps.bucket(items(1, 4, ts0=1000), per_segment=2)
    b = snaps.bucket(items(2, 4, ts0=1005), per_segment=2)
    w = (1010, 1, 1)
    assert [k[:3] for k in source_items(snaps.storage, a, w)] == [(1020, 1, 2), (1030, 1, 3)]
    merged = write_merged(snaps.files, snaps.config, [a, b], w, lambda: None)
    assert merged is not None
    m = merged.bucket
    assert (m.start_ledger, m.end_ledger, m.index_count) == (1, 2, 5)  # b's 1005 is before w
    keys = [k[:3] for k in source_items(snaps.storage, m, None)]
    assert keys == sorted(keys) and len(keys) == 5 and keys[0] == (1015, 2, 1)
    assert m.bucket_id in snaps.files.writing  # in use until the index installs it (finished())
    snaps.files.finished(m.bucket_id)
    assert m.bucket_id not in snaps.files.writing


def test_manifest_of_buckets_lists_them_in_order():
    snaps = Snapshots()
    bs = [snaps.bucket(items(l, 2), per_segment=2) for l in (1, 2)]
    data = manifest_bytes([b.ref() for b in bs], seen=LedgerBitmaps(), tombstones=LedgerBitmaps(),
                          journal_cut=0, max_bucket_id=0, pending_delete=[])
    storage = MemorySnapshotStorage()
    storage.put_manifest(data)
    man = read_manifest(storage, RecoveryCounters())
    assert [r.bucket_id for r in man.refs] == [b.bucket_id for b in bs] and man.max_bucket_id == bs[-1].bucket_id
