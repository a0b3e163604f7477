"""Group commit of the directory store's journal: nothing is acked before its group is durable.

A power loss keeps of the journal only what an fdatasync covered: the bytes written before an
fdatasync that returned. These tests record, for every fdatasync of journal.log, the file size
when it began, and at every ack (journal_append returned; BucketIndex.add returned True) the
durable size so far. An acked record that ends past the durable size at its ack would be lost by
a power loss at that instant. Then the loss itself: the journal is cut to the durable size and
recovered, and every acked message must be pending.

An ordering that acks before the group's fdatasync (journal_append returning before
`_wait_durable`, or a leader marking its target durable before its fdatasync returned) fails
both tests (run locally with the break; see docs/architecture.md, "Group commit").
"""
from __future__ import annotations

import os
import random
import shutil
import threading
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, DirectorySnapshotStorage
from pulsar_lifecycle.bucket.storage.directory import _JNL_HEADER, _REC


class DurableSizes:
    """Wraps os.fdatasync and os.fsync: the largest journal size an fdatasync/fsync that returned
    covered (what a power loss keeps)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, journal: Path) -> None:
        self.journal = str(journal)
        self.lock = threading.Lock()
        self.durable = 0
        self.syncs = 0
        for name in ("fdatasync", "fsync"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(real))

    def _wrap(self, real):
        def sync(fd: int) -> None:
            try:
                is_journal = os.readlink(f"/proc/self/fd/{fd}") == self.journal
                size = os.fstat(fd).st_size
            except OSError:
                is_journal, size = False, 0
            real(fd)
            if is_journal:
                with self.lock:
                    self.syncs += 1
                    self.durable = size  # an fsync after a cut-back may lower it
        return sync

    def now(self) -> int:
        with self.lock:
            return self.durable


def record_ends(journal: Path) -> Dict[int, int]:
    """record id -> the offset its record ends at."""
    data = journal.read_bytes()
    pos, ends = _JNL_HEADER.size, {}
    while pos + _REC.size <= len(data):
        length, _crc, rid = _REC.unpack_from(data, pos)
        pos += _REC.size + length
        if pos > len(data):
            break
        ends[rid] = pos
    return ends


def test_concurrent_appends_share_fdatasyncs_and_none_returns_before_its_group_is_durable(tmp_path, monkeypatch):
    root = tmp_path / "snap"
    store = DirectorySnapshotStorage(root)
    store.journal_read()
    sizes = DurableSizes(monkeypatch, root / "journal.log")
    acks: List[Tuple[int, int]] = []  # (record id, durable size when it was acked)
    acks_lock = threading.Lock()

    def appender(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(60):
            rid = store.journal_append(os.urandom(rnd.randint(10, 4000)))
            durable = sizes.now()
            with acks_lock:
                acks.append((rid, durable))

    threads = [threading.Thread(target=appender, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ends = record_ends(root / "journal.log")
    early = [(rid, ends[rid], durable) for rid, durable in acks if ends[rid] > durable]
    assert not early, f"acked before durable (record, its end, durable size at the ack): {early[:5]}"
    assert len(acks) == 360 == len(ends)
    assert store.journal_fdatasyncs < len(acks)  # grouped: concurrent appends shared fdatasyncs
    store.close()


def test_power_loss_after_acked_batches_loses_none_of_them(tmp_path, monkeypatch):
    root = tmp_path / "snap"
    cfg = BucketConfig(max_unacked_per_bucket=100_000)
    ix = BucketIndex(DirectorySnapshotStorage(root), cfg)
    ix.recover()
    sizes = DurableSizes(monkeypatch, root / "journal.log")
    rnd = random.Random(7)
    acked: List[Tuple[int, int]] = []
    cut = None
    for b in range(40):
        batch = [DelayedMessage(1, b * 100 + j, 0, 10**13 + rnd.randint(0, 10**6), b"x" * 50)
                 for j in range(rnd.randint(1, 60))]
        assert all(ix.add(batch))
        # Acked: the source acks now. A power loss from here on keeps the journal up to the
        # durable size, which must hold every acked batch.
        acked.extend((m.ledger_id, m.entry_id) for m in batch)
        size = (root / "journal.log").stat().st_size
        assert sizes.now() >= size, f"batch {b} acked with {size - sizes.now()} journal bytes not yet durable"
        if b == 25:
            cut = (list(acked), sizes.now())
    assert cut is not None
    # The power loss at the ack of batch 25: the journal keeps what was durable then.
    lost = tmp_path / "after-power-loss"
    shutil.copytree(root, lost)
    with open(lost / "journal.log", "r+b") as fh:
        fh.truncate(cut[1])
    survivor = BucketIndex(DirectorySnapshotStorage(lost), cfg)
    survivor.recover()
    missing = [ident for ident in cut[0] if not survivor.contains(*ident)]
    assert not missing, f"{len(missing)} acked messages lost by a power loss: {missing[:5]}"
