"""docs/spark.md's worked example as written: its commands with their relative paths, run from one
working directory, Spark on local-cluster[2,1,1024] (executor JVMs with working directories of
their own); then the writer started on the seeded store releases every message. On the same
session: the orphan audit with a relative --state-dir (bookie listing and candidates on the
executors) and a damaged backlog (one Error: line). tests/unit/spark/test_spark_commands.py runs
the same kinds of command on local[2].

The commands run in one child process that starts the Spark session first
(support.spark_fixtures.run_spark_commands): one local-cluster start instead of one per command."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pulsar_lifecycle.bucket import DirectorySnapshotStorage
from pulsar_lifecycle.bucket.codec import JournalRecord
from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, ORIGIN_MSG_ID_PROP
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import drain
from support.orphans import SmallCluster
from support.paths import REPO
from support.spark_fixtures import (
    LOCAL_CLUSTER,
    assert_no_spark_log_lines,
    assert_one_error_line,
    run_spark_commands,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]
MASTER = LOCAL_CLUSTER
STORE = ".pulsar-lifecycle/buckets/writer"
CONFIG = "function-configs/bucket-snapshot-writer.yaml"


def _writer_config(cwd: Path, unique: str) -> dict:
    """The shipped writer config at its relative path under `cwd`, with this test's topics."""
    cfg = load_function_config(REPO / CONFIG)
    ticks, sched = f"persistent://public/default/ticks-{unique}", f"persistent://public/default/sched-{unique}"
    specs = list(cfg["inputSpecs"].values())
    cfg["inputSpecs"] = {ticks: specs[0], sched: specs[1]}
    cfg["output"] = f"persistent://public/default/released-{unique}"
    cfg["name"] = f"writer-{unique}"
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=ticks, schedulingTopic=sched,
                             snapshotDir=str(cwd / STORE), delayedDeliveryMinIndexCountPerBucket=40)
    (cwd / CONFIG).parent.mkdir(parents=True)
    (cwd / CONFIG).write_text(yaml.safe_dump(cfg))
    return cfg


@pytest.mark.timeout(900)  # a loaded 2-core machine takes minutes to start executor JVMs
@pytest.mark.lite_only("one broker is enough for the Spark side; test_spark_export seeds and releases on both")
def test_worked_example_on_local_cluster_seeds_a_store_the_writer_releases(broker, spark_home: Path, tmp_path: Path,
                                                                           unique: str, bookie_server,
                                                                           admin_server) -> None:
    cfg = _writer_config(tmp_path, unique)
    SmallCluster.build(bookie_server, admin_server)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "part-000000.parquet").write_bytes(b"PAR1" + bytes(200) + b"not parquet")
    sched, ticks = cfg["userConfig"]["schedulingTopic"], cfg["userConfig"]["tickTopic"]
    fqfn = f"{cfg['tenant']}/{cfg['namespace']}/{cfg['name']}"
    t0 = now_ms()
    # 1. producers sent delayed messages; the writer is not deployed yet
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        for i in range(240):
            dp.send_async(cfg["output"], f"job-{i}".encode(), t0 + (i % 9) * 500, lambda res, mid: None)
        dp.flush()
    finally:
        dp.close()
        client.close()
    # 2.-4. as written in docs/spark.md, with the master added
    run = run_spark_commands(tmp_path, MASTER, [
        ["export-backlog", "--service-url", broker.service_url, "--topic", sched, "--subscription", fqfn,
         "--store", STORE, "--wake-topic", ticks, "--out", "backlog/", "--idle-ms", "1500"],
        ["spark", "seed", "backlog/", "--store", STORE, "--function-config-file", CONFIG, "--report", "seed.json",
         "--master", MASTER],
        ["spark", "verify", "--store", STORE, "--against", "backlog/", "--function-config-file", CONFIG,
         "--out", "verify-report/", "--master", MASTER],
        ["spark", "orphans", "--bookie-url", bookie_server.url, "--admin-url", admin_server.url,
         "--snapshot-dir", STORE, "--state-dir", "scans", "--master", MASTER, "--quiet", "--json-report", "scan.json"],
        ["spark", "seed", "bad/", "--store", "store-bad", "--function-config-file", CONFIG, "--master", MASTER],
    ], spark_home)
    print("command durations:", [(r.args[0], r.args[1], r.seconds) for r in run.results])
    export, seed, verify, audit, bad = run.results
    assert export.exit_code == 0 and "exported 240 messages" in export.output, export.output
    assert seed.exit_code == 0 and f"seeded {STORE}: 240 items" in seed.output, seed.output
    report = json.loads((tmp_path / "seed.json").read_text())
    store = DirectorySnapshotStorage(tmp_path / STORE)
    assert report["buckets"] >= 1 and store.list_snapshots() == report["bucket_ids"]
    assert not list((spark_home / "work").rglob("*.snap")), "an executor wrote into its own work directory"
    assert verify.exit_code == 0, verify.output
    assert "OK: no violations" in verify.output and "(seeded store)" in verify.output, verify.output
    assert audit.exit_code == 0, audit.output
    scan = json.loads((tmp_path / "scan.json").read_text())
    assert sorted(r["ledger_id"] for r in scan["orphanSample"]) == [5, 6, 7]
    assert (tmp_path / "scans" / "scans" / f"{scan['scanId']}.parquet").is_dir()
    assert_one_error_line(bad, "bad/part-000000.parquet", "is not a Parquet file")
    assert_no_spark_log_lines(*(r.output for r in run.results), run.stderr)
    assert "bad/part-000000.parquet" in run.spark_log and "\tat " in run.spark_log

    # 5. the writer on that directory releases every message once, never early, without replaying the backlog
    spec = spec_from_config(cfg)
    writer = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)).start()
    client = quiet_client(broker.service_url)
    try:
        got = drain(client, spec.output, "check", expect=240, timeout=60)
        extra = drain(client, spec.output, "check", expect=1, timeout=2)
    finally:
        writer.stop()
        client.close()
    origins = [m.properties()[ORIGIN_MSG_ID_PROP] for m in got + extra]
    assert len(origins) == len(set(origins)) == 240, "each message exactly once"
    for m in got:
        assert int(m.properties()[RELEASED_AT_PROP]) >= int(m.properties()[DELIVER_AT_PROP]), "released early"
    assert [r for _, r in store.journal_read() if JournalRecord.FromString(r).add] == []
