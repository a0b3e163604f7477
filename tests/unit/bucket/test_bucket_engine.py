"""BucketIndex behaviour: sealing, segment loading, merging, recovery, ordering, cancels, memory."""
from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from pulsar_lifecycle.bucket import (
    BucketConfig,
    BucketIndex,
    CancelResult,
    DelayedMessage,
    DirectorySnapshotStorage,
    EngineFailedError,
    MemorySnapshotStorage,
    NotRecoveredError,
    StorageError,
)
from pulsar_lifecycle.bucket.engine import HORIZON_SLACK_MS, RECENT_WINDOW_MS
from pulsar_lifecycle.bucket.keys import parse_bucket_key


class CountingStorage:
    """Wraps a storage and counts calls per method (and can make chosen methods fail)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Dict[str, int] = collections.Counter()
        self.fail: Dict[str, Exception] = {}

    def reset(self) -> None:
        self.calls.clear()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name in self.fail:
                raise self.fail[name]
            return attr(*args, **kwargs)

        return wrapper


def msg(ledger: int, entry: int, deliver_at: int, payload: bytes = b"x", **kw: Any) -> DelayedMessage:
    return DelayedMessage(ledger, entry, kw.pop("partition", 0), deliver_at, payload, **kw)


def new_index(storage: Any, **cfg: Any) -> BucketIndex:
    clock = cfg.pop("clock", None)
    on_obsolete = cfg.pop("on_obsolete", None)
    kwargs = {"clock": clock} if clock else {}
    ix = BucketIndex(storage, BucketConfig(**cfg), on_snapshot_obsolete=on_obsolete, **kwargs)
    ix.recover()
    return ix


def drain(ix: BucketIndex, now: int = 10**13, batch: int = 1000) -> List:
    out = []
    for _ in range(100000):
        got = ix.pop_due(now, batch)
        if not got:
            return out
        out.extend(got)
    raise AssertionError("drain did not finish")


SMALL = dict(max_unacked_per_bucket=10, delayed_delivery_max_indexes_per_bucket_snapshot_segment=4,
             delayed_delivery_max_num_buckets=-1)


# -- basic contract ------------------------------------------------------------------------------

def test_must_recover_first_and_only_once():
    ix = BucketIndex(MemorySnapshotStorage())
    with pytest.raises(NotRecoveredError):
        ix.add([msg(1, 1, 5)])
    ix.recover()
    with pytest.raises(RuntimeError, match="already"):
        ix.recover()


def test_release_order_seq_and_never_early():
    ix = new_index(MemorySnapshotStorage())
    assert ix.add([msg(1, 3, 300), msg(1, 1, 100), msg(1, 2, 100), msg(2, 0, 200)]) == [True] * 4
    assert ix.next_release_time() == 100
    assert ix.pop_due(99, 10) == []
    got = ix.pop_due(200, 10)
    assert [(r.seq, r.message.ledger_id, r.message.entry_id) for r in got] == [(1, 1, 1), (2, 1, 2), (3, 2, 0)]
    assert all(r.release_ts <= 200 and r.message.deliver_at <= r.release_ts for r in got)
    assert ix.next_release_time() == 300
    assert [r.seq for r in ix.pop_due(10**6, 10)] == [4]
    assert ix.next_release_time() is None and ix.pending_count() == 0


def test_late_items_get_a_release_key_after_the_last_release():
    ix = new_index(MemorySnapshotStorage())
    ix.add([msg(1, 1, 1000)])
    assert [r.release_ts for r in ix.pop_due(1000, 10)] == [1000]
    ix.add([msg(1, 2, 10)])  # deliver-at long past
    r = ix.pop_due(1001, 10)
    assert [(r[0].release_ts, r[0].message.deliver_at, r[0].seq) for _ in r] == [(1001, 10, 2)]


def test_duplicates_are_ignored_even_after_release_and_restart():
    st = MemorySnapshotStorage()
    ix = new_index(st, **SMALL)
    assert ix.add([msg(1, 1, 5), msg(1, 1, 6), msg(1, 2, 5)]) == [True, False, True]
    ix.pop_due(10, 10)
    assert ix.add([msg(1, 1, 50)]) == [False]
    ix2 = new_index(st, **SMALL)
    assert ix2.add([msg(1, 1, 50), msg(1, 2, 1), msg(1, 3, 1)]) == [False, False, True]
    assert ix2.was_added(1, 1) and not ix2.was_added(9, 9)


def test_bad_arguments_are_clear_errors():
    ix = new_index(MemorySnapshotStorage())
    with pytest.raises(ValueError, match="entry_id"):
        ix.add([msg(1, -1, 5)])
    with pytest.raises(TypeError, match="DelayedMessage"):
        ix.add([("not", "a message")])
    with pytest.raises(ValueError, match="max_items"):
        ix.pop_due(5, 0)
    with pytest.raises(ValueError, match="now_ms"):
        ix.pop_due(-1, 5)
    with pytest.raises(ValueError, match="last released seq is 0"):
        ix.commit(1)
    with pytest.raises(ValueError, match="ledger_id"):
        ix.cancel(-1, 0)


# -- sealing -------------------------------------------------------------------------------------

def test_seal_when_mutable_bucket_reaches_max_unacked():
    ix = new_index(MemorySnapshotStorage(), **SMALL)
    ix.add([msg(1, e, 1000 + e) for e in range(9)])
    assert ix.stats().immutable_buckets == 0 and ix.stats().mutable_items == 9
    ix.add([msg(1, 9, 5000)])
    s = ix.stats()
    assert s.immutable_buckets == 1 and s.mutable_items == 0 and s.pending == 10
    ix.add([msg(1, e, 1000) for e in range(10, 35)])  # one call crossing two thresholds
    assert ix.stats().immutable_buckets == 3 and ix.stats().mutable_items == 5


def test_pulsar_seal_rule_ledger_boundary_and_min_index_count():
    ix = new_index(MemorySnapshotStorage(), delayed_delivery_min_index_count_per_bucket=5,
                   max_unacked_per_bucket=1000, delayed_delivery_max_num_buckets=-1)
    ix.add([msg(7, e, 100) for e in range(8)])  # same ledger: never sealed by Pulsar's rule
    assert ix.stats().immutable_buckets == 0
    ix.add([msg(8, 0, 100)])  # newer ledger and >= 5 indexes: seal first, then add
    s = ix.stats()
    assert s.immutable_buckets == 1 and s.mutable_items == 1
    bid = ix.bucket_ids()[0]
    ref_key = ix._by_id[bid].key
    assert parse_bucket_key(ref_key) == (7, 7)
    ix.add([msg(9, 0, 100)])  # only 1 index in the mutable bucket: no seal
    assert ix.stats().immutable_buckets == 1


def test_seal_by_age_through_maybe_seal():
    now = [1_000_000]
    ix = new_index(MemorySnapshotStorage(), clock=lambda: now[0], max_seal_delay_millis=60_000,
                   delayed_delivery_max_num_buckets=-1)
    ix.add([msg(1, 0, 5_000_000)])
    now[0] += 10_000
    ix.add([msg(1, 1, 5_000_000)])
    ix.maybe_seal(now[0] + 49_999)  # the oldest is 59.999 s old
    assert ix.stats().immutable_buckets == 0
    ix.maybe_seal(now[0] + 50_000)
    assert ix.stats().immutable_buckets == 1 and ix.stats().mutable_items == 0
    ix.maybe_seal(now[0] + 10**9)  # nothing to seal
    assert ix.stats().immutable_buckets == 1


def test_seal_truncates_the_journal_and_keeps_ranges():
    st = CountingStorage(MemorySnapshotStorage())
    ix = new_index(st, **SMALL)
    ix.add([msg(3 + e // 5, e % 5, 100 + e) for e in range(10)])
    assert st.inner.journal_read() == []
    (bid,) = ix.bucket_ids()
    assert parse_bucket_key(ix._by_id[bid].key) == (3, 4)
    assert st.inner.snapshot_info(bid)["bucket_key"] == "#pulsar.internal.delayed.bucket_3_4"


# -- segments ------------------------------------------------------------------------------------

def test_next_segment_is_loaded_when_one_empties():
    st = CountingStorage(MemorySnapshotStorage())
    ix = new_index(st, **SMALL)
    ix.add([msg(1, e, 100 + e) for e in range(10)])  # one bucket, segments of 4, 4, 2
    (bid,) = ix.bucket_ids()
    assert ix._by_id[bid].nseg == 3
    st.reset()
    got = ix.pop_due(103, 100)
    assert len(got) == 4 and st.calls["get_segments"] == 1  # emptying segment 1 loads segment 2
    assert ix.stats().loaded == 4
    got = ix.pop_due(10_000, 100)
    assert [r.message.entry_id for r in got] == list(range(4, 10))
    assert st.calls["get_segments"] == 2
    assert ix.stats().op_count[("load", "succeed")] == 2


def test_unreadable_segment_blocks_order_then_recovers():
    st = CountingStorage(MemorySnapshotStorage())
    ix = new_index(st, **SMALL)
    ix.add([msg(1, e, 100 + e) for e in range(10)])
    ix.add([msg(2, 0, 104)])  # in the mutable bucket; must not pass segment 2's items
    st.fail["get_segments"] = StorageError("bookie down")
    got = ix.pop_due(10_000, 100)
    assert [r.message.entry_id for r in got] == [0, 1, 2, 3]
    assert ix.pop_due(10_000, 100) == []
    assert ix.stats().op_count[("load", "failed")] >= 2
    del st.fail["get_segments"]
    got = ix.pop_due(10_000, 100)
    assert [(r.message.ledger_id, r.message.entry_id) for r in got] == [(1, 4), (2, 0)] + [(1, e) for e in range(5, 10)]


# -- merging -------------------------------------------------------------------------------------

def test_merge_keeps_every_item_including_the_loaded_segment():
    """Regression for Pulsar PR #26251: merging read from currentSegmentEntryId + 1 and lost the
    segment already loaded in memory; after the source snapshots were deleted and the broker
    restarted, those messages were never delivered."""
    st = MemorySnapshotStorage()
    cfg = dict(max_unacked_per_bucket=10, delayed_delivery_max_indexes_per_bucket_snapshot_segment=4,
               delayed_delivery_max_num_buckets=2)
    ix = new_index(st, **cfg)
    ix.add([msg(1, e, 1000 + e) for e in range(10)])  # bucket A, segment 1 = entries 0..3 loaded
    ix.add([msg(2, e, 1000 + e) for e in range(10)])  # bucket B
    first = ix.pop_due(1001, 3)  # (1000,1,0) (1000,2,0) (1001,1,1): segment 1 of A partly released
    ix.commit(first[0].seq)  # only the first is committed
    ix.add([msg(3, e, 1000 + e) for e in range(10)])  # bucket C -> 3 > 2 buckets: merge
    assert ix.stats().op_count[("merge", "succeed")] == 1 and ix.stats().immutable_buckets == 1
    assert st.list_snapshots() == ix.bucket_ids()  # sources deleted
    rest = drain(ix)
    released = first + rest
    assert sorted((r.message.ledger_id, r.message.entry_id) for r in released) == sorted(
        (l, e) for l in (1, 2, 3) for e in range(10))
    # Restart: everything after the committed watermark comes back, with identical seqs.
    ix2 = new_index(st, **cfg)
    again = drain(ix2)
    assert [(r.seq, r.message.ledger_id, r.message.entry_id) for r in again] == [
        (r.seq, r.message.ledger_id, r.message.entry_id) for r in released[1:]]


def test_freed_heap_is_handed_back_after_each_seal_and_after_merges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seals and merges free large transient buffers that glibc keeps in the heap; the index
    calls malloc_trim after each seal and after a round of merges. The trims are counted, and
    what each one follows is read from the op counters at that moment."""
    import pulsar_lifecycle.bucket.engine as engine_mod

    st = MemorySnapshotStorage()
    ix = new_index(st, max_unacked_per_bucket=10, delayed_delivery_max_indexes_per_bucket_snapshot_segment=4,
                   delayed_delivery_max_num_buckets=2)
    trims: List[tuple] = []

    def counting() -> bool:
        ops = ix.stats().op_count
        trims.append((ops[("create", "succeed")], ops[("merge", "succeed")]))
        return True

    monkeypatch.setattr(engine_mod, "release_free_memory", counting)
    ix.add([msg(1, e, 1000 + e) for e in range(10)])  # seal 1
    ix.add([msg(2, e, 1000 + e) for e in range(10)])  # seal 2
    assert trims == [(1, 0), (2, 0)]
    ix.add([msg(3, e, 1000 + e) for e in range(10)])  # seal 3 -> 3 buckets > 2: a merge, then a trim
    assert ix.stats().op_count[("merge", "succeed")] == 1
    assert trims == [(1, 0), (2, 0), (3, 0), (3, 1)]


def test_seals_and_merges_do_not_load_numpy() -> None:
    """numpy costs a writer about 15 MB of RSS, and seals and merges of segments with many ids
    per ledger once loaded it to pack their bitmaps. A fresh interpreter: 2 seals of 2,000 ids
    and a merge."""
    import subprocess
    import sys

    script = """
import sys
from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, MemorySnapshotStorage
ix = BucketIndex(MemorySnapshotStorage(), BucketConfig(max_unacked_per_bucket=2000,
                 delayed_delivery_max_num_buckets=1), clock=lambda: 0)
ix.recover()
for ledger in (1, 2):
    ix.add([DelayedMessage(ledger, e << 10, -1, 10_000 + e, b"x") for e in range(2000)])
assert ix.stats().op_count[("merge", "succeed")] == 1, ix.stats()
print("numpy" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False"]


def test_merge_bounds_bucket_count_and_hands_sources_to_deleter():
    deleted = []
    st = MemorySnapshotStorage()
    ix = new_index(st, on_obsolete=lambda bid, key: (deleted.append((bid, key)), st.delete(bid)),
                   max_unacked_per_bucket=5, delayed_delivery_max_num_buckets=4,
                   delayed_delivery_max_indexes_per_bucket_snapshot_segment=3)
    for i in range(40):
        ix.add([msg(1 + i, e, 10_000 - i * 10 + e) for e in range(5)])
        assert ix.stats().immutable_buckets <= 4
    assert len(deleted) > 10 and all(not ix.is_bucket_in_use(b) for b, _ in deleted)
    assert all(k.startswith("#pulsar.internal.delayed.bucket_") for _, k in deleted)
    assert all(ix.is_bucket_in_use(b) for b in ix.bucket_ids())
    got = drain(ix)
    keys = [r.key for r in got]
    assert len(got) == 200 and keys == sorted(keys)


def test_exhausted_buckets_are_deleted_only_after_commit():
    deleted = []
    st = MemorySnapshotStorage()
    ix = new_index(st, on_obsolete=lambda bid, key: deleted.append(bid), **SMALL)
    ix.add([msg(1, e, 100 + e) for e in range(10)])
    (bid,) = ix.bucket_ids()
    got = drain(ix)
    ix.maybe_seal(0)
    assert deleted == [] and ix.is_bucket_in_use(bid)  # released, not committed yet
    ix.commit(got[-2].seq)
    ix.maybe_seal(0)
    assert deleted == []
    ix.commit(got[-1].seq)
    ix.maybe_seal(0)
    assert deleted == [bid] and not ix.is_bucket_in_use(bid) and ix.bucket_ids() == []


def test_failed_deleter_is_retried_and_survives_restart():
    st = MemorySnapshotStorage()
    calls = []

    def flaky(bid: int, key: str) -> None:
        calls.append(bid)
        raise RuntimeError("deletion topic unavailable")

    ix = new_index(st, on_obsolete=flaky, **SMALL)
    ix.add([msg(1, e, 100) for e in range(10)])
    got = drain(ix)
    ix.commit(got[-1].seq)
    ix.maybe_seal(0)
    ix.maybe_seal(0)
    assert len(calls) == 2
    seen = []
    new_index(st, on_obsolete=lambda b, k: seen.append(b), **SMALL)
    assert seen == calls[:1]


# -- recovery ------------------------------------------------------------------------------------

def test_recovery_reads_only_metadata_and_one_segment_per_bucket(tmp_path: Path):
    st = CountingStorage(DirectorySnapshotStorage(tmp_path))
    cfg = dict(max_unacked_per_bucket=200, delayed_delivery_max_indexes_per_bucket_snapshot_segment=10,
               delayed_delivery_max_num_buckets=-1)
    ix = new_index(st, **cfg)
    n = 0
    for b in range(6):  # 6 buckets x 20 segments
        ix.add([msg(10 + b, e, 1_000 + (e * 7919) % 2000) for e in range(200)])
        n += 200
    ix.add([msg(99, e, 1_500) for e in range(37)])  # journal only
    got = ix.pop_due(1_300, 10_000)
    ix.commit(got[len(got) // 2].seq)
    st.reset()
    ix2 = BucketIndex(st, BucketConfig(**cfg))
    report = ix2.recover()
    assert report.buckets == 6 and report.metadata_reads == 6 and report.segment_reads <= 6
    assert st.calls["get_metadata"] == 6 and st.calls["get_segments"] <= 6
    assert st.calls["journal_read"] == 1 and st.calls["get_manifest"] == 1 and st.calls["get_cursor"] == 1
    assert set(st.calls) <= {"get_metadata", "get_segments", "journal_read", "get_manifest", "get_cursor",
                             "list_snapshots"}
    assert report.mutable_items == 37
    assert report.pending == n + 37 - report.committed_seq
    assert ix2.stats().loaded <= 37 + 6 * 10
    again = drain(ix2)
    assert [r.seq for r in again] == list(range(report.committed_seq + 1, n + 37 + 1))


def test_buckets_after_the_watermark_are_recovered_without_reading_a_segment(tmp_path: Path):
    # A seeded store (or a writer that released little): recovery reads entry 0 of each bucket
    # and no segment; each bucket's first segment is read when it is due, order kept.
    st = CountingStorage(DirectorySnapshotStorage(tmp_path))
    cfg = dict(max_unacked_per_bucket=100, delayed_delivery_max_indexes_per_bucket_snapshot_segment=10,
               delayed_delivery_max_num_buckets=-1)
    ix = new_index(st, **cfg)
    for b in range(4):
        ix.add([msg(10 + b, e, 5_000 + (e * 7919 + b * 31) % 900) for e in range(100)])
    ix.add([msg(90, 0, 100)])  # in the journal: released and committed before the buckets' items
    first = ix.pop_due(200, 10)
    assert [r.message.ledger_id for r in first] == [90]
    ix.commit(first[0].seq)
    st.reset()
    ix2 = BucketIndex(st, BucketConfig(**cfg))
    report = ix2.recover()
    assert report.buckets == 4 and report.segment_reads == 0 and st.calls.get("get_segments", 0) == 0
    assert report.pending == 400 and ix2.contains(12, 57) and ix2.next_release_time() == min(
        5_000 + (e * 7919 + b * 31) % 900 for b in range(4) for e in range(100))
    assert ix2.cancel(11, 3) == CancelResult.CANCELLED  # pending, known from the bitmaps alone
    out = drain(ix2)
    keys = [r.key for r in out]
    assert keys == sorted(keys) and len(set(keys)) == 400
    assert {(r.message.ledger_id, r.message.entry_id) for r in out} == {(10 + b, e) for b in range(4) for e in range(100)}
    assert [r.seq for r in out] == list(range(first[0].seq + 1, first[0].seq + 401))
    assert [(r.message.ledger_id, r.message.entry_id) for r in out if r.cancelled] == [(11, 3)]
    assert not ix2.contains(12, 57) and ix2.pending_count() == 0


def test_recovery_after_crash_between_snapshot_and_manifest_deletes_the_orphan(tmp_path: Path):
    st = CountingStorage(DirectorySnapshotStorage(tmp_path))
    ix = new_index(st, **SMALL)
    ix.add([msg(1, e, 100) for e in range(5)])
    st.fail["put_manifest"] = StorageError("crash")
    with pytest.raises(EngineFailedError):
        ix.add([msg(1, e, 100) for e in range(5, 10)])  # seal: snapshot written, manifest not
    with pytest.raises(EngineFailedError):
        ix.pop_due(10**6, 10)
    orphan = st.inner.list_snapshots()
    assert len(orphan) == 1
    del st.fail["put_manifest"]
    ix2 = new_index(st, **SMALL)
    assert st.inner.list_snapshots() == []  # orphan removed; items still in the journal
    assert sorted(r.message.entry_id for r in drain(ix2)) == list(range(10))


def test_journal_failure_poisons_until_a_new_index_recovers():
    st = CountingStorage(MemorySnapshotStorage())
    ix = new_index(st)
    ix.add([msg(1, 0, 5)])
    st.fail["journal_append"] = StorageError("disk full")
    with pytest.raises(EngineFailedError, match="journal append"):
        ix.add([msg(1, 1, 5)])
    with pytest.raises(EngineFailedError):
        ix.cancel(1, 0)
    del st.fail["journal_append"]
    ix2 = new_index(st)
    assert ix2.add([msg(1, 1, 5)]) == [True]
    assert [r.message.entry_id for r in drain(ix2)] == [0, 1]


def test_restart_rereleases_uncommitted_with_identical_seqs_and_orders_new_items_after():
    st = MemorySnapshotStorage()
    ix = new_index(st, **SMALL)
    ix.add([msg(1, e, 1_000 + e) for e in range(25)])
    first = ix.pop_due(1_010, 100)
    ix.commit(first[4].seq)
    # crash: nothing after seq 5 committed
    ix2 = new_index(st, **SMALL)
    ix2.add([msg(2, 0, 1_002)])  # deliver-at before items released pre-crash
    rereleased = ix2.pop_due(1_010, 100)  # the new item is not among them: not due yet
    assert [(r.seq, r.key) for r in rereleased] == [(r.seq, r.key) for r in first[5:]]
    later = ix2.pop_due(1_011, 100)
    assert [(r.seq, r.key) for r in later] == [(12, (1_011, 1, 11))]
    # The persisted horizon runs HORIZON_SLACK_MS ahead of what was handed out, and new items
    # after a crash are ordered after it: after everything possibly published.
    new_ts = 1_010 + HORIZON_SLACK_MS + 1
    rest = ix2.pop_due(new_ts - 1, 100)
    assert [(r.seq, r.key) for r in rest] == [(13 + i, (1_012 + i, 1, 12 + i)) for i in range(13)]
    newest = ix2.pop_due(new_ts, 100)
    assert [(r.seq, r.key) for r in newest] == [(26, (new_ts, 2, 0))]
    assert newest[0].message.deliver_at == 1_002


# -- cancellation --------------------------------------------------------------------------------

def test_cancel_results_tombstones_and_seq_consumption():
    st = MemorySnapshotStorage()
    ix = new_index(st, **SMALL)
    ix.add([msg(1, e, 100 + e) for e in range(12)])  # 10 sealed + 2 mutable
    assert ix.cancel(1, 3) == CancelResult.CANCELLED  # in a snapshot
    assert ix.cancel(1, 11) == CancelResult.CANCELLED  # in the mutable bucket
    assert ix.cancel(1, 3) == CancelResult.ALREADY_CANCELLED
    assert ix.cancel(5, 5) == CancelResult.CANCELLED_BEFORE_ADD
    assert ix.cancel(5, 5) == CancelResult.ALREADY_CANCELLED
    got = ix.pop_due(102, 100)
    assert ix.cancel(1, 0) == CancelResult.ALREADY_RELEASED
    assert ix.contains(1, 3) and not ix.contains(1, 0)
    ix2 = new_index(st, **SMALL)  # tombstones are durable
    assert ix2.cancel(1, 11) == CancelResult.ALREADY_CANCELLED
    rest = drain(ix2)
    flagged = {r.message.entry_id for r in rest if r.cancelled}
    assert flagged == {3, 11}
    assert [r.seq for r in rest] == list(range(1, 13))  # nothing committed: all again, same seqs
    assert [r.seq for r in got] == [1, 2, 3]


def test_cancel_before_add_drops_the_add_across_restarts_and_seals():
    st = MemorySnapshotStorage()
    ix = new_index(st, **SMALL)
    assert ix.cancel(1, 4) == CancelResult.CANCELLED_BEFORE_ADD
    ix2 = new_index(st, **SMALL)  # the early tombstone is durable (journal)
    assert ix2.add([msg(1, e, 100) for e in range(3, 6)]) == [True, False, True]
    ix2.seal()  # journal cut: now the manifest carries it
    ix3 = new_index(st, **SMALL)
    assert ix3.add([msg(1, 4, 100)]) == [False]  # a redelivered add is still dropped
    assert ix3.cancel(1, 4) == CancelResult.ALREADY_CANCELLED
    assert [r.message.entry_id for r in drain(ix3)] == [3, 5]


def test_committed_cancelled_tombstones_are_pruned():
    st = MemorySnapshotStorage()
    ix = new_index(st, **SMALL)
    ix.add([msg(1, e, 100) for e in range(3)])
    ix.cancel(1, 1)
    got = drain(ix)
    assert [r.cancelled for r in got] == [False, True, False]
    assert ix.cancel(1, 1) == CancelResult.ALREADY_RELEASED  # released flagged, tombstone not yet pruned
    ix.commit(got[-1].seq)
    assert len(ix._tombstones) == 0


# -- memory bound --------------------------------------------------------------------------------

def test_loaded_indexes_stay_bounded():
    """Memory is bounded by the mutable bucket + one segment per bucket: count loaded items."""
    per_seg, max_buckets, unacked = 50, 8, 500
    ix = new_index(MemorySnapshotStorage(), max_unacked_per_bucket=unacked,
                   delayed_delivery_max_indexes_per_bucket_snapshot_segment=per_seg,
                   delayed_delivery_max_num_buckets=max_buckets)
    bound = unacked + max_buckets * per_seg
    total = 0
    for b in range(40):
        ix.add([msg(100 + b, e, 10_000 + ((b * 500 + e) * 7919) % 100_000) for e in range(500)])
        total += 500
        s = ix.stats()
        assert s.loaded <= bound and s.immutable_buckets <= max_buckets
        assert s.pending == total
    released = 0
    for now in range(10_000, 110_001, 5_000):
        released += len(ix.pop_due(now, 100_000))
        assert ix.stats().loaded <= bound
    assert released == total


def test_messages_kept_for_release_equal_the_journaled_ones_and_stay_bounded():
    """add() keeps near-term messages so pop_due need not decode them (RECENT_WINDOW_MS); what is
    released must be exactly what a restart decodes from storage, through the mutable bucket and
    through sealed buckets, and at most maxUnackedPerBucket messages are kept."""
    st = MemorySnapshotStorage()
    now = 1_000_000
    ix = new_index(st, clock=lambda: now, **SMALL)
    soon, later = now + 10, now + RECENT_WINDOW_MS + 1_000
    msgs = [msg(1 + e // 7, e, soon if e % 3 else later, payload=b"p%d" % e, partition=e % 2 - 1,
                key=None if e % 4 else f"k{e}", properties={"a": str(e), "b": "x"} if e % 2 else {},
                event_time=e % 5, target=f"persistent://t/n/o{e}" if e % 6 == 0 else None) for e in range(40)]
    ix.add(msgs[:5])
    assert 0 < len(ix._recent) <= 4  # near-term ones only
    ix.add(msgs[5:])
    assert len(ix._recent) <= 10  # maxUnackedPerBucket
    got = drain(ix)
    assert not ix._recent and ix.stats().immutable_buckets >= 1
    decoded = drain(new_index(st, **SMALL))  # nothing committed: all released again, from storage
    assert len(got) == len(decoded) == 40
    assert [(r.seq, r.key, r.release_ts, r.cancelled, r.message) for r in got] == \
        [(r.seq, r.key, r.release_ts, r.cancelled, r.message) for r in decoded]


# -- threads -------------------------------------------------------------------------------------

def test_one_adder_thread_and_one_release_thread(tmp_path: Path):
    st = DirectorySnapshotStorage(tmp_path)
    ix = new_index(st, max_unacked_per_bucket=300, delayed_delivery_max_indexes_per_bucket_snapshot_segment=50,
                   delayed_delivery_max_num_buckets=4)
    base = int(time.time() * 1000)
    n_batches, per = 40, 100
    done = threading.Event()
    errors: List[BaseException] = []

    def adder() -> None:
        try:
            for b in range(n_batches):
                ix.add([msg(1 + b // 10, (b % 10) * per + e, base + (e * 37) % 200) for e in range(per)])
                ix.maybe_seal(int(time.time() * 1000))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            done.set()

    got: List = []
    t = threading.Thread(target=adder)
    t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        batch = ix.pop_due(int(time.time() * 1000), 500)
        got.extend(batch)
        if batch:
            ix.commit(batch[-1].seq)
        if done.is_set() and ix.pending_count() == 0:
            break
        time.sleep(0.002)
    t.join(10)
    assert not errors
    assert [r.seq for r in got] == list(range(1, n_batches * per + 1))
    keys = [r.key for r in got]
    assert keys == sorted(keys)
    assert len({(r.message.ledger_id, r.message.entry_id) for r in got}) == n_batches * per
