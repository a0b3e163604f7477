"""The PIP-195 bucket index: a durable delayed-message scheduler with bounded memory.

Structure (as in Pulsar's BucketDelayedDeliveryTracker):
* the last mutable bucket holds recent items in memory (a heap) and, unlike Pulsar, is durable
  through a journal in the snapshot storage;
* sealing turns it into an immutable bucket: a snapshot (entry 0 metadata with per-segment
  per-ledger RoaringBitmaps, entries 1..N segments) plus an entry in the manifest;
* each immutable bucket keeps one segment in memory (its first unreleased one); a heap of the
  buckets' heads (the "shared priority queue" of loaded segments, merged k-way) and the mutable
  heap give the next item; the next segment is loaded when one empties;
* adjacent buckets are merged when there are more than delayed_delivery_max_num_buckets.

Ordering and sequence ids: every item gets a release key (ts, ledger, entry) at insertion with
ts = max(deliver_at, last released ts + 1), stored in DelayedIndex.timestamp. Releases are in
strictly increasing key order and numbered seq = 1, 2, ... . commit(seq) persists the watermark
(key, seq); after a restart everything after it is released again with identical seqs.

Thread-safety: every public method may be called from any thread. Mutations (add, cancel,
seal, maybe_seal, recover) serialize on one lock and may do storage I/O for a long time
(seals, merges); pop_due and commit serialize on another and only wait for the short
in-memory critical sections of the mutators. The intended use is one thread calling add/cancel/
maybe_seal and one release thread calling pop_due/commit.

See docs/bucket-format.md for the formats and the rules.
"""
from __future__ import annotations

import heapq
import logging
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from pyroaring import BitMap

from .bitmap import LedgerBitmaps, deserialize_bitmap
from .codec import (
    BucketRef,
    DelayedIndex,
    Item,
    JournalRecord,
    Manifest,
    ReleaseCursor,
    SnapshotMetadata,
    decode_framed,
    make_item,
    release_ts,
    encode_journal_cancel,
    frame,
    index_id_of,
    index_item,
    index_key,
    index_to_message,
    parse,
    upgrade_index,
    parse_segment,
)
from .config import BucketConfig
from .keys import bucket_key
from .manifest import MANIFEST_FORMAT_VERSION, bucket_ref, manifest_bytes
from .merge_policy import select_merge_window
from .metrics import OpMetrics
from .records import (
    BucketStats,
    CancelResult,
    DelayedMessage,
    MAX_ENTRY_ID,
    MAX_U64,
    RecoveryReport,
    Release,
    ReleaseKey,
)
from .sealing import pulsar_seal_due
from .memory import release_free_memory
from .segments import CutSegment, SegmentCutter, cut_segments, snapshot_metadata_bytes
from .storage import BucketSnapshotStorage, StorageError

logger = logging.getLogger(__name__)

_PLACEHOLDER = -1  # ledger id of a heap head whose segment is not loaded (sorts first at equal ts)

ObsoleteCallback = Callable[[int, str], None]


HORIZON_SLACK_MS = 1000


class EngineFailedError(RuntimeError):
    """A durable write had an unknown outcome; this engine object must be dropped and a new
    one recovered from the storage (the storage holds the truth)."""


class NotRecoveredError(RuntimeError):
    """recover() must be called (once) before the engine is used."""


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)


@dataclass(eq=False)
class _Bucket:
    """In-memory state of one immutable bucket."""

    bucket_id: int
    key: str
    start_ledger: int
    end_ledger: int
    seg_min: array  # per segment: min_schedule_timestamp
    seg_max: array  # per segment: max_schedule_timestamp
    seg_count: array  # per segment: number of indexes
    snapshot_length: int
    index_count: int
    cur: int = 0  # index of the current (loaded or to-load) segment; == nseg when drained
    seg: Optional[object] = None  # decoded SnapshotSegment of `cur`
    pos: int = 0  # next index in `seg`
    remaining: int = 0  # unreleased items
    last_key: Optional[ReleaseKey] = None  # key of the bucket's last item, when known

    @property
    def nseg(self) -> int:
        return len(self.seg_min)

    @property
    def drained(self) -> bool:
        return self.cur >= len(self.seg_min)

    def ref(self) -> "BucketRef":
        return bucket_ref(self.bucket_id, self.key, self.start_ledger, self.end_ledger,
                          self.snapshot_length, self.index_count)


def _seg_arrays(segments: Sequence[CutSegment]) -> Tuple[array, array, array]:
    return (
        array("Q", (s.min_ts for s in segments)),
        array("Q", (s.max_ts for s in segments)),
        array("Q", (s.count for s in segments)),
    )


_key_of = index_key  # (timestamp, ledger_id, index_id) of a decoded DelayedIndex, either layout


def _first_after(seg, key: Optional[ReleaseKey]) -> int:
    """Position of the first index in `seg` with a key > `key` (len when none)."""
    indexes = seg.indexes
    lo, hi = 0, len(indexes)
    if key is None:
        return 0
    while lo < hi:  # keys in a segment are strictly increasing
        mid = (lo + hi) // 2
        if _key_of(indexes[mid]) <= key:
            lo = mid + 1
        else:
            hi = mid
    return lo


class BucketIndex:
    """PIP-195 bucket-based delayed-message index over a BucketSnapshotStorage.

    Call recover() once before anything else (it also initialises an empty storage).
    `on_snapshot_obsolete(bucket_id, bucket_key)` receives snapshots no longer in the index
    (exhausted, merged away, orphaned by a crash); it must be idempotent (after a crash it may be
    called again for the same bucket). Default: delete from the storage directly.
    `clock` gives ms since the epoch for the age-based seal rule.
    """

    def __init__(
        self,
        storage: BucketSnapshotStorage,
        config: Optional[BucketConfig] = None,
        on_snapshot_obsolete: Optional[ObsoleteCallback] = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.storage = storage
        self.config = config or BucketConfig()
        if not isinstance(self.config, BucketConfig):
            raise TypeError(f"config must be a BucketConfig, got {type(self.config).__name__}")
        self._on_obsolete = on_snapshot_obsolete or self._delete_directly
        self._clock = clock
        self._write_lock = threading.Lock()  # mutations (add, cancel, seal, merge, recover)
        self._cursor_lock = threading.Lock()  # pop_due, commit (cursor writes)
        self._lock = threading.Lock()  # in-memory state; held briefly
        self._metrics = OpMetrics()
        self._recovered = False
        self._failed: Optional[str] = None
        # mutable bucket
        self._mheap: List[Item] = []
        self._mreleased: List[Item] = []
        self._mstart = -1
        self._mend = -1
        self._moldest_ms: Optional[int] = None
        # immutable buckets
        self._buckets: List[_Bucket] = []
        self._by_id: Dict[int, _Bucket] = {}
        self._heap: List[Tuple[int, int, int, int]] = []
        self._writing: Set[int] = set()
        self._pending_delete: Dict[int, str] = {}
        self._max_bucket_id = 0
        # item sets
        self._pending = LedgerBitmaps()
        self._seen = LedgerBitmaps()
        self._tombstones = LedgerBitmaps()
        # release state
        self._released: Deque[Tuple[int, int, int, int, bool]] = deque()  # (seq, ts, l, e, cancelled)
        self._last_key: Optional[ReleaseKey] = None
        self._seq = 0
        self._committed_key: Optional[ReleaseKey] = None
        self._committed_seq = 0
        self._ts_floor = 0  # new items get ts >= _ts_floor + 1
        self._inflight_min_ts: Optional[int] = None
        self._persisted_horizon = 0
        self._journal_last = 0
        self._journal_cut = 0

    # ------------------------------------------------------------------ helpers / guards --
    def _delete_directly(self, bucket_id: int, key: str) -> None:
        t0 = time.monotonic()
        ok = False
        try:
            self.storage.delete(bucket_id)
            ok = True
            logger.info("deleted bucket snapshot %d (%s)", bucket_id, key)
        finally:
            self._metrics.record("delete", ok, (time.monotonic() - t0) * 1000)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise EngineFailedError(f"bucket index unusable after a failed durable write ({self._failed}); "
                                    "create a new BucketIndex and recover()")
        if not self._recovered:
            raise NotRecoveredError("call BucketIndex.recover() before using the index")

    def _fail(self, what: str, exc: BaseException) -> EngineFailedError:
        self._failed = f"{what}: {exc}"
        logger.error("bucket index failed: %s: %s", what, exc)
        return EngineFailedError(f"{what} failed ({exc}); create a new BucketIndex and recover()")

    @staticmethod
    def _check_uint(name: str, value: int, hi: int = MAX_U64) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
            raise ValueError(f"{name} must be an int in [0, {hi}], got {value!r}")

    # ----------------------------------------------------------------------- recovery -------
    def recover(self) -> RecoveryReport:
        """Load the index from storage: cursor, manifest, journal, and for each bucket its
        metadata (entry 0) and the first segment that still has items after the watermark.
        Never reads the whole backlog. Must be called exactly once, before any other use."""
        with self._write_lock:
            report = self._recover_locked()
            self._hand_off_obsolete()
        release_free_memory()  # recovery's transient decoding would otherwise stay in the RSS
        logger.info(
            "recovered bucket index: %d buckets, %d pending, %d journal records, %d metadata + %d segment "
            "reads (%d bytes), committed seq %d, %.1f ms",
            report.buckets, report.pending, report.journal_records, report.metadata_reads,
            report.segment_reads, report.bytes_read, report.committed_seq, report.duration_ms,
        )
        return report

    def _recover_locked(self) -> RecoveryReport:
        with self._cursor_lock, self._lock:
            if self._recovered:
                raise RuntimeError("recover() was already called on this BucketIndex; create a new one")
            t0 = time.monotonic()
            counters = {"metadata": 0, "segments": 0, "loaded": 0, "bytes": 0}
            self._recover_cursor(counters)
            refs, pending_delete = self._recover_manifest(counters)
            records = self.storage.journal_read()
            orphans = [b for b in self.storage.list_snapshots(self._max_bucket_id)]
            exhausted = []
            for ref in refs:
                bucket = self._recover_bucket(ref, counters)
                if bucket is None:
                    exhausted.append((ref.bucket_id, ref.bucket_key))
                    continue
                self._buckets.append(bucket)
                self._by_id[bucket.bucket_id] = bucket
            journal_records = self._replay_journal(records, counters)
            # Keep the tombstones of pending items and of items not added yet (cancelled early).
            self._tombstones = self._tombstones.intersection(self._pending).union(
                self._tombstones.difference(self._seen))
            for bid in orphans:
                pending_delete.setdefault(bid, "")
            for bid, key in exhausted:
                pending_delete.setdefault(bid, key)
            self._pending_delete = pending_delete
            self._max_bucket_id = max([self._max_bucket_id] + orphans)
            self._recovered = True
            if exhausted or orphans:
                self._write_manifest_locked(self._buckets)
            report = RecoveryReport(
                buckets=len(self._buckets),
                pending=len(self._pending),
                mutable_items=len(self._mheap),
                journal_records=journal_records,
                metadata_reads=counters["metadata"],
                segment_reads=counters["segments"],
                segments_loaded=counters["loaded"],
                bytes_read=counters["bytes"],
                exhausted_buckets=len(exhausted),
                orphans_deleted=len(orphans),
                committed_seq=self._committed_seq,
                duration_ms=(time.monotonic() - t0) * 1000,
            )
        return report

    def _recover_cursor(self, counters: Dict[str, int]) -> None:
        raw = self.storage.get_cursor()
        if raw is None:
            return
        counters["bytes"] += len(raw)
        cur = parse(ReleaseCursor, raw, "release cursor")
        if cur.has_watermark:
            self._committed_key = (cur.ts, cur.ledger_id, cur.entry_id)
            self._last_key = self._committed_key
        self._committed_seq = self._seq = cur.seq
        self._persisted_horizon = cur.horizon
        self._ts_floor = max(cur.horizon, self._committed_key[0] if self._committed_key else 0)

    def _recover_manifest(self, counters: Dict[str, int]) -> Tuple[list, Dict[int, str]]:
        raw = self.storage.get_manifest()
        if raw is None:
            return [], {}
        counters["bytes"] += len(raw)
        man = parse(Manifest, raw, "bucket manifest")
        if man.format_version > MANIFEST_FORMAT_VERSION:
            raise StorageError(f"bucket manifest format {man.format_version} is newer than supported "
                               f"({MANIFEST_FORMAT_VERSION})")
        self._seen = LedgerBitmaps.from_proto_map(man.seen, "manifest seen-set")
        self._tombstones = LedgerBitmaps.from_proto_map(man.tombstones, "manifest tombstones")
        self._journal_cut = self._journal_last = man.journal_cut
        self._max_bucket_id = man.max_bucket_id
        return list(man.buckets), {bid: "" for bid in man.pending_delete}

    def _recover_bucket(self, ref, counters: Dict[str, int]) -> Optional[_Bucket]:
        bid = ref.bucket_id
        raw = self.storage.get_metadata(bid)
        counters["metadata"] += 1
        counters["bytes"] += len(raw)
        meta = parse(SnapshotMetadata, raw, f"bucket {bid} metadata")
        bitmaps = []
        counts = array("Q")
        for i, sm in enumerate(meta.metadata_list):
            per_ledger = {}
            # Layout 2 keeps one bit per message in the extension map (the Pulsar map holds entry
            # ids); in layout 1 the Pulsar map itself held index ids.
            id_map = sm.index_id_bit_map if len(sm.index_id_bit_map) else sm.delayed_index_bit_map
            for ledger, data in id_map.items():
                try:
                    per_ledger[ledger] = deserialize_bitmap(data)
                except ValueError as exc:
                    raise StorageError(f"bucket {bid} segment {i + 1} bitmap of ledger {ledger}: {exc}") from exc
            bitmaps.append(per_ledger)
            counts.append(sum(len(b) for b in per_ledger.values()))
        bucket = _Bucket(
            bucket_id=bid,
            key=ref.bucket_key,
            start_ledger=ref.start_ledger_id,
            end_ledger=ref.end_ledger_id,
            seg_min=array("Q", (m.min_schedule_timestamp for m in meta.metadata_list)),
            seg_max=array("Q", (m.max_schedule_timestamp for m in meta.metadata_list)),
            seg_count=counts,
            snapshot_length=ref.snapshot_length,
            index_count=ref.index_count,
        )
        w = self._committed_key
        n = bucket.nseg
        # Skip segments entirely at or before the watermark (Pulsar skips segments whose
        # max_schedule_timestamp <= cutoff; ours is the committed release key).
        i = 0
        if w is not None:
            while i < n and bucket.seg_max[i] < w[0]:
                i += 1
        if i < n and (w is None or bucket.seg_min[i] > w[0]):
            return self._recover_lazily(bucket, i, bitmaps, counts)
        while i < n:
            # A segment whose max timestamp equals the watermark's may end at or before it:
            # fetch the next one in the same call so recovery stays one read per bucket.
            last = i + 1 if (w is not None and bucket.seg_max[i] == w[0] and i + 1 < n) else i
            datas = self.storage.get_segments(bid, i + 1, last + 1)
            counters["segments"] += 1
            for k, data in enumerate(datas):
                counters["bytes"] += len(data)
                seg = parse_segment(data, f"bucket {bid} segment {i + k + 1}")
                pos = _first_after(seg, w)
                if pos < len(seg.indexes):
                    bucket.cur, bucket.seg, bucket.pos = i + k, seg, pos
                    counters["loaded"] += 1
                    break
            if bucket.seg is not None:
                break
            i = last + 1
        if bucket.seg is None:
            return None  # every item is at or before the watermark: exhausted
        seg = bucket.seg
        loaded: Dict[int, List[int]] = {}
        for idx in seg.indexes[bucket.pos:]:
            loaded.setdefault(idx.ledger_id, []).append(index_id_of(idx))
        for ledger, entries in loaded.items():
            self._pending.add_many(ledger, entries)
        bucket.remaining = len(seg.indexes) - bucket.pos
        self._pending_from_bitmaps(bucket, bucket.cur + 1, bitmaps, counts)
        if bucket.cur == n - 1:
            bucket.last_key = _key_of(seg.indexes[len(seg.indexes) - 1])
        heapq.heappush(self._heap, (*index_key(seg.indexes[bucket.pos]), bid))
        return bucket

    def _recover_lazily(self, bucket: _Bucket, first: int, bitmaps: List[Dict[int, BitMap]],
                        counts: array) -> _Bucket:
        """A bucket whose segments from `first` on all lie after the watermark: nothing of it
        was released, so its pending items are exactly those segments' bitmaps, and its first
        segment is read only when its placeholder reaches the top of the heap (_load_current),
        as after a segment is drained. Recovery then reads no segment of such buckets: a writer
        started on a seeded store of N buckets would otherwise hold N decoded segments before
        its first release."""
        bucket.cur = first
        self._pending_from_bitmaps(bucket, first, bitmaps, counts)
        heapq.heappush(self._heap, (bucket.seg_min[first], _PLACEHOLDER, _PLACEHOLDER, bucket.bucket_id))
        return bucket

    def _pending_from_bitmaps(self, bucket: _Bucket, first: int, bitmaps: List[Dict[int, BitMap]],
                              counts: array) -> None:
        """Segments `first`.. of `bucket` are unreleased: their index-id bitmaps join the pending
        set and their counts the bucket's remaining items."""
        later: Dict[int, list] = {}
        for k in range(first, bucket.nseg):
            for ledger, bm in bitmaps[k].items():
                later.setdefault(ledger, []).append(bm)
            bucket.remaining += counts[k]
        for ledger, bms in later.items():  # one multi-way union per ledger beats repeated |=
            self._pending.update_ledger(ledger, BitMap.union(*bms) if len(bms) > 1 else bms[0])

    def _replay_journal(self, records: List[Tuple[int, bytes]], counters: Dict[str, int]) -> int:
        w = self._committed_key
        used = 0
        replayed: Set[Tuple[int, int]] = set()
        seen: Dict[int, List[int]] = {}
        pending: Dict[int, List[int]] = {}
        for rid, raw in records:
            if rid <= self._journal_cut:
                continue  # already covered by a snapshot (crash between manifest and truncate)
            used += 1
            counters["bytes"] += len(raw)
            rec = parse(JournalRecord, raw, f"journal record {rid}")
            if rec.add:
                # The add field is wire-identical to SnapshotSegment.indexes: decode all at once.
                indexes = parse_segment(raw, f"journal record {rid} items").indexes
                for idx, blob in zip(indexes, rec.add):
                    ledger, entry = idx.ledger_id, index_id_of(idx)
                    # The manifest's seen-set may already hold journal items (any manifest write
                    # after the last seal includes them); within the journal the first record wins.
                    if (ledger, entry) in replayed:
                        continue
                    replayed.add((ledger, entry))
                    seen.setdefault(ledger, []).append(entry)
                    key = (idx.timestamp, ledger, entry)
                    if w is not None and key <= w:
                        continue  # released and committed before the restart
                    # A layout-1 record is rewritten in layout 2 here, so the next seal writes it so.
                    self._mheap.append(index_item(idx) if upgrade_index(idx) else (key[0], ledger, entry, frame(blob)))
                    pending.setdefault(ledger, []).append(entry)
            for op in rec.cancel:
                self._tombstones.add(op.ledger_id, op.entry_id)
            self._journal_last = max(self._journal_last, rid)
        for ledger, entries in seen.items():
            self._seen.add_many(ledger, entries)
        for ledger, entries in pending.items():
            self._pending.add_many(ledger, entries)
        if pending:
            self._mstart, self._mend = min(pending), max(pending)
        heapq.heapify(self._mheap)
        if self._mheap:
            self._moldest_ms = self._clock()
        return used

    # ------------------------------------------------------------------------- adding -------
    def add(self, messages: Sequence[DelayedMessage]) -> List[bool]:
        """Add messages; returns per message True (added) or False (its (ledger, entry) was
        added before, ever — duplicate, ignored — or cancelled before its add, dropped). Returns only when the added items are durable
        (journaled); the caller may ack the source messages then. May seal and merge."""
        msgs = list(messages)
        for m in msgs:
            if type(m) is not DelayedMessage:
                if not isinstance(m, DelayedMessage):
                    raise TypeError(f"add() takes DelayedMessage objects, got {type(m).__name__}")
            m.validate()
        results = [False] * len(msgs)
        max_unacked = self.config.max_unacked_per_bucket
        min_index = self.config.delayed_delivery_min_index_count_per_bucket
        with self._write_lock:
            self._check_usable()
            seen = self._seen.contains
            # A tombstone of a position never seen: its cancel came first, drop the add.
            cancelled_early = self._tombstones.contains
            batch: List[Tuple[int, DelayedMessage]] = []
            batch_ids: Set[Tuple[int, int]] = set()
            max_ledger = self._mend
            mutable_count = len(self._mheap) + len(self._mreleased)
            seal_failed = False  # after a failed seal, do not retry for every message of the call
            for i, m in enumerate(msgs):
                ident = (m.ledger_id, m.entry_id)
                if ident in batch_ids or seen(m.ledger_id, m.entry_id) or cancelled_early(m.ledger_id, m.entry_id):
                    continue
                if (m.ledger_id > max_ledger and mutable_count + len(batch) >= min_index and not seal_failed
                        and self._pulsar_seal_due(m.ledger_id, max_ledger, mutable_count + len(batch))):
                    self._flush(batch, results)
                    batch, batch_ids = [], set()
                    seal_failed = not self._seal_locked("ledger boundary + delayedDeliveryMinIndexCountPerBucket")
                    mutable_count = len(self._mheap) + len(self._mreleased)
                    max_ledger = self._mend
                batch.append((i, m))
                batch_ids.add(ident)
                if m.ledger_id > max_ledger:
                    max_ledger = m.ledger_id
                if mutable_count + len(batch) >= max_unacked and not seal_failed:
                    self._flush(batch, results)
                    batch, batch_ids = [], set()
                    seal_failed = not self._seal_locked("maxUnackedPerBucket")
                    mutable_count = len(self._mheap) + len(self._mreleased)
                    max_ledger = self._mend
            self._flush(batch, results)
            self._maintain_locked()
        return results

    def _pulsar_seal_due(self, ledger: int, mutable_end: int, mutable_count: int) -> bool:
        # Pulsar's rule (sealing.py); the coverage scan only runs when the count rule holds.
        if mutable_count == 0 or ledger <= mutable_end \
                or mutable_count < self.config.delayed_delivery_min_index_count_per_bucket:
            return False
        return pulsar_seal_due(ledger, mutable_end, mutable_count,
                               self.config.delayed_delivery_min_index_count_per_bucket,
                               covered=any(b.start_ledger <= ledger <= b.end_ledger for b in self._buckets))

    def _flush(self, batch: List[Tuple[int, DelayedMessage]], results: List[bool]) -> None:
        """Journal a batch, then make it visible to pop_due."""
        if not batch:
            return
        with self._lock:
            floor = self._ts_floor + 1
            # Until the batch is visible, pop_due must not release anything with a key it could
            # precede: hold releases below the smallest timestamp the batch will get.
            self._inflight_min_ts = max(floor, min(m.deliver_at for _, m in batch))
        try:
            items = []
            by_ledger: Dict[int, List[int]] = {}
            for _, m in batch:
                items.append(make_item(m, release_ts(m.deliver_at, floor)))
                entries = by_ledger.get(m.ledger_id)
                if entries is None:
                    by_ledger[m.ledger_id] = [m.entry_id]
                else:
                    entries.append(m.entry_id)
            try:
                rid = self.storage.journal_append(b"".join([it[3] for it in items]))
            except Exception as exc:
                raise self._fail("journal append", exc) from exc
            now = self._clock()
            lo, hi = min(by_ledger), max(by_ledger)
            with self._lock:
                mheap = self._mheap
                if mheap:
                    for it in items:
                        heapq.heappush(mheap, it)
                else:
                    mheap.extend(items)
                    heapq.heapify(mheap)
                for ledger, entries in by_ledger.items():
                    self._pending.add_many(ledger, entries)
                    self._seen.add_many(ledger, entries)
                self._mstart = lo if self._mstart < 0 else min(self._mstart, lo)
                self._mend = max(self._mend, hi)
                if self._moldest_ms is None:
                    self._moldest_ms = now
                self._journal_last = rid
        finally:
            with self._lock:
                self._inflight_min_ts = None
        for i, _ in batch:
            results[i] = True

    # ----------------------------------------------------------------------- cancelling -----
    def cancel(self, ledger_id: int, entry_id: int) -> CancelResult:
        """Cancel an item: a durable tombstone. A pending item is still released in its turn (it
        consumes its seq), flagged cancelled=True. An item not added yet - its cancel overtook
        it (a redelivery, another partition) - is dropped when its add arrives; such tombstones
        are kept for good (one bit each). Cancelling a released item is reported."""
        self._check_uint("ledger_id", ledger_id)
        self._check_uint("entry_id", entry_id, MAX_ENTRY_ID)
        with self._write_lock:
            self._check_usable()
            with self._lock:
                seen = self._seen.contains(ledger_id, entry_id)
                # Released (flagged, if cancelled) wins over a tombstone kept until the commit.
                if seen and not self._pending.contains(ledger_id, entry_id):
                    return CancelResult.ALREADY_RELEASED
                if self._tombstones.contains(ledger_id, entry_id):
                    return CancelResult.ALREADY_CANCELLED
            try:
                rid = self.storage.journal_append(encode_journal_cancel(ledger_id, entry_id))
            except Exception as exc:
                raise self._fail("journal append (cancel)", exc) from exc
            with self._lock:
                self._journal_last = rid
                # pop_due may have released it while the tombstone was being written.
                if seen and not self._pending.contains(ledger_id, entry_id):
                    return CancelResult.ALREADY_RELEASED
                self._tombstones.add(ledger_id, entry_id)
            logger.info("cancelled delayed message %d:%d%s", ledger_id, entry_id, "" if seen else " before its add")
            return CancelResult.CANCELLED if seen else CancelResult.CANCELLED_BEFORE_ADD

    # ------------------------------------------------------------------------ sealing -------
    def seal(self) -> bool:
        """Seal the mutable bucket now (if it holds anything). True when a seal happened."""
        with self._write_lock:
            self._check_usable()
            done = self._seal_locked("requested")
            self._maintain_locked()
            return done

    def maybe_seal(self, now_ms: int) -> None:
        """Periodic maintenance: seal when the mutable bucket's oldest item was added more than
        max_seal_delay_millis before `now_ms`; delete exhausted buckets; merge when over
        MaxNumBuckets; retry handing obsolete snapshots to the deleter. Call it from the adding
        thread (it may do long storage I/O)."""
        self._check_uint("now_ms", now_ms)
        with self._write_lock:
            self._check_usable()
            oldest = self._moldest_ms
            if oldest is not None and now_ms - oldest >= self.config.max_seal_delay_millis:
                self._seal_locked("maxSealDelayMillis")
            self._maintain_locked()

    def _seal_locked(self, reason: str) -> bool:
        with self._lock:
            w = self._committed_key
            items = [it for it in self._mheap if w is None or it[:3] > w]
            items += [it for it in self._mreleased if w is None or it[:3] > w]
            cut = self._journal_last
        if not self._mheap and not self._mreleased:
            return False
        items.sort()
        bucket = None
        if items:
            segments = cut_segments(items, self.config.time_step_ms,
                                    self.config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
            start = min(it[1] for it in items)
            end = max(it[1] for it in items)
            key = bucket_key(start, end)
            bid = self._write_snapshot(key, segments, snapshot_metadata_bytes(segments), "create")
            if bid is None:
                return False
            bucket = self._new_bucket(bid, key, start, end, segments)
            new_list = self._buckets + [bucket]
        else:
            new_list = list(self._buckets)
        try:
            self._write_manifest(new_list, journal_cut=cut)
        except EngineFailedError:
            raise
        with self._lock:
            if bucket is not None:
                self._install(bucket, segments, {})
                self._buckets.append(bucket)
                self._by_id[bucket.bucket_id] = bucket
                self._writing.discard(bucket.bucket_id)
            self._mheap = []
            self._mreleased = []
            self._mstart = self._mend = -1
            self._moldest_ms = None
            self._journal_cut = cut
        logger.info("sealed mutable bucket (%s): %d items -> bucket %s", reason, len(items),
                    bucket.bucket_id if bucket else "none (all committed)")
        try:
            self.storage.journal_truncate(cut)
        except Exception as exc:  # harmless: recovery skips records <= the manifest's cut
            logger.warning("journal truncate up to %d failed (will retry at next seal): %s", cut, exc)
        return True

    def _write_snapshot(self, key: str, segments: Sequence[CutSegment], metadata: bytes, op: str) -> Optional[int]:
        """Write a whole snapshot; None (logged, counted) when the storage refused."""
        t0 = time.monotonic()
        writer = None
        try:
            writer = self.storage.begin_snapshot(key, self.config.topic, self.config.cursor)
            with self._lock:
                self._writing.add(writer.bucket_id)
            for seg in segments:
                writer.add_segment(seg.data)
            bid = writer.finish(metadata)
        except Exception as exc:
            self._metrics.record(op, False, (time.monotonic() - t0) * 1000)
            logger.warning("creating bucket snapshot %s failed: %s", key, exc)
            self._abort_writer(writer, key)
            return None
        self._metrics.record(op, True, (time.monotonic() - t0) * 1000)
        return bid

    def _new_bucket(self, bid: int, key: str, start: int, end: int, segments: Sequence[CutSegment]) -> _Bucket:
        mins, maxs, counts = _seg_arrays(segments)
        try:
            length = self.storage.get_length(bid)
        except Exception as exc:
            logger.warning("bucket %d: could not read snapshot length: %s", bid, exc)
            length = sum(len(s.data) for s in segments)
        self._max_bucket_id = max(self._max_bucket_id, bid)
        return _Bucket(
            bucket_id=bid, key=key, start_ledger=start, end_ledger=end,
            seg_min=mins, seg_max=maxs, seg_count=counts,
            snapshot_length=length, index_count=int(sum(counts)),
            last_key=segments[-1].last_key if segments else None,
        )

    def _install(self, bucket: _Bucket, segments: Sequence[CutSegment], cached: Dict[int, bytes]) -> None:
        """Position a new bucket after the last released key and put its head in the heap.
        Called with _lock held; `segments` gives each segment's last key."""
        last = self._last_key
        k = 0
        while k < len(segments) and last is not None and segments[k].last_key <= last:
            k += 1
        bucket.cur = k
        if k >= len(segments):
            bucket.remaining = 0
            return
        data = cached.get(k)
        if data is None and k < len(segments) and segments[k].data:
            data = segments[k].data
        if data is None:
            data = self._read_segment(bucket, k)
            if data is None:
                bucket.remaining = sum(bucket.seg_count[k:])  # approximate until loaded
                heapq.heappush(self._heap, (bucket.seg_min[k], _PLACEHOLDER, _PLACEHOLDER, bucket.bucket_id))
                return
        bucket.seg = parse_segment(data, f"bucket {bucket.bucket_id} segment {k + 1}")
        bucket.pos = _first_after(bucket.seg, last)
        bucket.remaining = len(bucket.seg.indexes) - bucket.pos + int(sum(bucket.seg_count[k + 1:]))
        if k == bucket.nseg - 1:
            bucket.last_key = _key_of(bucket.seg.indexes[len(bucket.seg.indexes) - 1])
        head = bucket.seg.indexes[bucket.pos]
        heapq.heappush(self._heap, (*index_key(head), bucket.bucket_id))

    def _read_segment(self, bucket: _Bucket, k: int) -> Optional[bytes]:
        t0 = time.monotonic()
        try:
            data = self.storage.get_segments(bucket.bucket_id, k + 1, k + 1)[0]
        except Exception as exc:
            self._metrics.record("load", False, (time.monotonic() - t0) * 1000)
            logger.warning("loading segment %d of bucket %d failed (will retry): %s", k + 1, bucket.bucket_id, exc)
            return None
        self._metrics.record("load", True, (time.monotonic() - t0) * 1000)
        return data

    # ---------------------------------------------------------------------- manifest --------
    def _manifest_bytes(self, buckets: Sequence[_Bucket], journal_cut: int) -> bytes:
        return manifest_bytes([b.ref() for b in buckets], seen=self._seen, tombstones=self._tombstones,
                              journal_cut=journal_cut, max_bucket_id=self._max_bucket_id,
                              pending_delete=self._pending_delete)

    def _write_manifest(self, buckets: Sequence[_Bucket], journal_cut: Optional[int] = None) -> None:
        with self._lock:
            data = self._manifest_bytes(buckets, self._journal_cut if journal_cut is None else journal_cut)
        try:
            self.storage.put_manifest(data)
        except Exception as exc:
            raise self._fail("manifest write", exc) from exc

    def _write_manifest_locked(self, buckets: Sequence[_Bucket]) -> None:
        data = self._manifest_bytes(buckets, self._journal_cut)
        try:
            self.storage.put_manifest(data)
        except Exception as exc:
            raise self._fail("manifest write", exc) from exc

    # -------------------------------------------------------------------- maintenance -------
    def _maintain_locked(self) -> None:
        self._drop_exhausted()
        guard = len(self._buckets) + 1
        while guard > 0 and self._merge_once():
            guard -= 1
        self._hand_off_obsolete()

    def _drop_exhausted(self) -> None:
        with self._lock:
            w = self._committed_key
            gone = [b for b in self._buckets if b.drained and w is not None
                    and b.last_key is not None and b.last_key <= w]
            if not gone:
                return
            keep = [b for b in self._buckets if b not in gone]
        for b in gone:
            self._pending_delete[b.bucket_id] = b.key
        self._write_manifest(keep)
        with self._lock:
            self._buckets = keep
            for b in gone:
                self._by_id.pop(b.bucket_id, None)
        logger.info("buckets exhausted: %s", ", ".join(str(b.bucket_id) for b in gone))

    def _hand_off_obsolete(self) -> None:
        for bid, key in list(self._pending_delete.items()):
            try:
                self._on_obsolete(bid, key)
            except Exception as exc:
                logger.warning("handing obsolete bucket snapshot %d to the deleter failed (will retry): %s", bid, exc)
                continue
            self._pending_delete.pop(bid, None)

    def _abort_writer(self, writer: Any, key: str) -> None:
        """Drop a half-written snapshot; its id is queued for deletion in case bytes reached storage."""
        if writer is None:
            return
        writer.abort()
        with self._lock:
            self._writing.discard(writer.bucket_id)
        self._pending_delete.setdefault(writer.bucket_id, key)

    # ------------------------------------------------------------------------ merging -------
    def _merge_once(self) -> bool:
        limit = self.config.delayed_delivery_max_num_buckets
        if limit == -1 or len(self._buckets) <= limit:
            return False
        with self._lock:
            counts = [b.remaining for b in self._buckets]
            # Every bucket may merge (see merge_policy): excluding drained-but-uncommitted ones
            # could leave no adjacent window and the bucket count above the limit.
            eligible = [True] * len(self._buckets)
            next_ts = [b.seg_min[b.cur] if not b.drained else MAX_U64 for b in self._buckets]
            w = self._committed_key
        sel = select_merge_window(counts, eligible, next_ts)
        if sel is None:
            return False
        start, width = sel
        sources = self._buckets[start:start + width]
        t0 = time.monotonic()
        merged = self._write_merged(sources, w)
        if merged is None:
            self._metrics.record("merge", False, (time.monotonic() - t0) * 1000)
            return False
        bucket, segments, cached = merged
        new_list = self._buckets[:start] + [bucket] + self._buckets[start + width:]
        for s in sources:
            self._pending_delete[s.bucket_id] = s.key
        self._write_manifest(new_list)
        with self._lock:
            self._install(bucket, segments, cached)
            self._buckets = new_list
            self._by_id[bucket.bucket_id] = bucket
            for s in sources:
                self._by_id.pop(s.bucket_id, None)
            ids = {s.bucket_id for s in sources}
            self._heap = [h for h in self._heap if h[3] not in ids]
            heapq.heapify(self._heap)
            self._writing.discard(bucket.bucket_id)
        self._metrics.record("merge", True, (time.monotonic() - t0) * 1000)
        logger.info("merged buckets %s into bucket %d (%s, %d items)",
                    ", ".join(str(s.bucket_id) for s in sources), bucket.bucket_id, bucket.key, bucket.index_count)
        return True

    def _source_items(self, bucket: _Bucket, w: Optional[ReleaseKey]) -> Iterator[Item]:
        """Every item of `bucket` after the committed watermark, read from its snapshot.

        Reads from the first segment that may hold anything after the watermark — including
        the segment currently loaded in memory and already-released-but-uncommitted items.
        (Pulsar's merge read from currentSegmentEntryId + 1 and lost the loaded segment's
        items: PR #26251.)"""
        first = 0
        if w is not None:
            while first < bucket.nseg and bucket.seg_max[first] < w[0]:
                first += 1
        for k in range(first, bucket.nseg):
            data = self.storage.get_segments(bucket.bucket_id, k + 1, k + 1)[0]
            seg = parse_segment(data, f"bucket {bucket.bucket_id} segment {k + 1}")
            for idx in seg.indexes:
                key = index_key(idx)
                if w is None or key > w:
                    upgrade_index(idx)  # a layout-1 source is merged into layout 2
                    yield index_item(idx)

    def _write_merged(self, sources: Sequence[_Bucket], w: Optional[ReleaseKey]):
        start = min(s.start_ledger for s in sources)
        end = max(s.end_ledger for s in sources)
        key = bucket_key(start, end)
        writer = None
        try:
            writer = self.storage.begin_snapshot(key, self.config.topic, self.config.cursor)
            with self._lock:
                self._writing.add(writer.bucket_id)
            cutter = SegmentCutter(self.config.time_step_ms,
                                   self.config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
            closed: List[CutSegment] = []
            cached: Dict[int, bytes] = {}
            with self._lock:
                last = self._last_key

            def keep(seg: CutSegment) -> None:
                writer.add_segment(seg.data)
                # Keep the bytes of the first couple of segments that may still be unreleased,
                # so installing the merged bucket rarely needs a read.
                if (last is None or seg.last_key > last) and len(cached) < 2:
                    cached[len(closed)] = seg.data
                seg.data = b""  # bounded memory: only metadata stays
                closed.append(seg)

            for item in heapq.merge(*(self._source_items(s, w) for s in sources)):
                seg = cutter.push(item)
                if seg is not None:
                    keep(seg)
            seg = cutter.finish()
            if seg is not None:
                keep(seg)
            if not closed:
                raise StorageError("no item after the watermark to merge")
            bid = writer.finish(snapshot_metadata_bytes(closed))
        except Exception as exc:
            logger.warning("merging buckets %s failed: %s", [s.bucket_id for s in sources], exc)
            self._abort_writer(writer, key)
            return None
        bucket = self._new_bucket(bid, key, start, end, closed)
        return bucket, closed, cached

    # ---------------------------------------------------------------------- releasing -------
    def next_release_time(self) -> Optional[int]:
        """Release-key timestamp (ms) of the next item, or None when nothing is pending in
        memory. pop_due(now_ms) with now_ms >= it releases at least that item."""
        with self._lock:
            cands = []
            if self._mheap:
                cands.append(self._mheap[0][0])
            if self._heap:
                cands.append(self._heap[0][0])
            return min(cands) if cands else None

    def pop_due(self, now_ms: int, max_items: int) -> List[Release]:
        """Release up to `max_items` items with release-key timestamp <= now_ms, in key order,
        numbered with consecutive seqs. Never releases anything later than now_ms. Publish them
        in order and commit(seq) once the broker confirmed them."""
        self._check_uint("now_ms", now_ms)
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items <= 0:
            raise ValueError(f"max_items must be a positive int, got {max_items!r}")
        with self._cursor_lock:
            with self._lock:
                self._check_usable()
                limit = self._limit(now_ms)
                head = self._head_ts()
                need = head is not None and head <= limit and limit > self._persisted_horizon
            if need:
                # Persist an upper bound of every release timestamp before handing items out, so
                # that after a crash new items are ordered after anything possibly published.
                # Slack: one fsync per HORIZON_SLACK_MS instead of one per round; after a crash,
                # new items start at most that much later.
                self._write_cursor(horizon=limit + HORIZON_SLACK_MS)
            with self._lock:
                cap = min(self._limit(now_ms), self._persisted_horizon)
                return self._pop_locked(cap, max_items)

    def _limit(self, now_ms: int) -> int:
        if self._inflight_min_ts is not None:
            return min(now_ms, self._inflight_min_ts - 1)
        return now_ms

    def _head_ts(self) -> Optional[int]:
        a = self._mheap[0][0] if self._mheap else None
        b = self._heap[0][0] if self._heap else None
        if a is None:
            return b
        return a if b is None or a < b else b

    def _pop_locked(self, cap: int, max_items: int) -> List[Release]:
        out: List[Release] = []
        mheap, heap = self._mheap, self._heap
        while len(out) < max_items:
            mh = mheap[0] if mheap else None
            ih = heap[0] if heap else None
            if ih is not None and (mh is None or ih[:3] < mh[:3]):
                if ih[0] > cap:
                    break
                bucket = self._by_id[ih[3]]
                if bucket.seg is None:
                    if not self._load_current(bucket):
                        break  # keep order: nothing may pass a segment we cannot read
                    continue
                idx = bucket.seg.indexes[bucket.pos]
                ts, ledger, entry = ih[0], ih[1], ih[2]
                msg = index_to_message(idx)
                self._advance(bucket)
            elif mh is not None:
                if mh[0] > cap:
                    break
                item = heapq.heappop(mheap)
                self._mreleased.append(item)
                (ts, ledger, entry), msg = decode_framed(item[3])
            else:
                break
            self._seq += 1
            cancelled = self._tombstones.contains(ledger, entry)
            self._pending.discard(ledger, entry)
            self._released.append((self._seq, ts, ledger, entry, cancelled))
            self._last_key = (ts, ledger, entry)
            if ts > self._ts_floor:
                self._ts_floor = ts
            out.append(Release(self._seq, msg, cancelled, ts))
        return out

    def _advance(self, bucket: _Bucket) -> None:
        """Step past the head of `bucket` (which is the top of the heap)."""
        bucket.pos += 1
        bucket.remaining -= 1
        seg = bucket.seg
        if bucket.pos < len(seg.indexes):
            nxt = seg.indexes[bucket.pos]
            heapq.heapreplace(self._heap, (*index_key(nxt), bucket.bucket_id))
            return
        if bucket.cur == bucket.nseg - 1:
            bucket.last_key = _key_of(seg.indexes[len(seg.indexes) - 1])
        bucket.seg = None
        bucket.cur += 1
        if bucket.drained:
            heapq.heappop(self._heap)
            logger.info("bucket %d fully released (deleted once committed)", bucket.bucket_id)
            return
        heapq.heapreplace(self._heap, (bucket.seg_min[bucket.cur], _PLACEHOLDER, _PLACEHOLDER, bucket.bucket_id))
        self._load_current(bucket)

    def _load_current(self, bucket: _Bucket) -> bool:
        """Load segment `bucket.cur` whose placeholder is in the heap; replace the placeholder."""
        data = self._read_segment(bucket, bucket.cur)
        if data is None:
            return False
        try:
            seg = parse_segment(data, f"bucket {bucket.bucket_id} segment {bucket.cur + 1}")
        except ValueError as exc:
            self._metrics.record("load", False, 0.0)
            logger.error("%s", exc)
            return False
        pos = _first_after(seg, self._last_key)
        if pos >= len(seg.indexes):
            # Cannot happen for a consistent snapshot (segments are in key order).
            logger.error("bucket %d segment %d holds nothing after the last release", bucket.bucket_id, bucket.cur + 1)
            return False
        bucket.seg, bucket.pos = seg, pos
        if bucket.cur == bucket.nseg - 1:
            bucket.last_key = _key_of(seg.indexes[len(seg.indexes) - 1])
        head = seg.indexes[pos]
        for n, h in enumerate(self._heap):
            if h[3] == bucket.bucket_id:
                self._heap[n] = (*index_key(head), bucket.bucket_id)
                # The real head is >= the placeholder: restore the heap property downwards.
                heapq.heapify(self._heap)
                break
        return True

    # ----------------------------------------------------------------------- committing -----
    def commit(self, seq: int) -> None:
        """Persist the release watermark: everything up to `seq` was published and confirmed.
        A seq at or below the committed one is ignored; one above the last released is an error."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise ValueError(f"seq must be a non-negative int, got {seq!r}")
        with self._cursor_lock:
            with self._lock:
                self._check_usable()
                if seq <= self._committed_seq:
                    return
                if seq > self._seq:
                    raise ValueError(f"cannot commit seq {seq}: the last released seq is {self._seq}")
                first = self._released[0][0]
                _, ts, ledger, entry, _ = self._released[seq - first]
            self._write_cursor(watermark=((ts, ledger, entry), seq))
            with self._lock:
                while self._released and self._released[0][0] <= seq:
                    _, _, l, e, cancelled = self._released.popleft()
                    if cancelled:
                        self._tombstones.discard(l, e)

    def _write_cursor(self, horizon: Optional[int] = None,
                      watermark: Optional[Tuple[ReleaseKey, int]] = None) -> None:
        """Write the release cursor (called with _cursor_lock held)."""
        key, seq = watermark if watermark is not None else (self._committed_key, self._committed_seq)
        hz = self._persisted_horizon if horizon is None else max(horizon, self._persisted_horizon)
        cur = ReleaseCursor(has_watermark=key is not None, seq=seq, horizon=hz)
        if key is not None:
            cur.ts, cur.ledger_id, cur.entry_id = key
        self.storage.put_cursor(cur.SerializeToString())
        with self._lock:
            self._persisted_horizon = hz
            if watermark is not None:
                self._committed_key, self._committed_seq = key, seq

    # ------------------------------------------------------------------------ queries -------
    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """True while the item with index id `entry_id` of `ledger_id` is pending (added, not yet
        released) — Pulsar's containsMessage at message granularity (the snapshot bitmaps answer
        it per entry, as Pulsar asks). Cancelled items stay pending until their (flagged) release."""
        with self._lock:
            return self._pending.contains(ledger_id, entry_id)

    def was_added(self, ledger_id: int, entry_id: int) -> bool:
        """True when (ledger_id, entry_id) was ever added (pending, released or cancelled)."""
        with self._lock:
            return self._seen.contains(ledger_id, entry_id)

    def pending_count(self) -> int:
        """Items added and not yet released (cancelled ones included)."""
        with self._lock:
            return len(self._pending)

    def is_bucket_in_use(self, bucket_id: int) -> bool:
        """Snapshot-manifest oracle for two-phase deletion: True while the bucket snapshot is
        part of the index (or being written); False once it was handed to the deleter."""
        with self._lock:
            return bucket_id in self._by_id or bucket_id in self._writing

    def bucket_ids(self) -> List[int]:
        """Ids of the immutable buckets in the index, in bucket order."""
        with self._lock:
            return [b.bucket_id for b in self._buckets]

    @property
    def last_seq(self) -> int:
        """The seq of the last released item (0 before the first)."""
        with self._lock:
            return self._seq

    @property
    def committed_seq(self) -> int:
        """The committed watermark's seq."""
        with self._lock:
            return self._committed_seq

    def stats(self) -> BucketStats:
        """Values for the pulsar_delayed_message_index_* metrics."""
        counts, latency, latency_sum = self._metrics.snapshot()
        with self._lock:
            loaded = len(self._mheap) + sum(
                len(b.seg.indexes) - b.pos for b in self._buckets if b.seg is not None
            )
            return BucketStats(
                bucket_total=len(self._buckets) + 1,
                immutable_buckets=len(self._buckets),
                loaded=loaded,
                snapshot_size_bytes=sum(b.snapshot_length for b in self._buckets),
                pending=len(self._pending),
                mutable_items=len(self._mheap) + len(self._mreleased),
                released_uncommitted=len(self._released),
                last_seq=self._seq,
                committed_seq=self._committed_seq,
                op_count=counts,
                op_latency_ms=latency,
                op_latency_sum_ms=latency_sum,
            )
