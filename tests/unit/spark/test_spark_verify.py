"""`spark verify` finds every kind of damage (local[2], one seeded store copied per case)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, List, Tuple

import pytest
from click.testing import CliRunner

from pulsar_lifecycle.bucket import BucketConfig, DirectorySnapshotStorage
from pulsar_lifecycle.bucket.codec import Manifest, ReleaseCursor, SnapshotMetadata, parse_segment, segment_items
from pulsar_lifecycle.bucket.segments import cut_segments, snapshot_metadata
from pulsar_lifecycle.bucket.storage import write_whole
from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.spark.backlog import ClassifyOptions
from pulsar_lifecycle.spark.progress import JobProgress
from pulsar_lifecycle.spark.seed.driver import run_seed
from pulsar_lifecycle.spark.verify import executor_checks as checks
from pulsar_lifecycle.spark.verify.driver import run_verify
from support.spark_fixtures import backlog_rows, write_backlog

pytestmark = pytest.mark.spark
BASE = 1_800_000_000_000
CONFIG = BucketConfig(
    delayed_delivery_min_index_count_per_bucket=100,
    delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds=60,
    delayed_delivery_max_indexes_per_bucket_snapshot_segment=25,
    delayed_delivery_max_num_buckets=8,
)
OPTS = ClassifyOptions(now_ms=BASE, max_delay_ms=400 * 86400 * 1000, allowed_target_prefixes=())
USER_CONFIG = json.dumps({"delayedDeliveryMinIndexCountPerBucket": 100,
                          "delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds": 60,
                          "delayedDeliveryMaxIndexesPerBucketSnapshotSegment": 25,
                          "delayedDeliveryMaxNumBuckets": 8})
QUIET = JobProgress(None, "t", enabled=False)


@pytest.fixture(scope="module")
def seeded(spark, tmp_path_factory) -> Tuple[Path, List[str]]:
    root = tmp_path_factory.mktemp("verify")
    rows = backlog_rows({l: 60 + 7 * (l % 5) for l in range(500, 512)}, BASE, 20 * 60_000, seed=3)
    inputs = write_backlog(root / "backlog", rows, per_file=300)
    report = run_seed(spark, inputs, str(root / "store"), CONFIG, OPTS, progress=QUIET)
    assert report.buckets >= 3 and report.segments > report.buckets
    return root / "store", inputs


def _copy(seeded: Tuple[Path, List[str]], tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(seeded[0], dst)
    return dst


def _rewrite(path: Path, bid: int, fn: Callable[[SnapshotMetadata, List[bytes]], Tuple[SnapshotMetadata, List[bytes]]]) -> None:
    st = DirectorySnapshotStorage(path)
    meta = SnapshotMetadata.FromString(st.get_metadata(bid))
    segs = st.get_segments(bid, 1, len(meta.metadata_list))
    meta, segs = fn(meta, segs)
    info = st.snapshot_info(bid)
    st.delete(bid)
    write_whole(st, meta.SerializeToString(), segs, info["bucket_key"], info["topic"], info["cursor"], bucket_id=bid)


def _verify(spark, path: Path, against=None):
    return run_verify(spark, str(path), CONFIG, against=against, opts=OPTS, progress=QUIET)


def test_a_seeded_store_verifies_clean_against_its_export(spark, seeded, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["spark", "verify", "--store", str(seeded[0]), "--against", str(seeded[0].parent / "backlog"),
                                       "--user-config", USER_CONFIG, "--quiet", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["ok"] and report["against"]["missing"] == 0 and report["against"]["store_kind"] == "seeded"
    assert report["against"]["found"] == report["against"]["expected"] == report["items"]
    assert report["against"]["not_in_export"] == 0 and report["against"]["duplicates"] == 0
    assert (tmp_path / "out" / "buckets.png").read_bytes()[:4] == b"\x89PNG"
    assert "OK: no violations" in (tmp_path / "out" / "summary.txt").read_text()


def test_indexed_but_not_exported_is_a_violation_for_a_seeded_or_frozen_store(spark, seeded, tmp_path: Path) -> None:
    # Only two of the export files: the others' messages are "indexed but not in the export".
    result = CliRunner().invoke(main, ["spark", "verify", "--store", str(seeded[0]), "--against", seeded[1][0],
                                       "--against", seeded[1][1], "--user-config", USER_CONFIG, "--quiet",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    extra = report["items"] - 600
    assert report["against"]["found"] == 600 and report["against"]["not_in_export"] == extra > 0
    assert report["violations"] == {checks.NOT_IN_EXPORT: extra} and report["against"]["store_kind"] == "seeded"
    assert f"VIOLATIONS: not_in_export {extra}" in result.output
    # A live writer's store (it released something: a watermark) also holds messages published
    # after the export: the same count is a warning there, unless the store is declared frozen.
    live = _copy(seeded, tmp_path)
    DirectorySnapshotStorage(live).put_cursor(ReleaseCursor(has_watermark=True, ts=BASE - 1, ledger_id=1, entry_id=0,
                                                            seq=7).SerializeToString())
    warned = _verify(spark, live, against=seeded[1][:2])
    assert warned.ok and warned.against["store_kind"] == "live" and warned.against["not_in_export"] == extra
    assert any(w.startswith(f"{extra} indexed messages are not in the export") for w in warned.warnings)
    frozen = run_verify(spark, str(live), CONFIG, against=seeded[1][:2], opts=OPTS, progress=QUIET, frozen=True)
    assert frozen.violations == {checks.NOT_IN_EXPORT: extra} and frozen.against["store_kind"] == "frozen"


def test_corrupt_bitmap_is_found(spark, seeded, tmp_path: Path) -> None:
    path = _copy(seeded, tmp_path)

    def corrupt(meta, segs):
        bitmaps = meta.metadata_list[1].delayed_index_bit_map
        ledger = sorted(bitmaps)[0]
        from pulsar_lifecycle.bucket.bitmap import deserialize_bitmap, serialize_bitmap

        bm = deserialize_bitmap(bitmaps[ledger])
        bm.add(4_000_000)
        bitmaps[ledger] = serialize_bitmap(bm)
        return meta, segs

    _rewrite(path, 2, corrupt)
    report = _verify(spark, path)
    assert not report.ok and report.violations.get(checks.BITMAP) == 1
    assert any(e["kind"] == checks.BITMAP and e["bucket_id"] == 2 for e in report.examples)


def test_a_whole_bucket_extension_that_disagrees_with_the_segments_is_found(spark, seeded, tmp_path: Path) -> None:
    path = _copy(seeded, tmp_path)
    st = DirectorySnapshotStorage(path)
    assert len(SnapshotMetadata.FromString(st.get_metadata(2)).segment_count) > 0  # the seeder writes it

    def miscount(meta, segs):
        meta.segment_count[0] += 1
        return meta, segs

    def extra_id(meta, segs):
        from pulsar_lifecycle.bucket.bitmap import deserialize_bitmap, serialize_bitmap

        ledger = sorted(meta.packed_index_bit_map)[0]
        bm = deserialize_bitmap(meta.packed_index_bit_map[ledger])
        bm.add(4_000_000)
        meta.packed_index_bit_map[ledger] = serialize_bitmap(bm)
        return meta, segs

    _rewrite(path, 1, miscount)
    _rewrite(path, 2, extra_id)
    report = _verify(spark, path)
    assert not report.ok and report.violations.get(checks.BITMAP) == 2
    found = {e["bucket_id"]: e["detail"] for e in report.examples if e["kind"] == checks.BITMAP}
    assert "segment_count" in found[1] and "packed_index_bit_map" in found[2]


def test_swapped_segments_are_found(spark, seeded, tmp_path: Path) -> None:
    path = _copy(seeded, tmp_path)

    def swap(meta, segs):
        m = list(meta.metadata_list)
        new = SnapshotMetadata(metadata_list=[m[1], m[0]] + m[2:])
        return new, [segs[1], segs[0]] + segs[2:]

    _rewrite(path, 1, swap)
    report = _verify(spark, path)
    assert report.violations.get(checks.ORDER, 0) >= 1 and not report.ok


def test_overlapping_buckets_are_found(spark, seeded, tmp_path: Path) -> None:
    path = _copy(seeded, tmp_path)
    st = DirectorySnapshotStorage(path)
    man = Manifest.FromString(st.get_manifest())
    man.buckets[1].start_ledger_id = man.buckets[0].end_ledger_id  # now both claim that ledger
    st.put_manifest(man.SerializeToString())
    report = _verify(spark, path)
    assert report.violations.get(checks.OVERLAP) == 1
    assert any(e["kind"] == checks.OVERLAP for e in report.examples)


def test_a_dropped_message_is_found_against_the_export(spark, seeded, tmp_path: Path) -> None:
    path = _copy(seeded, tmp_path)
    st = DirectorySnapshotStorage(path)
    dropped = []

    def drop(meta, segs):
        items = [it for data in segs for it in segment_items(parse_segment(data))]
        dropped.append(items.pop(len(items) // 2))
        cut = cut_segments(items, CONFIG.time_step_ms, CONFIG.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
        return snapshot_metadata(cut), [s.data for s in cut]

    _rewrite(path, 3, drop)
    man = Manifest.FromString(st.get_manifest())  # keep the manifest consistent: only the export can tell
    ref = next(b for b in man.buckets if b.bucket_id == 3)
    ref.index_count -= 1
    ref.snapshot_length = st.get_length(3)
    st.put_manifest(man.SerializeToString())
    assert _verify(spark, path).ok  # internally consistent
    report = _verify(spark, path, against=seeded[1])
    assert report.violations == {checks.MISSING: 1}
    ts, ledger, entry, _ = dropped[0]
    assert f"{ledger}:{entry}" in report.examples[0]["detail"]


def test_overlap_helper() -> None:
    assert checks.overlapping([(1, 0, 5), (2, 6, 9), (3, 9, 12)]) == [(2, 3)]
    assert checks.overlapping([(1, 0, 5), (2, 1, 2), (3, 3, 4)]) == [(1, 2), (1, 3)]
    assert checks.overlapping([(1, 0, 5), (2, 6, 9)]) == []
