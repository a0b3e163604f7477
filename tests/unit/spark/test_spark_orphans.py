"""`spark orphans` on local[2]: the audit end to end and each safety rule (each test fails without its rule).

Storage and metadata are the local bookie HTTP and admin REST servers over 127.0.0.1; enqueueing
goes to the embedded broker."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.deletion.codec import decode
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.spark.orphans.driver import AuditConfig, run_audit
from pulsar_lifecycle.spark.orphans.driver_listing import list_bookies
from pulsar_lifecycle.spark.orphans.model import ListingError
from pulsar_lifecycle.spark.orphans.sources import AdminInUse, BookieListing, RateLimiter
from pulsar_lifecycle.spark.orphans.state import ScanStateDir
from servers.bookie_http_server import pulsar_metadata
from support.helpers import drain
from support.orphans import SmallCluster, old_ms, orphan_ids

DAY = 24 * 3600 * 1000


def _config(bookie, admin, **kw) -> AuditConfig:
    return AuditConfig(listings=[BookieListing([bookie.url])], in_use=[AdminInUse([admin.url], RateLimiter(0))], **kw)


def test_reports_orphans_not_in_use_nor_unlabelled(spark, bookie_server, admin_server, tmp_path):
    SmallCluster.build(bookie_server, admin_server)
    report = run_audit(spark, _config(bookie_server, admin_server), ScanStateDir(tmp_path))
    assert orphan_ids(report) == [5, 6, 7]
    assert {r["ledger_id"]: r["component"] for r in report.sample} == {5: "managed-ledger", 6: "managed-cursor",
                                                                       7: "schema"}
    assert report.counts["IN_USE"] == 4 and report.counts["UNLABELLED"] == 1 and report.orphans == 3
    # Storage was listed completely before the first metadata call.
    assert max(bookie_server.list_requests) < min(admin_server.request_times)


def test_never_newer_than_metadata(spark, bookie_server, admin_server, tmp_path):
    SmallCluster.build(bookie_server, admin_server)
    # Created 3 days ago per its ctime, but above the newest id (13) the metadata knows: metadata lags.
    bookie_server.add_ledger(14, pulsar_metadata("public/default/t"), old_ms())
    report = run_audit(spark, _config(bookie_server, admin_server), ScanStateDir(tmp_path))
    assert 14 not in orphan_ids(report) and report.counts["NEWER_THAN_METADATA"] == 1


def test_minimum_age(spark, bookie_server, admin_server, tmp_path):
    SmallCluster.build(bookie_server, admin_server)
    bookie_server.add_ledger(8, pulsar_metadata("public/default/t"), old_ms(days=0.5))  # 12 h old
    report = run_audit(spark, _config(bookie_server, admin_server), ScanStateDir(tmp_path))
    assert 8 not in orphan_ids(report) and report.counts["TOO_YOUNG"] == 1
    relaxed = run_audit(spark, _config(bookie_server, admin_server, older_than_ms=DAY // 4), ScanStateDir(tmp_path))
    assert 8 in orphan_ids(relaxed)


def test_uncovered_namespace_is_not_judged(spark, bookie_server, admin_server, tmp_path):
    SmallCluster.build(bookie_server, admin_server)
    # Another cluster's ledger on the same bookies: its namespace is not in this admin's metadata.
    bookie_server.add_ledger(9, pulsar_metadata("other/ns/x"), old_ms())
    report = run_audit(spark, _config(bookie_server, admin_server), ScanStateDir(tmp_path))
    assert 9 not in orphan_ids(report) and report.counts["UNCOVERED"] == 1


@pytest.mark.parametrize("where", ["bookie", "admin"])
def test_failed_listing_aborts_and_commits_nothing(spark, bookie_server, admin_server, tmp_path, where):
    SmallCluster.build(bookie_server, admin_server)
    for lid in range(100, 400):  # several pages: the second one fails
        bookie_server.add_ledger(lid, pulsar_metadata("public/default/t"), old_ms())
    admin_server.add_ledger("public/default/t", 400)
    if where == "bookie":
        bookie_server.fail_list_pages.add(2)
    else:
        admin_server.fail_topics.add("public/default/t")
    state = ScanStateDir(tmp_path)
    with pytest.raises(ListingError):
        run_audit(spark, _config(bookie_server, admin_server), state)
    assert state.records() == [] and list(state.scans.iterdir()) == []


def _cli(bookie, admin, state_dir, *extra):
    return CliRunner().invoke(main, ["spark", "orphans", "--master", "local[2]", "--quiet", "--bookie-url", bookie.url,
                                     "--admin-url", admin.url, "--state-dir", str(state_dir), *extra])


def test_enqueue_needs_two_scans_confirm_after_apart(spark, broker, bookie_server, admin_server, tmp_path,
                                                     unique):
    SmallCluster.build(bookie_server, admin_server)
    topics = DeletionTopics(topic_name=f"__ld_{unique.replace('-', '_')}", parallelism=1)
    enq = ["--enqueue", "--service-url", broker.service_url, "--topic-name", topics.topic_name, "--parallelism", "1",
           "--send-delay-seconds", "0"]
    state_dir = tmp_path / "state"
    report_path = tmp_path / "r.json"
    # A single scan confirms nothing: nothing enqueued.
    first = _cli(bookie_server, admin_server, state_dir, *enq, "--confirm-after", "1s", "--json-report", str(report_path))
    assert first.exit_code == 0, first.output
    rep = json.loads(report_path.read_text())
    assert rep["orphans"] == 3 and rep["confirmed"] == 0 and rep["enqueue"]["sent"] == []
    # A second scan sooner than --confirm-after after the first: still nothing.
    second = _cli(bookie_server, admin_server, state_dir, *enq, "--confirm-after", "1h", "--json-report", str(report_path))
    assert second.exit_code == 0, second.output
    assert json.loads(report_path.read_text())["enqueue"]["sent"] == []
    # Meanwhile ledger 7's schema comes back into use; then a scan >= 1 s after the first confirms 5 and 6.
    admin_server.set_topic("public/default/t", ledgers=[10, 11], cursors={"s": 12}, schema_ledgers=[13, 7])
    import time

    time.sleep(1.05)
    third = _cli(bookie_server, admin_server, state_dir, *enq, "--confirm-after", "1s", "--json-report", str(report_path))
    assert third.exit_code == 0, third.output
    rep = json.loads(report_path.read_text())
    assert sorted(r["ledger_id"] for r in rep["enqueue"]["sent"]) == [5, 6]
    client = quiet_client(broker.service_url)
    msgs = drain(client, topics.deletion_partition(0), "check", expect=2, timeout=5)
    client.close()
    got = sorted((decode(m.data()).ledger_id, decode(m.data()).ledger_component.value, decode(m.data()).topic_name,
                  tuple(sorted(decode(m.data()).properties.items())), decode(m.data()).check_ledger_still_in_use)
                 for m in msgs)
    assert got == [(5, "MANAGED_LEDGER", "public/default/t", (), True),
                   (6, "MANAGED_CURSOR", "public/default/t", (("cursor", "old-sub"),), True)]
    assert bookie_server.deleted == []  # phase one only: nothing deleted by the audit


def test_cli_failed_listing_exits_nonzero_without_report(spark, bookie_server, admin_server, tmp_path):
    SmallCluster.build(bookie_server, admin_server)
    bookie_server.fail_list_pages.add(1)
    res = _cli(bookie_server, admin_server, tmp_path / "state", "--json-report", str(tmp_path / "r.json"))
    assert res.exit_code == 2 and "aborted, nothing reported" in res.output
    assert not (tmp_path / "r.json").exists()


def test_exported_lists(spark, tmp_path):
    import pandas as pd

    now = old_ms(0)
    listed = pd.DataFrame({"ledger_id": [1, 2, 3, 4, 50], "component": ["managed-ledger"] * 4 + [None],
                           "owner": ["public/default/persistent/t"] * 5,
                           "created_ms": [old_ms(), old_ms(), old_ms(), now, old_ms()]})
    in_use = pd.DataFrame({"ledger_id": [2, 10]})
    listed.to_csv(tmp_path / "listed.csv", index=False)
    in_use.to_csv(tmp_path / "in_use.csv", index=False)
    rep = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["spark", "orphans", "--quiet", "--master", "local[2]", "--listed",
                                    str(tmp_path / "listed.csv"), "--in-use", str(tmp_path / "in_use.csv"),
                                    "--state-dir", str(tmp_path / "s"), "--json-report", str(rep)])
    assert res.exit_code == 0, res.output
    out = json.loads(rep.read_text())
    assert sorted(r["ledger_id"] for r in out["orphanSample"]) == [1, 3]  # 2 in use, 4 too young, 50 unlabelled
    # An export directory without Spark's _SUCCESS marker may be partial: refused.
    spark.createDataFrame(listed).write.parquet(str(tmp_path / "part"))
    (Path(tmp_path) / "part" / "_SUCCESS").unlink()
    res = CliRunner().invoke(main, ["spark", "orphans", "--quiet", "--master", "local[2]", "--listed",
                                    str(tmp_path / "part"), "--in-use", str(tmp_path / "in_use.csv"),
                                    "--state-dir", str(tmp_path / "s")])
    assert res.exit_code != 0 and "_SUCCESS" in res.output


def test_snapshot_store_against_its_manifest(spark, tmp_path):
    import os

    from pulsar_lifecycle.bucket.codec import Manifest
    from pulsar_lifecycle.bucket.storage.directory import DirectorySnapshotStorage
    from pulsar_lifecycle.spark.orphans.sources import SnapshotManifestInUse, SnapshotStoreListing

    root = tmp_path / "snap"
    store = DirectorySnapshotStorage(root)
    topic = "persistent://public/default/sched"
    ids = [store.create_snapshot(b"m", [b"s"], f"#pulsar.internal.delayed.bucket_{i}_{i}", topic, "c") for i in (1, 2, 3)]
    man = Manifest(format_version=1, max_bucket_id=ids[1])  # bucket 3 was written after this manifest
    man.buckets.add(bucket_id=ids[0], bucket_key="#pulsar.internal.delayed.bucket_1_1", start_ledger_id=1, end_ledger_id=1)
    store.put_manifest(man.SerializeToString())
    three_days_ago = old_ms() / 1000
    for bid in ids:
        os.utime(root / "snapshots" / f"{bid:020d}.snap", (three_days_ago, three_days_ago))
    cfg = AuditConfig(listings=[SnapshotStoreListing(str(root))], in_use=[SnapshotManifestInUse(str(root))])
    report = run_audit(spark, cfg, ScanStateDir(tmp_path / "state"))
    assert orphan_ids(report) == [ids[1]] and report.sample[0]["component"] == "bucket-snapshot"
    assert report.counts["IN_USE"] == 1 and report.counts["NEWER_THAN_METADATA"] == 1


def test_bookie_pages_listed_by_the_executors_in_rounds(spark, bookie_server, tmp_path):  # noqa: F811
    # 1,050 ledgers = 11 pages; 2 tasks x 2 pages per round: 3 rounds, the last ends on page 12.
    for lid in range(1, 1051):
        bookie_server.add_ledger(lid, pulsar_metadata("public/default/t"), old_ms())
    df, n = list_bookies(spark, BookieListing([bookie_server.url]), tmp_path / "l", tasks=2, pages_per_task=2)
    assert n == 1050 and sorted(r.ledger_id for r in df.select("ledger_id").collect()) == list(range(1, 1051))
    # A page of the third round fails: the listing fails, as on the driver.
    bookie_server.fail_list_pages.add(10)
    with pytest.raises(ListingError, match="page 10"):
        list_bookies(spark, BookieListing([bookie_server.url]), tmp_path / "m", tasks=2, pages_per_task=2)
    # Bounded: a listing longer than max_pages is refused, never cut short.
    bookie_server.fail_list_pages.clear()
    with pytest.raises(ListingError, match="more than 6 pages"):
        list_bookies(spark, BookieListing([bookie_server.url], max_pages=6), tmp_path / "n", tasks=2, pages_per_task=2)


def test_owner_namespace_is_one_rule_in_python_and_in_spark(spark):
    """driver_frames' column expression gives exactly model.namespace_of for every kind of owner."""
    from pyspark.sql import functions as F

    from pulsar_lifecycle.spark.orphans.driver_frames import _owner_ns
    from pulsar_lifecycle.spark.orphans.model import namespace_of

    owners = ["t/ns/persistent/a%2Fb", "t/ns/x", "persistent://t/ns/x", "non-persistent://t/ns/x-partition-1",
              "s3://bucket/t/ns/x", "Persistent://t/ns/x", "t/ns/", "t//x", "/ns/x", "t/ns", "", "x://y://t/ns/z"]
    rows = spark.createDataFrame([(o,) for o in owners], "owner string").select(
        "owner", _owner_ns(F.col("owner")).alias("ns")).collect()
    assert {r["owner"]: r["ns"] for r in rows} == {o: namespace_of(o) for o in owners}
