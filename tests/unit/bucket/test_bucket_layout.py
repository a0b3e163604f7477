"""Snapshot ids mean what Pulsar means (index-id layout 2), and layout-1 stores still recover.

Layout 1 wrote `entry << 10 | batchIndex` into DelayedIndex.entry_id and the segment bitmaps;
layout 2 writes real entry ids there (Pulsar's containsMessage(ledgerId, entryId) is right on
them) and keeps the batch index in extension field 107, one bit per message in extension map 100.
tests/fixtures/bucket_store_layout1 was written by the layout-1 code (see the generator there),
tests/fixtures/bucket_store_layout2 by the same generator with the layout-2 code (manifest
format 1: index ids in the seen-set and in extension map 100); layout 3 (now) writes packed ids
(extension map 101, manifest format 2).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, List

import pytest
from pyroaring import BitMap

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, DirectorySnapshotStorage
from pulsar_lifecycle.bucket.bitmap import deserialize_bitmap
from pulsar_lifecycle.bucket.codec import SnapshotMetadata, parse_segment
from pulsar_lifecycle.bucket.records import index_id, split_index_id
from support.paths import TESTS

FIXTURES = TESTS / "fixtures"
FIXTURE = FIXTURES / "bucket_store_layout1"
OLD_STORES = [pytest.param(FIXTURES / "bucket_store_layout1", id="layout1"),
              pytest.param(FIXTURES / "bucket_store_layout2", id="layout2")]
T0 = 1_700_000_000_000


def _copy_fixture(tmp_path: Path, fixture: Path = FIXTURE) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(fixture / "store", dst)
    return dst


def _release_rows(ix: BucketIndex) -> List[list]:
    return [[r.seq, r.message.ledger_id, r.message.entry_id, r.message.deliver_at, r.release_ts,
             r.message.payload.decode(), r.cancelled, r.message.properties]
            for r in ix.pop_due(T0 + 10_000_000, 100_000)]


def _snapshot_indexes(store: DirectorySnapshotStorage) -> Dict[int, tuple]:
    """bucket id -> (metadata, [decoded segments])."""
    out = {}
    for bid in store.list_snapshots(0):
        meta = SnapshotMetadata.FromString(store.get_metadata(bid))
        segs = [parse_segment(d) for d in store.get_segments(bid, 1, len(meta.metadata_list))]
        out[bid] = (meta, segs)
    return out


@pytest.mark.parametrize("fixture", OLD_STORES)
def test_old_layout_store_recovers_every_pending_message(tmp_path: Path, fixture: Path):
    expected = json.loads((fixture / "expected.json").read_text())
    root = _copy_fixture(tmp_path, fixture)
    store = DirectorySnapshotStorage(root)
    if fixture.name.endswith("1"):
        assert any(not idx.HasField("batch_index") for _, segs in _snapshot_indexes(store).values()
                   for s in segs for idx in s.indexes), "fixture must hold layout-1 indexes"
    else:
        assert all(len(m.index_id_bit_map) and not len(m.packed_index_bit_map)
                   for meta, _ in _snapshot_indexes(store).values() for m in meta.metadata_list)
    ix = BucketIndex(store, BucketConfig(), clock=lambda: T0)
    report = ix.recover()
    assert {"pending": report.pending, "committed_seq": report.committed_seq} == expected[0]
    rows = _release_rows(ix)
    assert rows == expected[1:]
    assert len(rows) == expected[0]["pending"] + 0  # nothing lost, nothing extra
    store.close()


@pytest.mark.parametrize("fixture", OLD_STORES)
def test_old_layout_store_is_migrated_by_seal_and_merge_without_loss(tmp_path: Path, fixture: Path):
    expected = json.loads((fixture / "expected.json").read_text())
    root = _copy_fixture(tmp_path, fixture)
    store = DirectorySnapshotStorage(root)
    ix = BucketIndex(store, BucketConfig(delayed_delivery_max_num_buckets=1), clock=lambda: T0)
    ix.recover()
    assert ix.seal()  # the journal (written in the old layout) becomes a layout-3 snapshot; merges follow
    snaps = _snapshot_indexes(store)
    assert len(ix.bucket_ids()) == 1
    for bid in ix.bucket_ids():
        meta, segs = snaps[bid]
        assert all(len(m.packed_index_bit_map) for m in meta.metadata_list)
        assert all(idx.HasField("batch_index") for s in segs for idx in s.indexes)
    store.close()
    store = DirectorySnapshotStorage(root)
    again = BucketIndex(store, BucketConfig(), clock=lambda: T0)
    report = again.recover()
    assert report.pending == expected[0]["pending"]
    assert _release_rows(again) == expected[1:]
    store.close()


def test_snapshot_bitmaps_answer_pulsars_contains_message(tmp_path: Path):
    """Pulsar's ImmutableBucket ORs the segments' delayed_index_bit_map per ledger and answers
    containsMessage(ledgerId, entryId) from it; DelayedIndex.entry_id is what it dispatches."""
    store = DirectorySnapshotStorage(tmp_path / "s")
    ix = BucketIndex(store, BucketConfig(delayed_delivery_max_indexes_per_bucket_snapshot_segment=50,
                                         delayed_delivery_max_num_buckets=-1), clock=lambda: T0)
    ix.recover()
    msgs, positions = [], set()
    n = 0
    for ledger in (7, 8):
        for entry in range(0, 400, 2):  # odd entries hold no delayed message
            batch = 10 if entry % 4 == 0 else -1  # batched entries and single messages
            for b in range(max(batch, 1)):
                bi = b if batch > 0 else -1
                n += 1
                msgs.append(DelayedMessage(ledger, index_id(entry, bi), -1, T0 + (n * 37) % 5000, b"p"))
                positions.add((ledger, entry, max(bi, 0)))
    assert all(ix.add(msgs))
    assert ix.seal()
    (bid,) = ix.bucket_ids()
    meta, segs = _snapshot_indexes(store)[bid]
    pulsar_bitmap: Dict[int, BitMap] = {}
    ours = set()
    for m, seg in zip(meta.metadata_list, segs):
        for ledger, raw in m.delayed_index_bit_map.items():
            pulsar_bitmap.setdefault(ledger, BitMap()).update(deserialize_bitmap(raw))
        per_segment = {(i.ledger_id, i.entry_id) for i in seg.indexes}
        assert per_segment == {(l, e) for l, raw in m.delayed_index_bit_map.items()
                               for e in deserialize_bitmap(raw)}
        for i in seg.indexes:
            ours.add((i.ledger_id, i.entry_id, i.batch_index))
    assert ours == positions  # real entry ids + batch index, every message once
    for ledger in (7, 8):
        for entry in range(400):
            assert (entry in pulsar_bitmap[ledger]) == (entry % 2 == 0), (ledger, entry)
    # one bit per message survives in the extension map, which recovery reads
    again = BucketIndex(DirectorySnapshotStorage(tmp_path / "s"), BucketConfig(), clock=lambda: T0)
    assert again.recover().pending == len(msgs)
    for m in msgs[:50]:
        assert again.contains(m.ledger_id, m.entry_id)
    assert not again.contains(7, index_id(0, 11))
    assert split_index_id(msgs[1].entry_id) == (0, 1)
