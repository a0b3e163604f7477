"""The PIP-195 bucket index: a durable delayed-message scheduler with bounded memory.

Structure (as in Pulsar's BucketDelayedDeliveryTracker; this class is its front door and keeps
the release numbering, the item sets and the locks; each part is its own module):
* the last mutable bucket (mutable_bucket.MutableBucket) holds recent items in memory (packed
  columns and sorted runs, no Python object per item) and, unlike Pulsar, is durable through a
  journal in the snapshot storage;
* sealing turns it into an immutable bucket: a snapshot (entry 0 metadata with per-segment
  per-ledger RoaringBitmaps, entries 1..N segments; segments.py, bitmap.py) plus an entry in the
  manifest (manifest.py); snapshots.BucketSnapshots writes, reads and hands off snapshot files;
* each immutable bucket (immutable_bucket.ImmutableBucket) keeps one segment in memory (its first
  unreleased one); the shared queue of the buckets' heads (shared_queue.SharedBucketQueue,
  Pulsar's sharedBucketPriorityQueue, merged k-way) and the mutable heap give the next item; the
  next segment is loaded when one empties;
* adjacent buckets are merged when there are more than delayed_delivery_max_num_buckets (merge.py);
* recover() rebuilds all of it from the storage (recovery.py).

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

import logging
import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

from ..clock import wall_clock_ms
from .bitmap import LedgerBitmaps
from .codec import (
    ReleaseCursor,
    decode_framed,
    encode_batch,
    encode_journal_cancel,
    release_ts,
)
from .config import BucketConfig
from .exceptions import EngineFailedError, NotRecoveredError
from .immutable_bucket import ImmutableBucket
from .keys import bucket_key
from .manifest import manifest_bytes
from .memory import release_free_memory
from .merge import merge_window, write_merged
from .metrics import OpMetrics
from .mutable_bucket import MutableBucket
from .positions import format_user_id
from .records import (
    MAX_ENTRY_ID,
    MAX_U64,
    BucketStats,
    CancelResult,
    DelayedMessage,
    RecoveryReport,
    Release,
    ReleaseKey,
)
from .recovery import (
    RecoveryCounters,
    prefetch_metadata,
    read_cursor,
    read_manifest,
    recover_bucket,
    replay_journal,
)
from .sealing import pulsar_seal_due
from .segments import CutSegment, snapshot_metadata_bytes
from .shared_queue import SharedBucketQueue
from .snapshots import BucketSnapshots, ObsoleteCallback
from .storage import BucketSnapshotStorage

logger = logging.getLogger(__name__)


# How far ahead of a round's time pop_due makes its release-time bound durable: one cursor write
# per this much release time (10 per second of continuous releases), and after a crash the
# items added wait at most this long after the dead process's last round. 1 s made a SIGKILL
# restart's first release wait for it (0.98 s against 0.74 s at 100 ms, docs/benchmarks.md).
HORIZON_SLACK_MS = 100
# add() keeps the DelayedMessage of an item due within this window (at most
# maxUnackedPerBucket of them), so pop_due releases it without decoding the journaled bytes
# again: decoding was ~15 % of the writer's CPU when items are released as they arrive. Items
# due later are decoded from their record as before; memory stays bounded either way.
RECENT_WINDOW_MS = 5000


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
        self._clock = clock
        self._write_lock = threading.Lock()  # mutations (add, cancel, seal, merge, recover)
        self._cursor_lock = threading.Lock()  # pop_due, commit (cursor writes)
        self._lock = threading.Lock()  # in-memory state; held briefly
        self._metrics = OpMetrics()
        self._recovered = False
        self._failed: Optional[str] = None
        self._snapshots = BucketSnapshots(storage, self.config, self._metrics, self._lock, on_snapshot_obsolete)
        self._mutable = MutableBucket()
        # immutable buckets, in manifest order, and the shared queue of their heads
        self._buckets: List[ImmutableBucket] = []
        self._by_id: Dict[int, ImmutableBucket] = {}
        self._queue = SharedBucketQueue(self._snapshots.read_segment, self._metrics)
        self._max_bucket_id = 0
        # item sets
        self._pending = LedgerBitmaps()
        self._seen = LedgerBitmaps()
        self._tombstones = LedgerBitmaps()
        # Tombstones of positions not seen (a cancel before its message, or of an unknown id) ->
        # since when (this clock, ms; at recovery the recovery's time): expire_unknown_cancels.
        self._unknown_since: Dict[Tuple[int, int], int] = {}
        # release state
        self._released: Deque[Tuple[int, int, int, int, bool]] = deque()  # (seq, ts, l, e, cancelled)
        self._last_key: Optional[ReleaseKey] = None
        self._seq = 0
        self._committed_key: Optional[ReleaseKey] = None
        self._committed_seq = 0
        self._ts_floor = 0  # new items get ts >= _ts_floor + 1
        self._inflight_min_ts: Optional[int] = None
        # (ledger, index id) -> the message add() was given, for items due soon (RECENT_WINDOW_MS);
        # taken by the release. Only what is journaled is ever released: this is the same message.
        self._recent: Dict[Tuple[int, int], DelayedMessage] = {}
        self._persisted_horizon = 0
        self._journal_last = 0
        self._journal_cut = 0

    # ------------------------------------------------------------------ helpers / guards --
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
            self._snapshots.hand_off_obsolete()
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
            counters = RecoveryCounters()
            cursor = read_cursor(self.storage, counters)
            if cursor is not None:
                self._committed_key = self._last_key = cursor.committed_key
                self._committed_seq = self._seq = cursor.seq
                self._persisted_horizon = cursor.horizon
                self._ts_floor = cursor.ts_floor
            manifest = read_manifest(self.storage, counters)
            self._seen, self._tombstones = manifest.seen, manifest.tombstones
            self._journal_cut = self._journal_last = manifest.journal_cut
            self._max_bucket_id = manifest.max_bucket_id
            pending_delete = manifest.pending_delete
            records = self.storage.journal_read()
            orphans = [b for b in self.storage.list_snapshots(self._max_bucket_id)]
            exhausted = []
            for ref, raw in zip(manifest.refs, prefetch_metadata(self.storage, manifest.refs)):
                bucket = recover_bucket(self.storage, ref, self._committed_key, self._pending, counters, raw)
                if bucket is None:
                    exhausted.append((ref.bucket_id, ref.bucket_key))
                    continue
                # A bucket recovered lazily (nothing loaded) waits in the queue as a placeholder.
                self._queue.push(bucket.head() if bucket.seg is not None else bucket.placeholder())
                self._buckets.append(bucket)
                self._by_id[bucket.bucket_id] = bucket
            journal = replay_journal(records, self._journal_cut, self._committed_key, self._seen, self._pending,
                                     self._tombstones, counters)
            self._journal_last = journal.journal_last
            self._mutable.restore(journal.items, journal.start, journal.end, self._clock)
            # Keep the tombstones of pending items and of items not added yet (cancelled early).
            unknown = self._tombstones.difference(self._seen)
            self._tombstones = self._tombstones.intersection(self._pending).union(unknown)
            since = self._clock()  # when each was made is not kept: a restart starts their time again
            self._unknown_since = {item: since for item in unknown.items()}
            for bid in orphans:
                pending_delete.setdefault(bid, "")
            for bid, key in exhausted:
                pending_delete.setdefault(bid, key)
            self._snapshots.pending_delete = pending_delete
            self._max_bucket_id = max([self._max_bucket_id] + orphans)
            self._recovered = True
            if exhausted or orphans:
                self._write_manifest_locked(self._buckets)
            report = RecoveryReport(
                buckets=len(self._buckets),
                pending=len(self._pending),
                mutable_items=self._mutable.pending,
                journal_records=journal.used,
                metadata_reads=counters.metadata,
                segment_reads=counters.segments,
                segments_loaded=counters.loaded,
                bytes_read=counters.bytes,
                exhausted_buckets=len(exhausted),
                orphans_deleted=len(orphans),
                committed_seq=self._committed_seq,
                duration_ms=(time.monotonic() - t0) * 1000,
            )
        return report

    # ------------------------------------------------------------------------- adding -------
    def add(self, messages: Sequence[DelayedMessage]) -> List[bool]:
        """Add messages; returns per message True (added) or False (its (ledger, entry) was
        added before, ever — duplicate, ignored — or cancelled before its add, dropped). Returns only when the added items are durable
        (journaled); the caller may ack the source messages then. May seal and merge.
        The index keeps the objects of items due soon and releases them as they are (the caller
        must not change a message after adding it)."""
        msgs = list(messages)
        for m in msgs:
            if type(m) is not DelayedMessage:
                if not isinstance(m, DelayedMessage):
                    raise TypeError(f"add() takes DelayedMessage objects, got {type(m).__name__}")
            m.validate()
        results = [False] * len(msgs)
        max_unacked = self.config.max_unacked_per_bucket
        min_index = self.config.delayed_delivery_min_index_count_per_bucket
        mutable = self._mutable
        with self._write_lock:
            self._check_usable()
            seen = self._seen.contains
            # A tombstone of a position never seen: its cancel came first, drop the add. With no
            # tombstones (the usual case; only cancel() adds one, and it waits for this lock) the
            # check per message is skipped.
            cancelled_early = self._tombstones.contains if len(self._tombstones) else None
            batch: List[Tuple[int, DelayedMessage]] = []
            batch_ids: Set[Tuple[int, int]] = set()
            max_ledger = mutable.end
            mutable_count = len(mutable)
            seal_failed = False  # after a failed seal, do not retry for every message of the call
            for i, m in enumerate(msgs):
                ident = (m.ledger_id, m.entry_id)
                if ident in batch_ids or seen(m.ledger_id, m.entry_id):
                    continue
                if cancelled_early is not None and cancelled_early(m.ledger_id, m.entry_id):
                    self._unknown_since.pop(ident, None)  # its message came: kept, it no longer expires
                    continue
                if (m.ledger_id > max_ledger and mutable_count + len(batch) >= min_index and not seal_failed
                        and self._pulsar_seal_due(m.ledger_id, max_ledger, mutable_count + len(batch))):
                    self._flush(batch, results)
                    batch, batch_ids = [], set()
                    seal_failed = not self._seal_locked("ledger boundary + delayedDeliveryMinIndexCountPerBucket")
                    mutable_count = len(mutable)
                    max_ledger = mutable.end
                batch.append((i, m))
                batch_ids.add(ident)
                if m.ledger_id > max_ledger:
                    max_ledger = m.ledger_id
                if mutable_count + len(batch) >= max_unacked and not seal_failed:
                    self._flush(batch, results)
                    batch, batch_ids = [], set()
                    seal_failed = not self._seal_locked("maxUnackedPerBucket")
                    mutable_count = len(mutable)
                    max_ledger = mutable.end
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
            by_ledger: Dict[int, List[int]] = {}
            msgs = [m for _, m in batch]
            ts = [release_ts(m.deliver_at, floor) for m in msgs]
            data, offsets = encode_batch(msgs, ts)
            for m in msgs:
                entries = by_ledger.get(m.ledger_id)
                if entries is None:
                    by_ledger[m.ledger_id] = [m.entry_id]
                else:
                    entries.append(m.entry_id)
            try:
                rid = self.storage.journal_append(data)
            except Exception as exc:
                raise self._fail("journal append", exc) from exc
            now = self._clock()
            lo, hi = min(by_ledger), max(by_ledger)
            with self._lock:
                recent = self._recent
                room = self.config.max_unacked_per_bucket - len(recent)
                if room > 0:
                    soon = now + RECENT_WINDOW_MS
                    for m, t in zip(msgs, ts):
                        if t <= soon:
                            recent[(m.ledger_id, m.entry_id)] = m
                            room -= 1
                            if room == 0:
                                break
                self._mutable.add_encoded(ts, [m.ledger_id for m in msgs], [m.entry_id for m in msgs], data, offsets,
                                          lo, hi, now)
                for ledger, entries in by_ledger.items():
                    self._pending.add_many(ledger, entries)
                    self._seen.add_many(ledger, entries)
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
        it (a redelivery, another partition) - is dropped when its add arrives; a tombstone whose
        message has not come is kept until expire_unknown_cancels drops it (one bit each).
        Cancelling a released item is reported."""
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
                if not seen:
                    self._unknown_since[(ledger_id, entry_id)] = self._clock()
            # DEBUG: the writer logs each cancel at INFO with the id exactly as its user gave it (the
            # index id cannot tell a batch's first message, 1:4:0, from one not batched, 1:4).
            logger.debug("event=delayed_message_cancelled id=%s before_add=%s", format_user_id(ledger_id, entry_id),
                         str(not seen).lower())
            return CancelResult.CANCELLED if seen else CancelResult.CANCELLED_BEFORE_ADD

    def expire_unknown_cancels(self, keep_ms: int) -> List[Tuple[int, int]]:
        """Drop the tombstones of positions never added that are older than `keep_ms` (a cancel of
        an unknown id, or one whose message never came): a message that arrives later is then
        indexed and delivered. The drop is made durable by the next manifest (a crash before it
        brings such a tombstone back from the journal, for another `keep_ms`). Returns what expired."""
        with self._write_lock:
            with self._lock:
                now = self._clock()
                due = [item for item, since in self._unknown_since.items() if now - since >= keep_ms]
                for item in due:
                    del self._unknown_since[item]
                    if not self._seen.contains(*item):
                        self._tombstones.discard(*item)
        for ledger_id, entry_id in due:
            logger.info("event=unknown_cancel_expired id=%s kept_ms=%d", format_user_id(ledger_id, entry_id), keep_ms)
        return due

    def unknown_cancels(self) -> int:
        """Tombstones of positions never added (kept until expire_unknown_cancels drops them)."""
        with self._lock:
            return len(self._unknown_since)

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
            oldest = self._mutable.oldest_ms
            if oldest is not None and now_ms - oldest >= self.config.max_seal_delay_millis:
                self._seal_locked("maxSealDelayMillis")
            self._maintain_locked()

    def _seal_locked(self, reason: str) -> bool:
        """Pulsar's MutableBucket.sealBucketAndAsyncPersistent: write the mutable bucket's items
        after the watermark as a new immutable bucket, then start an empty mutable bucket."""
        with self._lock:
            watermark = self._committed_key
            cut = self._journal_last
        if self._mutable.empty:
            return False
        # The rows and their bytes do not change while the write lock is held (pop_due only moves
        # the mutable bucket's release cursor), so they are read without the state lock.
        segments, start, end = self._mutable.segments_after(
            watermark, self.config.time_step_ms, self.config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
        count = sum(s.count for s in segments)
        bucket = None
        if segments:
            key = bucket_key(start, end)
            bid = self._snapshots.write(key, segments, snapshot_metadata_bytes(segments), "create")
            if bid is None:
                return False
            bucket = self._new_bucket(bid, key, start, end, segments)
            new_list = self._buckets + [bucket]
        else:
            new_list = list(self._buckets)
        self._write_manifest(new_list, journal_cut=cut)
        with self._lock:
            if bucket is not None:
                self._queue.install(bucket, segments, {}, self._last_key)
                self._buckets.append(bucket)
                self._by_id[bucket.bucket_id] = bucket
                self._snapshots.finished(bucket.bucket_id)
            if self._mutable.start >= 0:
                # Only the mutable bucket's ledgers gained ids since the last seal.
                self._pending.optimize(self._mutable.start, self._mutable.end)
                self._seen.optimize(self._mutable.start, self._mutable.end)
            self._mutable.clear()
            self._journal_cut = cut
        logger.info("sealed mutable bucket (%s): %d items -> bucket %s", reason, count,
                    bucket.bucket_id if bucket else "none (all committed)")
        try:
            self.storage.journal_truncate(cut)
        except Exception as exc:  # harmless: recovery skips records <= the manifest's cut
            logger.warning("journal truncate up to %d failed (will retry at next seal): %s", cut, exc)
        # The seal freed the mutable bucket's columns and its own encoding buffers; glibc keeps
        # freed pages inside the heap, so without this the RSS stays at the intake's high-water
        # mark (200,000 pending: 19 MB of growth, 11 MB after it). One call per seal.
        release_free_memory()
        return True

    def _new_bucket(self, bid: int, key: str, start: int, end: int, segments: Sequence[CutSegment]) -> ImmutableBucket:
        bucket = self._snapshots.new_bucket(bid, key, start, end, segments)
        self._max_bucket_id = max(self._max_bucket_id, bid)
        return bucket

    # ---------------------------------------------------------------------- manifest --------
    def _manifest_bytes(self, buckets: Sequence[ImmutableBucket], journal_cut: int) -> bytes:
        return manifest_bytes([b.ref() for b in buckets], seen=self._seen, tombstones=self._tombstones,
                              journal_cut=journal_cut, max_bucket_id=self._max_bucket_id,
                              pending_delete=self._snapshots.pending_delete)

    def _write_manifest(self, buckets: Sequence[ImmutableBucket], journal_cut: Optional[int] = None) -> None:
        with self._lock:
            data = self._manifest_bytes(buckets, self._journal_cut if journal_cut is None else journal_cut)
        self._put_manifest(data)

    def _write_manifest_locked(self, buckets: Sequence[ImmutableBucket]) -> None:
        self._put_manifest(self._manifest_bytes(buckets, self._journal_cut))

    def _put_manifest(self, data: bytes) -> None:
        try:
            self.storage.put_manifest(data)
        except Exception as exc:
            raise self._fail("manifest write", exc) from exc

    # -------------------------------------------------------------------- maintenance -------
    def _maintain_locked(self) -> None:
        self._drop_exhausted()
        guard = len(self._buckets) + 1
        merged = False
        while guard > 0 and self._merge_once():
            guard -= 1
            merged = True
        self._snapshots.hand_off_obsolete()
        if merged:
            # A merge reads and cuts whole buckets: like a seal's, its freed buffers would keep
            # the RSS at their high-water mark.
            release_free_memory()

    def _drop_exhausted(self) -> None:
        with self._lock:
            w = self._committed_key
            gone = [b for b in self._buckets if b.drained and w is not None
                    and b.last_key is not None and b.last_key <= w]
            if not gone:
                return
            keep = [b for b in self._buckets if b not in gone]
        for b in gone:
            self._snapshots.pending_delete[b.bucket_id] = b.key
        self._write_manifest(keep)
        with self._lock:
            self._buckets = keep
            for b in gone:
                self._by_id.pop(b.bucket_id, None)
        logger.info("buckets exhausted: %s", ", ".join(str(b.bucket_id) for b in gone))

    # ------------------------------------------------------------------------ merging -------
    def _merge_once(self) -> bool:
        with self._lock:
            sel = merge_window(self._buckets, self.config.delayed_delivery_max_num_buckets)
            w = self._committed_key
        if sel is None:
            return False
        start, width = sel
        sources = self._buckets[start:start + width]
        t0 = time.monotonic()
        merged = write_merged(self._snapshots, self.config, sources, w, self._last_released)
        if merged is None:
            self._metrics.record("merge", False, (time.monotonic() - t0) * 1000)
            return False
        bucket = merged.bucket
        self._max_bucket_id = max(self._max_bucket_id, bucket.bucket_id)
        new_list = self._buckets[:start] + [bucket] + self._buckets[start + width:]
        for s in sources:
            self._snapshots.pending_delete[s.bucket_id] = s.key
        self._write_manifest(new_list)
        with self._lock:
            self._queue.install(bucket, merged.segments, merged.cached, self._last_key)
            self._buckets = new_list
            self._by_id[bucket.bucket_id] = bucket
            for s in sources:
                self._by_id.pop(s.bucket_id, None)
            self._queue.remove_buckets({s.bucket_id for s in sources})
            self._snapshots.finished(bucket.bucket_id)
        self._metrics.record("merge", True, (time.monotonic() - t0) * 1000)
        logger.info("merged buckets %s into bucket %d (%s, %d items)",
                    ", ".join(str(s.bucket_id) for s in sources), bucket.bucket_id, bucket.key, bucket.index_count)
        return True

    def _last_released(self) -> Optional[ReleaseKey]:
        with self._lock:
            return self._last_key

    # ---------------------------------------------------------------------- releasing -------
    def next_release_time(self) -> Optional[int]:
        """Release-key timestamp (ms) of the next item, or None when nothing is pending in
        memory. pop_due(now_ms) with now_ms >= it releases at least that item."""
        with self._lock:
            return self._head_ts()

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
        a = self._mutable.head_ts()
        b = self._queue.head_ts()
        if a is None:
            return b
        return a if b is None or a < b else b

    def _pop_locked(self, cap: int, max_items: int) -> List[Release]:
        """The k-way merge of the mutable bucket and the shared queue, numbered."""
        out: List[Release] = []
        mutable, queue, recent = self._mutable, self._queue, self._recent
        # Tombstones only change under the state lock, which the caller holds: with none, no item
        # of this round is cancelled (the check is skipped, once per released message otherwise).
        tombstones = self._tombstones if len(self._tombstones) else None
        while len(out) < max_items:
            mh = mutable.head()
            ih = queue.head()
            if ih is not None and (mh is None or ih[:3] < mh[:3]):
                if ih[0] > cap:
                    break
                bucket = self._by_id[ih[3]]
                if bucket.seg is None:
                    if not queue.load_current(bucket, self._last_key):
                        break  # keep order: nothing may pass a segment we cannot read
                    continue
                ts, ledger, entry = ih[0], ih[1], ih[2]
                msg = recent.pop((ledger, entry), None) if recent else None
                if msg is None:
                    msg = bucket.head_message()
                queue.advance(bucket, self._last_key)
            elif mh is not None:
                if mh[0] > cap:
                    break
                item = mutable.pop()
                msg = recent.pop((item[1], item[2]), None) if recent else None
                if msg is None:
                    (ts, ledger, entry), msg = decode_framed(item[3])
                else:
                    ts, ledger, entry = item[0], item[1], item[2]
            else:
                break
            self._seq += 1
            cancelled = tombstones is not None and tombstones.contains(ledger, entry)
            self._pending.discard(ledger, entry)
            self._released.append((self._seq, ts, ledger, entry, cancelled))
            self._last_key = (ts, ledger, entry)
            if ts > self._ts_floor:
                self._ts_floor = ts
            out.append(Release(self._seq, msg, cancelled, ts))
        return out

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

    def last_added_entry(self) -> Optional[Tuple[int, int]]:
        """(ledger, entry id) of the furthest entry of the topic with an item ever added (by its
        first item: see LedgerBitmaps.last_entry), or None when nothing was added."""
        with self._lock:
            return self._seen.last_entry()

    def pending_count(self) -> int:
        """Items added and not yet released (cancelled ones included)."""
        with self._lock:
            return len(self._pending)

    def is_bucket_in_use(self, bucket_id: int) -> bool:
        """Snapshot-manifest oracle for two-phase deletion: True while the bucket snapshot is
        part of the index (or being written); False once it was handed to the deleter."""
        with self._lock:
            return bucket_id in self._by_id or bucket_id in self._snapshots.writing

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
            loaded = self._mutable.pending + sum(b.loaded for b in self._buckets)
            return BucketStats(
                bucket_total=len(self._buckets) + 1,
                immutable_buckets=len(self._buckets),
                loaded=loaded,
                snapshot_size_bytes=sum(b.snapshot_length for b in self._buckets),
                pending=len(self._pending),
                mutable_items=len(self._mutable),
                released_uncommitted=len(self._released),
                last_seq=self._seq,
                committed_seq=self._committed_seq,
                op_count=counts,
                op_latency_ms=latency,
                op_latency_sum_ms=latency_sum,
            )
