"""Function state and bucket snapshots on a real BookKeeper table service (the one an Apache
Pulsar standalone runs), through `pulsar-lifecycle localrun --state-storage-service-url`.

The writer keeps its bucket index (journal, sealed snapshots, manifest, cursor, index id) in its
`<name>_buckets` table and its dedup state (index id, dedup snapshots) in the function's state
table. It is SIGKILLed and restarted with another, empty --data-dir: whatever it releases after
that can only come from the table service, and every message is released exactly once.
"""
from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pulsar
import pytest
import requests
import yaml

from pulsar_lifecycle.bucket.storage import bookkeeper_partition_storage, bookkeeper_snapshot_storage
from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.dedup import snapshot_key
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.index_identity import STATE_KEY
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from pulsar_lifecycle.state.bk_table import BookKeeperStateStore
from support.broker_fixtures import broker_kinds
from support.helpers import publish_all, stop_process, wait_for
from support.paths import REPO

# pulsar_only says why; skipif keeps a TEST_BROKERS run without real Pulsar from starting one.
pytestmark = [pytest.mark.integration, pytest.mark.pulsar_only("needs the BookKeeper table service"),
              pytest.mark.skipif("pulsar" not in broker_kinds(), reason="not on lite: needs the BookKeeper table service")]

SOON, LATE = 500, 300


def _writer_config(tmp_path: Path, unique: str, state_url: str) -> Tuple[Path, Dict[str, str]]:
    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    names = {"sched": f"persistent://public/default/ts-sched-{unique}",
             "ticks": f"persistent://public/default/ts-ticks-{unique}",
             "output": f"persistent://public/default/ts-released-{unique}",
             "name": f"ts-writer-{unique}"}
    cfg["inputSpecs"] = {names["ticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg["output"] = names["output"]
    cfg["name"] = names["name"]
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=names["ticks"], tickTimeMillis=200, tickMode="runner",
                             schedulingTopic=names["sched"], snapshotStorage="bookkeeper",
                             snapshotStorageServiceUrl=state_url, delayedDeliveryMinIndexCountPerBucket=100)
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, names


def _localrun(config: Path, p, data_dir: Path, log: Path) -> "subprocess.Popen[bytes]":
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "functions"), env.get("PYTHONPATH", "")])
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "INFO", "localrun",
             "--function-config-file", str(config), "--broker-service-url", p.service_url,
             "--state-storage-service-url", p.state_storage_url, "--data-dir", str(data_dir)],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env)


def _receive(consumer: pulsar.Consumer, got: List[Tuple[str, int, int]], until: float, want: int) -> None:
    while len(got) < want and time.monotonic() < until:
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        props = m.properties()
        got.append((m.data().decode(), int(props[DELIVER_AT_PROP]), int(props[RELEASED_AT_PROP])))
        consumer.acknowledge(m)


def test_writer_recovers_index_and_dedup_state_from_the_table_service(pulsar_broker, tmp_path, unique):
    p = pulsar_broker
    config, names = _writer_config(tmp_path, unique, p.state_storage_url)
    client = quiet_client(p.service_url)
    out = client.subscribe(names["output"], "count", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    got: List[Tuple[str, int, int]] = []
    soon = [f"soon{i}" for i in range(SOON)]
    late = [f"late{i}" for i in range(LATE)]
    proc = _localrun(config, p, tmp_path / "run-a", tmp_path / "run-a.log")
    buckets = bookkeeper_snapshot_storage(p.state_storage_url, "public", "default", names["name"])
    state = BookKeeperStateStore(p.state_storage_url, "public", "default", names["name"])
    dedup_key = "dedup/0/" + snapshot_key(f"public/default/{names['name']}-0-release", names["output"])
    try:
        prod = client.create_producer(names["sched"], batching_enabled=True, batching_max_publish_delay_ms=5)
        publish_all(prod, [x.encode() for x in soon], [{DELIVER_AT_PROP: str(int(time.time() * 1000) + 1000)}] * SOON)
        _receive(out, got, time.monotonic() + 120, SOON)
        # Messages due later, split by a new ledger of the scheduling topic: the writer seals its
        # bucket there into a snapshot on the table service.
        late_at = str(int(time.time() * 1000) + 20_000)
        publish_all(prod, [x.encode() for x in late[:LATE // 2]], [{DELIVER_AT_PROP: late_at}] * (LATE // 2))
        r = requests.put(f"{p.admin_url}/admin/v2/persistent/{names['sched'].split('://', 1)[1]}/unload", timeout=60)
        assert r.status_code in (200, 204), r.text
        publish_all(prod, [x.encode() for x in late[LATE // 2:]], [{DELIVER_AT_PROP: late_at}] * (LATE // 2))
        prod.close()
        assert wait_for(lambda: buckets.list_snapshots(), timeout=90, interval=0.5), \
            (tmp_path / "run-a.log").read_text()[-3000:]
        sealed = buckets.list_snapshots()
        index_id = buckets.get_index_id()
        # The function's state holds bytes as base64 text, as Pulsar's Context stores str values.
        assert index_id and base64.b64decode(state.get(f"dedup/0/{STATE_KEY}") or b"") == index_id.encode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # Another, empty --data-dir: nothing of the first run is on this disk.
        proc = _localrun(config, p, tmp_path / "run-b", tmp_path / "run-b.log")
        _receive(out, got, time.monotonic() + 120, SOON + LATE)
        _receive(out, got, time.monotonic() + 3, SOON + LATE + 1)  # a duplicate would show up here
    finally:
        stop_process(proc)
        # The dedup publisher's snapshot (written after its recovery and at a clean stop).
        dedup_snapshot = state.get(dedup_key)
        buckets.close()
        state.close()
        client.close()
    second = (tmp_path / "run-b.log").read_text()
    payloads = [g[0] for g in got]
    assert sorted(payloads) == sorted(soon + late), (len(payloads), len(set(payloads)), second[-3000:])
    assert all(released >= due for _, due, released in got), "released early"
    assert dedup_snapshot, f"no dedup snapshot under {dedup_key} in the function's state"
    # The second run found the pending messages in the index on the table service.
    recovered = re.search(r"event=scheduler_recovered report=RecoveryReport\(buckets=(\d+), pending=(\d+)", second)
    assert recovered and int(recovered.group(2)) > 0, second[-3000:]
    print(f"released {len(got)} once each; sealed buckets {sealed}; index {index_id}; "
          f"second run recovered buckets={recovered.group(1)} pending={recovered.group(2)}")


def test_values_above_the_table_services_record_limit_go_through_in_chunks(pulsar_broker, unique):
    """The real store refuses a log record above 1 MB - 8 KB (LogRecordTooLongException, error 500 to
    the client, which retries it for a minute): a 3 MB journal batch and a 1.1 MB manifest must be
    written in chunks under it, plain and under a partition's lease, and read back whole."""
    url = pulsar_broker.state_storage_url
    record, manifest = os.urandom(3 * 1024 * 1024), os.urandom(1_100_000)
    plain = bookkeeper_snapshot_storage(url, "public", "default", f"limit-{unique}")
    opened: list = []

    def open_partition() -> bool:
        # A table the open has just created answers NOT_FOUND for a moment (its range is not
        # served yet); the writer retries its partition claims the same way.
        try:
            opened.extend(bookkeeper_partition_storage(url, "public", "default", f"limit-p-{unique}",
                                                       "partition-0", "owner", 60_000)[:2])
        except Exception as exc:  # noqa: BLE001 - StateError or SnapshotStorageError, both retried
            assert "NOT_FOUND" in str(exc), exc
            return False
        return True
    assert wait_for(open_partition, timeout=30, interval=1), "the partition store never opened"
    part, leases = opened
    try:
        for st in (plain, part):
            rid = st.journal_append(record)
            st.put_manifest(manifest)
            assert st.journal_read()[-1] == (rid, record)
            assert st.get_manifest() == manifest
    finally:
        for c in (plain, part, leases):
            c.close()
