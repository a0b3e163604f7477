"""Property test: the bucket engine against a simple reference model.

Random adds (with duplicates), cancels, seals, merges (small MaxNumBuckets), time advances,
releases, commits and restarts (the engine object is dropped and a new one recovered from the
same storage — every call's effects are durable when it returns, so this is a crash). Checked:
* every release is at or after its time (release_ts <= now, deliver_at <= release_ts);
* seqs are consecutive; a seq released again after a restart carries the identical item and key;
* after dedup by seq the stream is in strictly increasing release-key order and no item appears
  under two seqs;
* cancel results follow the model, and an item is flagged cancelled exactly when a cancel
  returned CANCELLED before its release; a cancel that comes before its item's add
  (CANCELLED_BEFORE_ADD) makes that add a no-op: the item is never released;
* nothing due is left behind by pop_due, and in the end every added item is released.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pulsar_lifecycle.bucket import (
    BucketConfig,
    BucketIndex,
    CancelResult,
    DelayedMessage,
    DirectorySnapshotStorage,
    MemorySnapshotStorage,
)

Ident = Tuple[int, int]
Key = Tuple[int, int, int]

CONFIG = BucketConfig(
    delayed_delivery_min_index_count_per_bucket=6,
    delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds=1,
    delayed_delivery_max_indexes_per_bucket_snapshot_segment=3,
    delayed_delivery_max_num_buckets=3,
    max_unacked_per_bucket=5,
    max_seal_delay_millis=800,
)


class BucketMachine(RuleBasedStateMachine):
    """Engine vs model."""

    use_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.tmp: Optional[str] = None
        if self.use_directory:
            self.tmp = tempfile.mkdtemp(prefix="bucket-prop-")
            self.storage = DirectorySnapshotStorage(Path(self.tmp))
        else:
            self.storage = MemorySnapshotStorage()
        self.now = 1_000_000
        self.ix = self._open()
        self.next_entry: Dict[int, int] = {1: 0, 2: 0, 3: 0}
        self.added: Dict[Ident, int] = {}  # ident -> deliver_at
        self.cancelled_ok: Set[Ident] = set()
        self.cancelled_early: Set[Ident] = set()  # cancelled before their add
        self.by_seq: Dict[int, Tuple[Key, Ident, bool]] = {}  # first release of each seq
        self.seq_of: Dict[Ident, int] = {}
        self.last_seq = 0
        self.committed = 0
        self.last_key: Optional[Key] = None  # last key released by the current engine object

    def _open(self) -> BucketIndex:
        ix = BucketIndex(self.storage, CONFIG, clock=lambda: self.now)
        ix.recover()
        return ix

    def teardown(self) -> None:
        try:
            # Drain everything: every item ever added is released exactly once (after dedup).
            for _ in range(10_000):
                if not self._pop(10**13, 1000):
                    break
            assert self.ix.pending_count() == 0
            assert set(self.seq_of) == set(self.added), "some added items were never released"
            assert sorted(self.by_seq) == list(range(1, len(self.added) + 1))
        finally:
            if self.tmp:
                self.storage.close()
                shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers --------------------------------------------------------------------------------
    def _released_view(self) -> Set[Ident]:
        return {ident for s, (_, ident, _) in self.by_seq.items() if s <= self.last_seq}

    def _pop(self, now: int, max_items: int) -> List:
        got = self.ix.pop_due(now, max_items)
        for r in got:
            m = r.message
            ident = (m.ledger_id, m.entry_id)
            key = r.key
            assert r.release_ts <= now, f"released early: {key} at {now}"
            assert m.deliver_at <= r.release_ts
            assert m.deliver_at == self.added[ident]
            assert r.seq == self.last_seq + 1, f"seq gap: {r.seq} after {self.last_seq}"
            if self.last_key is not None:
                assert key > self.last_key, f"out of order: {key} after {self.last_key}"
            assert r.cancelled == (ident in self.cancelled_ok), f"cancel flag of {ident}"
            if r.seq in self.by_seq:
                assert self.by_seq[r.seq][:2] == (key, ident), f"seq {r.seq} re-derived differently"
            else:
                assert ident not in self.seq_of, f"{ident} released under two seqs"
                self.by_seq[r.seq] = (key, ident, r.cancelled)
                self.seq_of[ident] = r.seq
            self.last_seq = r.seq
            self.last_key = key
        if len(got) < max_items:
            nxt = self.ix.next_release_time()
            assert nxt is None or nxt > now, f"item due at {nxt} left behind at {now}"
        return got

    # -- rules ----------------------------------------------------------------------------------
    @rule(specs=st.lists(st.tuples(st.integers(1, 3), st.integers(-300, 4000)), min_size=1, max_size=8),
          dup_picks=st.lists(st.integers(0, 10**6), max_size=3))
    def add(self, specs, dup_picks) -> None:
        msgs, expect, batch = [], [], set()
        for ledger, delay in specs:
            entry = self.next_entry[ledger]
            self.next_entry[ledger] += 1
            msgs.append(DelayedMessage(ledger, entry, ledger - 1, self.now + delay, b"p%d" % entry,
                                       properties={"e": str(entry)}))
            expect.append((ledger, entry) not in self.cancelled_early)
            batch.add((ledger, entry))
        known = sorted(self.added)
        for pick in dup_picks:
            if known:
                ledger, entry = known[pick % len(known)]
                msgs.append(DelayedMessage(ledger, entry, 0, self.now, b"dup"))
                expect.append(False)
        if msgs[0].ledger_id in (1, 2, 3) and specs:
            # duplicate within the same call
            msgs.append(DelayedMessage(msgs[0].ledger_id, msgs[0].entry_id, 0, self.now, b"dup"))
            expect.append(False)
        assert self.ix.add(msgs) == expect
        for m, ok in zip(msgs, expect):
            if ok:
                self.added[(m.ledger_id, m.entry_id)] = m.deliver_at

    @rule(pick=st.integers(0, 10**6), unknown=st.booleans())
    def cancel(self, pick, unknown) -> None:
        if unknown or not self.added:
            # Not added yet: an entry a few ahead on a ledger the adds use, or one they never use.
            ledger = 1 + pick % 4
            ident = (ledger, self.next_entry.get(ledger, 0) + pick % 3) if ledger <= 3 else (9, pick % 1000)
            expected = (CancelResult.ALREADY_CANCELLED if ident in self.cancelled_early
                        else CancelResult.CANCELLED_BEFORE_ADD)
            assert self.ix.cancel(*ident) == expected
            self.cancelled_early.add(ident)
            return
        known = sorted(self.added)
        ident = known[pick % len(known)]
        pending = ident not in self._released_view()
        if not pending:
            expected = CancelResult.ALREADY_RELEASED
        elif ident in self.cancelled_ok:
            expected = CancelResult.ALREADY_CANCELLED
        else:
            expected = CancelResult.CANCELLED
        assert self.ix.cancel(*ident) == expected
        if expected == CancelResult.CANCELLED:
            self.cancelled_ok.add(ident)

    @rule(ms=st.integers(0, 1500))
    def advance(self, ms) -> None:
        self.now += ms

    @rule(max_items=st.integers(1, 20))
    def pop(self, max_items) -> None:
        self._pop(self.now, max_items)

    @precondition(lambda self: self.last_seq > self.committed)
    @rule(data=st.data())
    def commit(self, data) -> None:
        seq = data.draw(st.integers(self.committed + 1, self.last_seq))
        self.ix.commit(seq)
        self.committed = seq

    @rule()
    def seal(self) -> None:
        self.ix.seal()

    @rule()
    def maybe_seal(self) -> None:
        self.ix.maybe_seal(self.now)

    @rule()
    def restart(self) -> None:
        self.ix = self._open()
        self.last_seq = self.committed
        self.last_key = self.by_seq[self.committed][0] if self.committed else None

    @invariant()
    def pending_matches_model(self) -> None:
        assert self.ix.pending_count() == len(self.added) - len(self._released_view())
        assert self.ix.stats().immutable_buckets <= CONFIG.delayed_delivery_max_num_buckets


class DirectoryBucketMachine(BucketMachine):
    use_directory = True


TestBucketProperty = BucketMachine.TestCase
TestBucketProperty.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TestBucketPropertyDirectory = DirectoryBucketMachine.TestCase
TestBucketPropertyDirectory.settings = settings(
    max_examples=15, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
