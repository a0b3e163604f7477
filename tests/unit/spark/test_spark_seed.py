"""`spark seed`: the seeder writes what the engine writes, by the engine's rules (local[2])."""
from __future__ import annotations

from pathlib import Path

import pytest

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DirectorySnapshotStorage
from pulsar_lifecycle.bucket.codec import Manifest, SnapshotMetadata
from pulsar_lifecycle.bucket.records import DelayedMessage
from pulsar_lifecycle.bucket.sealing import plan_ledger_buckets
from pulsar_lifecycle.bucket.storage import write_whole
from pulsar_lifecycle.scheduler.intake import Cancel
from pulsar_lifecycle.scheduling_protocol import CANCEL_PROP, DELIVER_AT_PROP
from pulsar_lifecycle.spark.backlog import ClassifyOptions, as_properties, classify_row, external_position
from pulsar_lifecycle.spark.errors import SparkJobError
from pulsar_lifecycle.spark.progress import JobProgress
from pulsar_lifecycle.spark.seed import driver as seed
from pulsar_lifecycle.spark.seed.driver import partition_keys, place_buckets, run_seed
from support.spark_fixtures import backlog_rows, write_backlog

BASE = 1_800_000_000_000
CONFIG = BucketConfig(
    delayed_delivery_min_index_count_per_bucket=100,
    delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds=60,
    delayed_delivery_max_indexes_per_bucket_snapshot_segment=20,
    delayed_delivery_max_num_buckets=-1,
    max_unacked_per_bucket=1_000_000,
    topic="persistent://public/default/sched",
    cursor="public/default/writer",
)
OPTS = ClassifyOptions(now_ms=BASE, max_delay_ms=400 * 86400 * 1000, allowed_target_prefixes=())


def test_plan_follows_the_seal_rule_and_the_bucket_limit() -> None:
    counts = [(10, 30), (11, 80), (12, 50), (13, 60), (14, 5)]
    assert plan_ledger_buckets(counts, 100, -1) == [(10, 11, 110), (12, 13, 110), (14, 14, 5)]
    assert plan_ledger_buckets(counts, 1, -1) == [(l, l, c) for l, c in counts]
    for limit in (1, 2, 3, 4):
        plan = plan_ledger_buckets(counts, 1, limit)
        assert len(plan) <= limit and sum(c for *_, c in plan) == 225
        assert [p[0] for p in plan] == sorted(p[0] for p in plan)
    assert plan_ledger_buckets([(7, 1000)], 10, 4) == [(7, 7, 1000)]  # a ledger is never split
    with pytest.raises(ValueError, match="listed twice"):
        plan_ledger_buckets([(1, 2), (1, 3)], 10, 4)


def test_place_buckets_balances_rows_when_buckets_share_partitions() -> None:
    assert place_buckets([5, 5, 5], 8) == [0, 1, 2]
    place = place_buckets([10, 1, 1, 9, 2, 3], 2)
    loads = [sum(s for s, p in zip([10, 1, 1, 9, 2, 3], place) if p == q) for q in range(2)]
    assert sorted(loads) == [13, 13]


@pytest.mark.spark
def test_partition_keys_land_on_their_partitions(spark) -> None:
    from pyspark.sql import functions as F

    keys = partition_keys(spark, 7)
    df = spark.createDataFrame([(k, p) for p, k in enumerate(keys)], "k long, p int").repartition(7, "k")
    assert {(r["p"], r["pid"]) for r in df.select("p", F.spark_partition_id().alias("pid")).collect()} == \
        {(p, p) for p in range(7)}


def test_external_positions_are_out_of_bookkeepers_range() -> None:
    ledger, entry = external_position(0, 0)
    assert ledger == 1 << 62 and entry == 0
    assert external_position(0, 50_000) == ((1 << 62) + 1, 0)
    assert external_position(1, 0)[0] > external_position(0, 10**9)[0]
    assert external_position(2**21 - 1, 0)[0] < 1 << 63  # still a positive Java long
    with pytest.raises(ValueError):
        external_position(-1, 0)


def _rows_with_specials() -> list:
    rows = backlog_rows({100: 30, 101: 80, 102: 50, 103: 60, 104: 45, 105: 7}, BASE, 15 * 60_000)
    rows.append(dict(rows[3]))  # a redelivered duplicate
    cancel = dict(rows[0], ledger_id=106, entry_id=0, properties=[(CANCEL_PROP, "101:5")], deliver_at=None)
    cancel_early = dict(rows[0], ledger_id=106, entry_id=1, properties=[(CANCEL_PROP, "999:1")], deliver_at=None)
    invalid = dict(rows[0], ledger_id=106, entry_id=2, properties=[("x", "y")], deliver_at=None)
    return rows + [cancel, cancel_early, invalid]


def _engine_store(path: Path, rows: list) -> DirectorySnapshotStorage:
    """What the writer's engine writes for the same messages, arriving in ledger order."""
    store = DirectorySnapshotStorage(path)
    ix = BucketIndex(store, CONFIG)
    ix.recover()
    intakes = [classify_row(r["ledger_id"], r["entry_id"], r["batch_index"], r["partition"], r["payload"],
                            as_properties(r["properties"]), r["key"], r["event_time"], OPTS) for r in rows]
    for c in intakes:
        if isinstance(c, Cancel):
            ix.cancel(c.ledger_id, c.entry_id)
    msgs = sorted((m for m in intakes if isinstance(m, DelayedMessage)), key=lambda m: (m.ledger_id, m.entry_id))
    for i in range(0, len(msgs), 17):
        ix.add(msgs[i:i + 17])
    ix.seal()
    return store


def _manifest(store: DirectorySnapshotStorage) -> Manifest:
    man = Manifest.FromString(store.get_manifest())
    man.journal_cut = 0  # the engine's journal position: the seeded store has no journal
    return man


@pytest.mark.spark
@pytest.mark.parametrize("path,max_partitions", [("direct", 2000), ("shuffle", 2000), ("shuffle", 2)],
                         ids=["direct", "shuffle-one-bucket-per-task", "shuffle-buckets-share-tasks"])
def test_seeded_snapshots_are_byte_identical_to_the_engines(spark, tmp_path: Path, monkeypatch, path: str,
                                                           max_partitions: int) -> None:
    monkeypatch.setattr(seed, "MAX_PARTITIONS", max_partitions)
    rows = _rows_with_specials()
    inputs = write_backlog(tmp_path / "backlog", rows, per_file=97)
    engine = _engine_store(tmp_path / "engine", rows)
    report = run_seed(spark, inputs, str(tmp_path / "seeded"), CONFIG, OPTS, progress=JobProgress(None, "t", enabled=False),
                      direct=path == "direct")
    assert report.path == path
    seeded = DirectorySnapshotStorage(tmp_path / "seeded")

    ids = engine.list_snapshots()
    assert len(ids) == 3 and seeded.list_snapshots() == ids  # [100-101], [102-103], [104-105]
    for bid in ids:
        a = (tmp_path / "engine" / "snapshots" / f"{bid:020d}.snap").read_bytes()
        b = (tmp_path / "seeded" / "snapshots" / f"{bid:020d}.snap").read_bytes()
        assert a == b, f"bucket {bid}: seeded snapshot differs from the engine's"
    assert _manifest(seeded) == _manifest(engine)
    assert len(_manifest(seeded).tombstones) == 2
    assert report.duplicates == 1 and report.cancelled == 1 and report.invalid == 1
    assert report.items == sum((30, 80, 50, 60, 45, 7)) - 1 and report.buckets == 3
    assert report.segments > 3  # the time step and the 20-index limit cut several segments


@pytest.mark.spark
def test_seed_refuses_a_used_store_and_respects_the_bucket_limit(spark, tmp_path: Path) -> None:
    rows = backlog_rows({l: 40 for l in range(1, 21)}, BASE, 60_000)
    inputs = write_backlog(tmp_path / "backlog", rows)
    cfg = BucketConfig(delayed_delivery_min_index_count_per_bucket=10, delayed_delivery_max_num_buckets=4)
    progress = JobProgress(None, "t", enabled=False)
    report = run_seed(spark, inputs, str(tmp_path / "s"), cfg, OPTS, progress=progress)
    assert 1 < report.buckets <= 4 and report.items == 800
    man = Manifest.FromString(DirectorySnapshotStorage(tmp_path / "s").get_manifest())
    ranges = [(b.start_ledger_id, b.end_ledger_id) for b in man.buckets]
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    with pytest.raises(SparkJobError, match="not empty"):
        run_seed(spark, inputs, str(tmp_path / "s"), cfg, OPTS, progress=progress)
    # A writer started on the store recovers every item without reading the backlog.
    ix = BucketIndex(DirectorySnapshotStorage(tmp_path / "s"), cfg)
    rep = ix.recover()
    assert rep.pending == 800 and rep.journal_records == 0 and rep.orphans_deleted == 0
    got = ix.pop_due(BASE + 10**9, 10_000)
    assert len(got) == 800 and len({(r.message.ledger_id, r.message.entry_id) for r in got}) == 800
    assert all(r.release_ts == r.message.deliver_at for r in got)
    assert [r.key for r in got] == sorted(r.key for r in got)


@pytest.mark.spark
def test_seed_names_missing_columns(spark, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"ledger_id": [1], "deliver_at": [BASE]}), path)
    with pytest.raises(SparkJobError, match="lacks columns"):
        run_seed(spark, [str(path)], str(tmp_path / "s"), CONFIG, OPTS, progress=JobProgress(None, "t", enabled=False))
    assert DELIVER_AT_PROP  # the protocol name the rows carry


@pytest.mark.spark
def test_avro_backlog_seeds_the_same_bytes_as_parquet(spark, tmp_path: Path) -> None:
    import fastavro

    rows = backlog_rows({7: 30, 8: 25}, BASE, 5 * 60_000, seed=9)
    schema = {"type": "record", "name": "Row", "fields": [
        {"name": "ledger_id", "type": "long"}, {"name": "entry_id", "type": "long"},
        {"name": "batch_index", "type": "int"}, {"name": "partition", "type": "int"},
        {"name": "deliver_at", "type": ["null", "long"]}, {"name": "payload", "type": "bytes"},
        {"name": "key", "type": ["null", "string"]}, {"name": "properties", "type": {"type": "map", "values": "string"}},
        {"name": "event_time", "type": "long"}, {"name": "target", "type": ["null", "string"]},
        {"name": "publish_time", "type": "long"}, {"name": "topic", "type": "string"}]}
    (tmp_path / "avro").mkdir()
    with open(tmp_path / "avro" / "part-0.avro", "wb") as fh:
        fastavro.writer(fh, schema, [dict(r, properties=dict(r["properties"])) for r in rows], codec="deflate")
    quiet = JobProgress(None, "t", enabled=False)
    run_seed(spark, [str(tmp_path / "avro")], str(tmp_path / "a"), CONFIG, OPTS, fmt="avro", progress=quiet)
    run_seed(spark, write_backlog(tmp_path / "pq", rows), str(tmp_path / "p"), CONFIG, OPTS, progress=quiet)
    a, p = DirectorySnapshotStorage(tmp_path / "a"), DirectorySnapshotStorage(tmp_path / "p")
    assert a.list_snapshots() == p.list_snapshots() == [1]
    assert (tmp_path / "a" / "snapshots" / f"{1:020d}.snap").read_bytes() == \
        (tmp_path / "p" / "snapshots" / f"{1:020d}.snap").read_bytes()


def test_direct_tasks_read_only_overlapping_row_groups_and_refuse_unordered_exports(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pulsar_lifecycle.spark.seed import direct as sd
    from pulsar_lifecycle.spark.seed import executor as sx

    plan = [(100, 101, 110), (102, 103, 110), (104, 105, 52)]
    ordered = backlog_rows({100: 30, 101: 80, 102: 50, 103: 60, 104: 45, 105: 7}, BASE, 60_000)
    write_backlog(tmp_path / "ordered", ordered, per_file=97)
    groups = sd.row_groups([str(tmp_path / "ordered")])
    assert groups is not None and sum(g.rows for g in groups) == len(ordered)
    tasks = sd.plan_tasks(plan, groups, 1)
    assert [(t.first_bucket, t.ends) for t in tasks] == [(0, (101,)), (1, (103,)), (2, (105,))]
    assert sd.read_amplification(tasks, groups) < 2
    got = sx.read_task(tasks[1], ["ledger_id", "entry_id"])
    assert sorted(got.column("ledger_id").to_pylist()) == [102] * 50 + [103] * 60
    assert set(got.column("bucket_no").to_pylist()) == {1}
    # Every file spans every ledger: each task would read everything.
    mixed = sorted(ordered, key=lambda r: r["entry_id"])
    write_backlog(tmp_path / "mixed", mixed, per_file=97)
    groups = sd.row_groups([str(tmp_path / "mixed")])
    assert groups is not None and sd.read_amplification(sd.plan_tasks(plan, groups, 1), groups) > 2
    # The planning scan's counts, read with pyarrow per task of row groups.
    specials = _rows_with_specials()
    write_backlog(tmp_path / "specials", specials, per_file=97)
    groups = sd.row_groups([str(tmp_path / "specials")])
    assert groups is not None
    got = sorted(x for task in sd.count_tasks(groups, 2) for x in sx.count_ledgers(CANCEL_PROP, task))
    merged: dict = {}
    for ledger, n, c in got:
        merged[ledger] = (merged.get(ledger, (0, 0))[0] + n, merged.get(ledger, (0, 0))[1] + c)
    want: dict = {}
    for r in specials:
        n, c = want.get(r["ledger_id"], (0, 0))
        want[r["ledger_id"]] = (n + 1, c + any(k == CANCEL_PROP for k, _ in r["properties"]))
    assert merged == want and sum(c for _, c in want.values()) == 2
    # A row group without statistics cannot be planned.
    pq.write_table(pa.table({"ledger_id": [1, 2]}), tmp_path / "nostats.parquet", write_statistics=False)
    assert sd.row_groups([str(tmp_path / "nostats.parquet")]) is None


class _DamageBeforeCheck(JobProgress):
    """Runs `damage` when the seed reaches its output check (after the tasks wrote, before the
    manifest): what executors writing somewhere the driver does not look would leave behind."""

    def __init__(self, damage) -> None:
        super().__init__(None, "t", enabled=False)
        self._damage = damage

    def phase(self, name: str) -> None:
        if name == "check output":
            self._damage()
        super().phase(name)


@pytest.mark.spark
@pytest.mark.parametrize("damage", ["missing", "short"])
def test_seed_checks_its_output_before_writing_the_manifest(spark, tmp_path: Path, damage: str) -> None:
    rows = backlog_rows({l: 40 for l in range(1, 9)}, BASE, 60_000)
    inputs = write_backlog(tmp_path / "backlog", rows)
    cfg = BucketConfig(delayed_delivery_min_index_count_per_bucket=80, delayed_delivery_max_num_buckets=8,
                       delayed_delivery_max_indexes_per_bucket_snapshot_segment=30)
    snap = tmp_path / "s" / "snapshots" / f"{2:020d}.snap"

    def lose_or_shorten() -> None:
        if damage == "missing":
            snap.unlink()
            return
        st = DirectorySnapshotStorage(tmp_path / "s")  # bucket 2 rewritten without its last segment
        meta = SnapshotMetadata.FromString(st.get_metadata(2))
        segs = st.get_segments(2, 1, len(meta.metadata_list))
        info = st.snapshot_info(2)
        del meta.metadata_list[-1]
        st.delete(2)
        write_whole(st, meta.SerializeToString(), segs[:-1], info["bucket_key"], info["topic"], info["cursor"],
                    bucket_id=2)

    want = rf"{snap} is missing" if damage == "missing" else rf"{snap} holds .*items \d+ \(task reported 80\)"
    with pytest.raises(SparkJobError, match=rf"seed output check failed for file://{tmp_path}/s, 1 of 4 snapshots: "
                                            rf"{want}.*no manifest was written"):
        run_seed(spark, inputs, str(tmp_path / "s"), cfg, OPTS, progress=_DamageBeforeCheck(lose_or_shorten))
    store = DirectorySnapshotStorage(tmp_path / "s")
    assert store.get_manifest() is None and store.get_index_id() is None  # nothing a writer would adopt
    # A new run drops the unreferenced snapshots and seeds the store.
    report = run_seed(spark, inputs, str(tmp_path / "s"), cfg, OPTS, progress=JobProgress(None, "t", enabled=False))
    assert report.buckets == 4 and report.items == 320
