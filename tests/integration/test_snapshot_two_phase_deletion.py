"""Exhausted bucket snapshots are deleted through two-phase deletion (issue 4 item 3).

BucketSnapshotWriter hands each obsolete snapshot to LedgerDeletionService (a DELAYED_INDEX_BUCKET
request, delayed through the writer itself); LedgerDeletionWorker checks the writer's manifest
(in use?) and the snapshot's owner, then deletes it from the snapshot store.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from pulsar_lifecycle.bucket.storage.directory import DirectorySnapshotStorage
from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.deletion.codec import decode
from pulsar_lifecycle.deletion.model import LedgerComponent
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import drain, wait_for
from support.paths import REPO
from support.writer import writer_spec

pytestmark = pytest.mark.integration
ROOT = REPO


def test_exhausted_snapshots_go_through_the_deletion_worker(broker, tmp_path, unique):
    ns, base = "public/default", f"__ledger_deletion-{unique}"
    spec, sched = writer_spec(unique, tmp_path, snapshotDeletion="two-phase", snapshotDeletionNamespace=ns,
                              snapshotDeletionTopicName=base, snapshotDeletionParallelism=2,
                              snapshotDeletionSendDelaySeconds=1, maxUnackedPerBucket=20)
    snap_dir = Path(spec.user_config["snapshotDir"])
    wcfg = load_function_config(ROOT / "function-configs" / "ledger-deletion-worker.yaml")
    wcfg.update(
        tenant="public", namespace="default", name=f"deleter-{unique}", subName=f"deleter-{unique}", parallelism=1,
        inputs=[f"persistent://{ns}/{base}-partition-{k}" for k in range(2)]
        + [f"persistent://{ns}/{base}-RETRY-partition-{k}" for k in range(2)],
        userConfig={"deletionNamespace": ns, "deletionTopicName": base, "ledgerDeletionParallelism": 2,
                    "delayBackend": "scheduler", "schedulingTopic": sched, "reconsumeLaterSeconds": 1,
                    "bucketSnapshotHooks": "pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks",
                    "bucketSnapshotDir": str(snap_dir)},
    )
    wcfg.pop("timeoutMs", None)
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)
    writer = LocalRunner(spec, opts).start()
    worker = LocalRunner(spec_from_config(wcfg), opts).start()
    client = quiet_client(broker.service_url)
    store = DirectorySnapshotStorage(snap_dir)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        at = now_ms() + 1500
        for i in range(60):
            dp.send(spec.output, f"s{i}".encode(), at + i)
        assert wait_for(lambda: len(store.list_snapshots()) >= 2, timeout=20), "no snapshots were sealed"
        created = set(store.list_snapshots())
        got = drain(client, spec.output, "check", expect=60, timeout=30)
        assert len({m.data() for m in got}) == 60
        # Released and committed -> exhausted -> request (1 s delay) -> worker deletes them.
        assert wait_for(lambda: not (created & set(store.list_snapshots())), timeout=45), \
            f"still present: {sorted(created & set(store.list_snapshots()))}"
    finally:
        dp.close()
        client.close()
        worker.stop()
        writer.stop()
    # They went through the protocol: one DELAYED_INDEX_BUCKET request per snapshot, owned by the
    # scheduling topic (the engine did not delete them directly).
    audit = quiet_client(broker.service_url)
    try:
        requests = []
        for k in range(2):
            requests += drain(audit, f"persistent://{ns}/{base}-partition-{k}", "audit", expect=100, timeout=2)
    finally:
        audit.close()
    infos = [decode(m.data()) for m in requests]
    assert {i.ledger_id for i in infos} >= created
    assert all(i.ledger_component is LedgerComponent.DELAYED_INDEX_BUCKET for i in infos)
    assert {i.topic_name for i in infos} == {sched.split("://", 1)[1]}
