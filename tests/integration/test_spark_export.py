"""export-backlog on the real embedded broker: crash safety, and a seeded store released by the writer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pulsar
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from pulsar_lifecycle.bucket import DirectorySnapshotStorage
from pulsar_lifecycle.bucket.codec import JournalRecord
from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, ORIGIN_MSG_ID_PROP
from pulsar_lifecycle.spark.export.driver import export_backlog, part_files
from pulsar_lifecycle.spark.progress import JobProgress
from pulsar_lifecycle.spark.settings import writer_settings
from pulsar_lifecycle.spark.verify.driver import run_verify
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import drain, wait_for
from support.paths import REPO

pytestmark = pytest.mark.integration
ROOT = REPO


def _send(client: pulsar.Client, topic: str, deliver_at: List[int],
          target: str = "persistent://public/default/unused-target") -> Dict[Tuple[int, int, int], pulsar.MessageId]:
    """Scheduling messages (batched, as DelayedProducer sends them); position -> message id."""
    dp = DelayedProducer(client, scheduling_topic=topic)
    sent: Dict[Tuple[int, int, int], pulsar.MessageId] = {}
    ids: List[Tuple[int, pulsar.MessageId]] = []

    def cb(at: int):
        return lambda res, mid: ids.append((at, mid)) if res == pulsar.Result.Ok else None

    try:
        for i, at in enumerate(deliver_at):
            dp.send_async(target, f"job-{i}".encode(), at, cb(at),
                          properties={"i": str(i)})
        dp.flush()
    finally:
        dp.close()
    for _at, mid in ids:
        sent[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = mid
    assert len(sent) == len(deliver_at)
    return sent


def _exported(out: Path) -> List[Tuple[int, int, int]]:
    rows = []
    for path in part_files(out):
        t = pq.read_table(path, columns=["ledger_id", "entry_id", "batch_index"])
        rows += list(zip(*(t.column(i).to_pylist() for i in range(3))))
    return rows


def test_export_killed_mid_way_loses_and_duplicates_nothing(broker, tmp_path: Path, unique: str) -> None:
    topic = f"persistent://public/default/sched-{unique}"
    client = quiet_client(broker.service_url)
    try:
        sent = _send(client, topic, [now_ms() + 3_600_000] * 3000)
    finally:
        client.close()
    out = tmp_path / "backlog"
    cmd = [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING", "export-backlog",
           "--service-url", broker.service_url, "--topic", topic, "--subscription", "sub", "--out", str(out),
           "--batch-rows", "100", "--idle-ms", "2000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(part_files(out)) >= 3 if out.exists() else False, timeout=60), \
            proc.stderr.read1().decode() if proc.poll() is not None else "no export files"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    before = len(_exported(out))
    assert 0 < before < 3000, "the kill should land mid-export"
    client = quiet_client(broker.service_url)
    try:
        report = export_backlog(client, [topic], "sub", out, batch_rows=500, idle_ms=2000)
    finally:
        client.close()
    rows = _exported(out)
    assert len(rows) == len(set(rows)) == 3000, f"{len(rows) - len(set(rows))} duplicates"
    assert set(rows) == set(sent)
    assert report.files_before >= 3 and report.rows_written == 3000 - before


def test_export_crash_between_file_and_ack_duplicates_nothing(broker, tmp_path: Path, unique: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    topic = f"persistent://public/default/sched-{unique}"
    client = quiet_client(broker.service_url)
    out = tmp_path / "backlog"
    try:
        sent = _send(client, topic, [now_ms() + 3_600_000] * 400)

        def crash(self, msg):
            raise SystemExit("killed after the file was durable, before the acks")

        with monkeypatch.context() as m:
            m.setattr(pulsar.Consumer, "acknowledge", crash)
            with pytest.raises(SystemExit):
                export_backlog(client, [topic], "sub", out, batch_rows=150, idle_ms=2000)
        assert len(_exported(out)) == 150
    finally:
        client.close()  # the unacked messages go back to the subscription
    client = quiet_client(broker.service_url)
    try:
        report = export_backlog(client, [topic], "sub", out, batch_rows=150, idle_ms=2000)
    finally:
        client.close()
    rows = _exported(out)
    assert sorted(rows) == sorted(set(rows)) and set(rows) == set(sent)
    assert report.redelivered_skipped == 150 and report.rows_written == 250


def _writer_config(tmp_path: Path, unique: str) -> Tuple[Path, dict]:
    """The shipped writer config (its wake rules: nothing starts it but an input message) with
    this test's topics and small buckets."""
    cfg = load_function_config(ROOT / "function-configs" / "bucket-snapshot-writer.yaml")
    ticks = f"persistent://public/default/ticks-{unique}"
    sched = f"persistent://public/default/sched-{unique}"
    specs = list(cfg["inputSpecs"].values())
    cfg["inputSpecs"] = {ticks: specs[0], sched: specs[1]}
    cfg["output"] = f"persistent://public/default/released-{unique}"
    cfg["name"] = f"writer-{unique}"
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=ticks, snapshotDir=str(tmp_path / "snapshots"),
                             schedulingTopic=sched,
                             delayedDeliveryMinIndexCountPerBucket=40,
                             delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds=2,
                             delayedDeliveryMaxIndexesPerBucketSnapshotSegment=30)
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


@pytest.mark.spark
def test_a_seeded_store_is_released_exactly_once_on_time_without_replay(spark, broker, tmp_path: Path,
                                                                       unique: str) -> None:
    config_path, cfg = _writer_config(tmp_path, unique)
    sched = cfg["userConfig"]["schedulingTopic"]
    fqfn = f"{cfg['tenant']}/{cfg['namespace']}/{cfg['name']}"
    t0 = now_ms()
    # Half already due when the writer starts, half due well after it started.
    deliver = [t0 + (i % 7) * 100 for i in range(150)] + [t0 + 30_000 + (i % 11) * 300 for i in range(150)]
    client = quiet_client(broker.service_url)
    try:
        sent = _send(client, sched, deliver, target=cfg["output"])
        dp = DelayedProducer(client, scheduling_topic=sched)
        try:
            dp.cancel(sent[sorted(sent)[5]])
        finally:
            dp.close()
    finally:
        client.close()
    runner = CliRunner()
    res = runner.invoke(main, ["export-backlog", "--service-url", broker.service_url, "--topic", sched,
                               "--subscription", fqfn, "--out", str(tmp_path / "backlog"), "--idle-ms", "1500",
                               "--store", str(tmp_path / "snapshots"), "--wake-topic", cfg["userConfig"]["tickTopic"]])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["spark", "seed", str(tmp_path / "backlog"), "--store", str(tmp_path / "snapshots"),
                               "--function-config-file", str(config_path), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "299 items" in res.output and "301 rows" in res.output, res.output
    store = DirectorySnapshotStorage(tmp_path / "snapshots")
    assert len(store.list_snapshots()) >= 1  # one ledger holds them all here: buckets cover whole ledgers
    res = runner.invoke(main, ["spark", "verify", "--store", str(tmp_path / "snapshots"), "--against",
                               str(tmp_path / "backlog"), "--function-config-file", str(config_path), "--quiet",
                               "--out", str(tmp_path / "verify")])
    assert res.exit_code == 0, res.output

    spec = spec_from_config(cfg)
    started = now_ms()
    print(f"export+seed+verify took {started - t0} ms")
    writer = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)).start()
    client = quiet_client(broker.service_url)
    try:
        # verify reads a running writer's store without disturbing it (one consistent manifest)
        config, opts = writer_settings(str(config_path), None)
        live = run_verify(spark, str(tmp_path / "snapshots"), config, opts=opts, allow_overlap=True,
                          progress=JobProgress(None, "t", enabled=False))
        assert live.ok, live.summary()
        got = drain(client, spec.output, "check", expect=len(sent) - 1, timeout=60)
        extra = drain(client, spec.output, "check", expect=1, timeout=2)  # nothing more may come
    finally:
        writer.stop()
        client.close()
    origins = [m.properties()[ORIGIN_MSG_ID_PROP] for m in got + extra]
    assert len(origins) == len(set(origins)) == len(sent) - 1, "each message exactly once"
    by_payload = {m.data(): m for m in got}
    assert len(by_payload) == len(sent) - 1
    for m in got:
        at = int(m.properties()[DELIVER_AT_PROP])
        released = int(m.properties()[RELEASED_AT_PROP])
        assert released >= at, f"released {at - released} ms early"
        if at > started + 2000:
            assert released >= at  # waited for its time instead of leaving at start
    lateness = sorted(int(m.properties()[RELEASED_AT_PROP]) - int(m.properties()[DELIVER_AT_PROP])
                      for m in got if int(m.properties()[DELIVER_AT_PROP]) > started)
    if lateness:  # the pipeline normally takes 15-20 s of the 30 s, so these waited in the writer
        print(f"lateness of messages due after the writer started: median {lateness[len(lateness) // 2]} ms, "
              f"max {lateness[-1]} ms")
    # Nothing came through the scheduling subscription: the writer journaled no add.
    adds = [r for _, r in store.journal_read() if JournalRecord.FromString(r).add]
    assert adds == []
