"""Two-phase ledger deletion against a real Apache Pulsar standalone: its admin REST API, its
bookie's HTTP admin API and ledgers its topics wrote.

Real Pulsar 4.0 deletes the ledgers it trims itself, right after the metadata update; PIP-186 is
about the deletes that get lost on the way. A child znode under a ledger's ZooKeeper node makes
every delete of that ledger fail (support/zookeeper.py), so the broker's own delete is lost
exactly as in the PIP's orphan case: the metadata forgot the ledger, the bookie still has it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Set

import pulsar
import pytest
import requests
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.exceptions import LedgerMissing
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType, PendingDeleteLedgerInfo, TopicRef
from pulsar_lifecycle.deletion.operator import list_dlq
from pulsar_lifecycle.deletion.ports import DeleteResult, OwnershipStatus
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient, BookieLedgerStorage
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.runtime.client import quiet_client
from servers.bookie_http_server import BookieHttpServer, pulsar_metadata
from servers.internal_stats_server import InternalStatsServer
from support.broker_fixtures import broker_kinds
from support.helpers import publish_all, stop_process, wait_for
from support.paths import REPO
from support.rolling import ROLLING
from support.zookeeper import ZooKeeperClient, established_connections_to, ledger_znode

# pulsar_only says why; skipif keeps a TEST_BROKERS run without real Pulsar from starting one.
pytestmark = [pytest.mark.integration, pytest.mark.pulsar_only("needs the admin REST API and a bookie"),
              pytest.mark.skipif("pulsar" not in broker_kinds(), reason="not on lite: needs the admin REST API and a bookie")]

BLOCK = "pl-block-delete"


def _ids(stats: Dict) -> List[int]:
    return [int(item["ledgerId"]) for item in stats["ledgers"]]


def _cursor_ledgers(stats: Dict) -> Dict[str, int]:
    return {name: int(c["cursorLedger"]) for name, c in stats["cursors"].items()}


def _request(topic: str, ledger_id: int, component: LedgerComponent = LedgerComponent.MANAGED_LEDGER,
             cursor: str = "") -> PendingDeleteLedgerInfo:
    return PendingDeleteLedgerInfo(topic, component, LedgerType.LEDGER, ledger_id,
                                   properties={"cursor": cursor} if cursor else {})


def _wait_cursor_ledgers(admin: PulsarAdminClient, topic: TopicRef, subs: Set[str]) -> Dict:
    """internalStats once every subscription in `subs` has persisted its position into a cursor ledger."""
    holder: Dict = {}

    def ready() -> bool:
        holder["stats"] = admin.internal_stats(topic)
        return all(_cursor_ledgers(holder["stats"]).get(s, -1) >= 0 for s in subs)

    assert wait_for(ready, timeout=60, interval=0.5), holder.get("stats")
    return holder["stats"]


def _keys(d: Dict) -> Set[str]:
    return set(d)


def test_adapters_read_what_real_pulsar_answers(pulsar_broker, unique):
    """internalStats, partitioned-internalStats, ledger metadata and its custom keys as the real
    broker and bookie give them; the stand-ins in tests/servers answer with the same shapes."""
    p = pulsar_broker
    admin = PulsarAdminClient.connect([p.admin_url])
    bookie = BookieHttpClient.connect([p.bookie_http_url])
    storage = BookieLedgerStorage(bookie)
    plain = TopicRef.parse(f"public/default/adapt-{unique}")
    other = TopicRef.parse(f"public/default/adapt-other-{unique}")
    parted = TopicRef.parse(f"public/default/adapt-parted-{unique}")
    client = quiet_client(p.service_url)
    try:
        consumer = client.subscribe(plain.full_name, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                    schema=pulsar.schema.StringSchema())
        producer = client.create_producer(plain.full_name, schema=pulsar.schema.StringSchema())
        for i in range(3):
            producer.send(f"m{i}")
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        client.create_producer(other.full_name).send(b"x")
        assert admin.create_partitioned_topic(parted, 2) is True
        assert admin.create_partitioned_topic(parted, 2) is False  # 409: already there
        pprod = client.create_producer(parted.full_name, schema=pulsar.schema.StringSchema())
        for i in range(4):
            pprod.send(f"p{i}")
        stats = _wait_cursor_ledgers(admin, plain, {"sub"})
    finally:
        client.close()

    data, cursor = _ids(stats), _cursor_ledgers(stats)["sub"]
    schema = [int(s["ledgerId"]) for s in stats["schemaLedgers"]]
    assert len(schema) == 1 and stats["compactedLedger"]["ledgerId"] == -1
    assert admin.in_use_ledger_ids(plain) == set(data) | {cursor} | set(schema)
    part0 = admin.internal_stats(TopicRef.parse(f"{parted.short_name}-partition-0"))
    pstats = admin.partitioned_internal_stats(parted)
    assert pstats is not None and pstats["metadata"]["partitions"] == 2
    assert admin.internal_stats(parted) is None  # a partitioned base name has no internalStats of its own
    union = admin.in_use_ledger_ids(parted)
    assert union is not None and set(_ids(part0)) <= union
    assert admin.in_use_ledger_ids(TopicRef.parse(f"public/default/never-{unique}")) is None

    # The keys the broker writes into each kind of ledger, and what the ownership rule makes of them.
    assert bookie.custom_metadata(data[0]) == {"application": "pulsar", "component": "managed-ledger",
                                               "pulsar/managed-ledger": plain.managed_ledger_name}
    assert bookie.custom_metadata(cursor) == {"application": "pulsar", "component": "managed-ledger",
                                              "pulsar/managed-ledger": plain.managed_ledger_name, "pulsar/cursor": "sub"}
    assert bookie.custom_metadata(schema[0]) == {"application": "pulsar", "component": "schema",
                                                 "pulsar/schemaId": plain.short_name}
    match, mismatch = OwnershipStatus.MATCH, OwnershipStatus.MISMATCH
    assert storage.check_owner(_request(plain.short_name, data[0])).status is match
    assert storage.check_owner(_request(other.short_name, data[0])).status is mismatch
    assert storage.check_owner(_request(plain.short_name, cursor, LedgerComponent.MANAGED_CURSOR, "sub")).status is match
    assert storage.check_owner(_request(plain.short_name, cursor, LedgerComponent.MANAGED_CURSOR, "s2")).status is mismatch
    assert storage.check_owner(_request(plain.short_name, cursor)).status is mismatch  # a cursor ledger is no data ledger
    assert storage.check_owner(_request(plain.short_name, schema[0], LedgerComponent.SCHEMA_STORAGE)).status is match
    pschema = [int(s["ledgerId"]) for s in part0["schemaLedgers"]]
    assert storage.check_owner(_request(f"{parted.short_name}-partition-1", pschema[0],
                                        LedgerComponent.SCHEMA_STORAGE)).status is match  # schema id: the base name
    missing = max(bookie.list_ledger_ids()) + 1_000_000
    with pytest.raises(LedgerMissing):
        bookie.metadata(missing)  # the bookie answers 500; absent from the list means gone
    assert storage.check_owner(_request(plain.short_name, missing)).status is OwnershipStatus.GONE

    # The stand-ins answer with the same field names.
    with InternalStatsServer() as fake_admin, BookieHttpServer() as fake_bookie:
        fake_admin.set_topic("public/default/t", ledgers=[1, 2], cursors={"sub": 3}, schema_ledgers=[4])
        fake_admin.set_partitioned("public/default/pt", 2)
        fake_bookie.add_ledger(1, pulsar_metadata("public/default/t"))
        fstats = requests.get(f"{fake_admin.url}/admin/v2/persistent/public/default/t/internalStats", timeout=10).json()
        fparted = requests.get(f"{fake_admin.url}/admin/v2/persistent/public/default/pt/partitioned-internalStats",
                               timeout=10).json()
        fmd = requests.get(f"{fake_bookie.url}/api/v1/ledger/metadata", params={"ledger_id": 1}, timeout=10).json()["1"]
        real_md = requests.get(f"{p.bookie_http_url}/api/v1/ledger/metadata", params={"ledger_id": data[0]},
                               timeout=10).json()[str(data[0])]
    assert _keys(fstats) == _keys(stats)
    assert _keys(fstats["cursors"]["sub"]) == _keys(stats["cursors"]["sub"])
    assert _keys(fstats["ledgers"][0]) == _keys(stats["ledgers"][0])
    assert _keys(fstats["compactedLedger"]) == _keys(stats["compactedLedger"])
    assert _keys(fparted) == _keys(pstats) and _keys(fparted["metadata"]) == _keys(pstats["metadata"])
    # A JSON object's keys: their order (and, with the ledger's state, which are present) varies
    # between answers; the stand-in gives every key the bookie gives, and those the worker reads.
    assert set(real_md) <= set(fmd), f"keys the bookie gives and the stand-in lacks: {set(real_md) - set(fmd)}"
    assert {"ledgerId", "state", "customMetadata", "allEnsembles"} <= set(real_md)
    assert _keys(fmd["allEnsembles"]["0"][0]) == _keys(real_md["allEnsembles"]["0"][0])
    admin.close()
    bookie.endpoints.close()


def test_the_bookie_http_delete_leaves_a_zookeeper_session_open_per_call(pulsar_broker):
    """What docs/deletion.md warns of: the bookie's DELETE /api/v1/ledger/delete builds a BookKeeper
    client per call and never closes it (BookKeeper's DeleteLedgerService, in the BookKeeper that
    Pulsar 4.0 ships), so every call leaves one more ZooKeeper session open in the bookie until
    ZooKeeper's per-host connection limit stops that bookie's HTTP API. Ledger ids nobody has are
    used: the client is built before the delete is tried. When a Pulsar upgrade fixes this, this
    test fails and the docs' warning is to go."""
    p = pulsar_broker
    bookie = BookieHttpClient.connect([p.bookie_http_url])
    zk_port = p.ports["zookeeper"]
    absent = max(bookie.list_ledger_ids() | {0}) + 5_000_000
    calls = 30
    before = established_connections_to(zk_port)
    for i in range(calls):
        # This bookie answers 200 for a ledger it never had; either answer means gone.
        assert bookie.delete(absent + i) in (DeleteResult.DELETED, DeleteResult.NOT_FOUND)
    time.sleep(1.0)  # a session that was going to close has closed by now
    left_open = established_connections_to(zk_port) - before
    bookie.endpoints.close()
    assert left_open >= calls - 5, f"{left_open} ZooKeeper connections more after {calls} bookie HTTP deletes"


# -- the worker through `pulsar-lifecycle localrun` ---------------------------------------------

def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pulsar_lifecycle.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _topic_options(topics: DeletionTopics) -> List[str]:
    return ["--namespace", topics.namespace, "--topic-name", topics.topic_name,
            "--parallelism", str(topics.parallelism)]


def _worker_config(tmp_path: Path, topics: DeletionTopics, p) -> Path:
    cfg = load_function_config(REPO / "function-configs" / "ledger-deletion-worker.yaml")
    cfg.update(inputs=topics.input_topics(), parallelism=1, subName=f"worker-{topics.topic_name}", userConfig={
        "deletionNamespace": topics.namespace,
        "deletionTopicName": topics.topic_name,
        "ledgerDeletionParallelism": topics.parallelism,
        "delayBackend": "broker",  # real Pulsar delivers deliver_at messages on time
        "reconsumeLaterSeconds": 1,
        "maxRedeliverCount": 3,
        "ledgersCacheTtlSeconds": 1,
        "pulsarAdminUrl": p.admin_url,
        "bookieHttpUrls": [p.bookie_http_url],
    })
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _localrun(config: Path, p, log: Path) -> "subprocess.Popen[bytes]":
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "functions"), env.get("PYTHONPATH", "")])
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "INFO", "localrun",
             "--function-config-file", str(config), "--broker-service-url", p.service_url,
             "--data-dir", str(log.parent / "run")],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env)


def _outcomes(log_text: str) -> Dict[int, str]:
    """ledger id -> the worker's last word on it ("deleted" or "already gone"), from its log lines."""
    out: Dict[int, str] = {}
    for m in re.finditer(r"(deleted|already gone) topic=\S+ ledger=(\d+)", log_text):
        out[int(m.group(2))] = m.group(1)
    return out


def test_worker_deletes_lost_ledgers_keeps_live_ones_and_refuses_forged(pulsar_factory, tmp_path, unique):
    p = pulsar_factory(config=ROLLING)
    admin = PulsarAdminClient.connect([p.admin_url])
    bookie = BookieHttpClient.connect([p.bookie_http_url])
    topics = DeletionTopics(namespace="public/default", topic_name=f"__ledger_deletion_{unique.replace('-', '_')}",
                            parallelism=2)
    victim = TopicRef.parse(f"public/default/victim-{unique}")
    topic = TopicRef.parse(f"public/default/rolling-{unique}")
    client = quiet_client(p.service_url)
    log = tmp_path / "worker.log"
    proc = None
    try:
        # The victim first: its ledgers are older than the topic's, so a forged claim on one is below
        # the topic's newest ledger (not "stale") and reaches the ownership check.
        # A subscription that reads nothing: without one the broker trims every full ledger at once.
        client.subscribe(victim.full_name, "hold", consumer_type=pulsar.ConsumerType.Shared)
        publish_all(client.create_producer(victim.full_name, batching_enabled=False), [b"v"] * 10)
        victim_ledgers = _ids(admin.internal_stats(victim))
        keep = client.subscribe(topic.full_name, "keep", consumer_type=pulsar.ConsumerType.Shared)
        gone = client.subscribe(topic.full_name, "gone", consumer_type=pulsar.ConsumerType.Shared)
        prod = client.create_producer(topic.full_name, batching_enabled=False)
        publish_all(prod, [f"m{i}".encode() for i in range(30)])  # ledgers of 5 entries
        for _ in range(20):  # "keep" is done with the first four ledgers
            keep.acknowledge(keep.receive(timeout_millis=10_000))
        for _ in range(2):  # "gone" still needs the first: nothing is trimmed yet
            gone.acknowledge(gone.receive(timeout_millis=10_000))
        stats = _wait_cursor_ledgers(admin, topic, {"keep", "gone"})
        data = _ids(stats)
        assert len(data) >= 7, data
        cursors = _cursor_ledgers(stats)

        # Phase one, before the metadata forgets anything: every ledger of the topic, and a forged
        # request naming a live ledger of the victim.
        res = _cli("deletion", "enqueue-topic", "--service-url", p.service_url, "--admin-url", p.admin_url,
                   "--topic", topic.short_name, "--send-delay-seconds", "0", *_topic_options(topics))
        assert res.returncode == 0, res.stderr[-2000:]
        enqueued = {json.loads(line)["ledgerId"] for line in res.stdout.splitlines()}
        assert enqueued == set(data) | set(cursors.values())
        forged = victim_ledgers[0]
        res = _cli("deletion", "enqueue", "--service-url", p.service_url, "--topic", topic.short_name,
                   "--ledger-id", str(forged), "--send-delay-seconds", "0", *_topic_options(topics))
        assert res.returncode == 0, res.stderr[-2000:]

        # The broker's deletes of the first two data ledgers and of "gone"'s cursor ledger will fail.
        lost = {data[0], data[1], cursors["gone"]}
        zk = ZooKeeperClient(p.host, p.ports["zookeeper"])
        blocks = [ledger_znode(zk, lid) + "/" + BLOCK for lid in sorted(lost)]
        for path in blocks:
            zk.create(path)
        # The metadata forgets: "gone" is unsubscribed (its cursor ledger leaves the metadata), and
        # the first four ledgers, consumed by every subscription left, are trimmed.
        gone.close()
        r = requests.delete(f"{p.admin_url}/admin/v2/persistent/{topic.short_name}/subscription/gone", timeout=30)
        assert r.status_code == 204, r.text
        requests.post(f"{p.admin_url}/admin/v2/persistent/{topic.short_name}/trim", timeout=30)
        assert wait_for(lambda: not set(data[:3]) & set(_ids(admin.internal_stats(topic))), timeout=60, interval=0.5)
        trimmed = set(data) - set(_ids(admin.internal_stats(topic)))
        assert set(data[:3]) <= trimmed and not trimmed & set(data[4:]), (data, trimmed)
        assert wait_for(lambda: not (trimmed - lost) & bookie.list_ledger_ids(), timeout=30, interval=0.5)
        for path in blocks:
            zk.delete(path)
        zk.close()
        assert lost <= bookie.list_ledger_ids()  # orphans: in no metadata, still in the bookie
        # The topic goes on writing until its newest ledger is above the orphaned cursor ledger (a
        # loaded broker may roll over later than after the first 5 entries).
        holder_live: Dict[str, Set[int]] = {}
        sent_n: List[str] = []

        def rolled_past_cursor() -> bool:
            batch = [f"n{len(sent_n) + i}" for i in range(5)]
            publish_all(prod, [b.encode() for b in batch])
            sent_n.extend(batch)
            holder_live["live"] = admin.in_use_ledger_ids(topic) or set()
            return bool(holder_live["live"]) and max(holder_live["live"]) > cursors["gone"]

        assert wait_for(rolled_past_cursor, timeout=60, interval=0.5), (holder_live, cursors)
        live = holder_live["live"]
        requested_live = (set(data) | {cursors["keep"]}) & live

        # Phase two: the worker, through the CLI's localrun.
        proc = _localrun(_worker_config(tmp_path, topics, p), p, log)
        assert wait_for(lambda: not lost & bookie.list_ledger_ids(), timeout=180, interval=1), log.read_text()[-3000:]
        want_dlq = requested_live | {forged}
        holder: Dict = {}

        def dead_letters_in() -> bool:
            holder["dlq"] = {e.ledger_id: e for e in list_dlq(client, topics, idle_timeout_s=1.0)}
            return want_dlq <= set(holder["dlq"])

        assert wait_for(dead_letters_in, timeout=180, interval=2), (sorted(holder.get("dlq", {})), log.read_text()[-3000:])
    finally:
        if proc is not None:
            stop_process(proc)
    dlq = holder["dlq"]
    outcomes = _outcomes(log.read_text())
    listed = bookie.list_ledger_ids()
    # Lost deletes are done now, through both phases: in no metadata and not in the bookie either.
    assert not lost & listed
    for lid in lost:
        with pytest.raises(LedgerMissing):
            bookie.metadata(lid)
    # The cursor ledger was the broker's one try (it never retries those): the worker deleted it.
    # A trimmed data ledger is retried by the broker a minute later, so either may come first.
    assert outcomes[cursors["gone"]] == "deleted", outcomes
    assert {outcomes[lid] for lid in lost} <= {"deleted", "already gone"}
    # Ledgers the broker did delete are acknowledged as already gone.
    assert all(outcomes.get(lid) == "already gone" for lid in trimmed - lost), outcomes
    # Live ledgers survive, retried until the DLQ says why; so does the victim's.
    assert requested_live <= listed and set(victim_ledgers) <= listed
    for lid in requested_live:
        assert dlq[lid].outcome == "IN_USE" and "still in use" in dlq[lid].reason, dlq[lid]
    assert dlq[forged].outcome == "OWNER_MISMATCH", dlq[forged]
    assert victim.managed_ledger_name in dlq[forged].reason and forged not in outcomes
    assert set(dlq) == want_dlq
    # The topic still reads: everything "keep" has not consumed yet is there.
    rest = []
    try:
        while True:
            m = keep.receive(timeout_millis=3000)
            rest.append(m.data().decode())
            keep.acknowledge(m)
    except pulsar.Timeout:
        pass
    client.close()
    admin.close()
    assert sorted(rest) == sorted([f"m{i}" for i in range(20, 30)] + sent_n)
