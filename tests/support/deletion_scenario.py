"""A ledger-deletion scenario shared by the worker integration and SIGKILL tests.

Builds topics with ledgers in the local admin (internalStats) and bookie servers, moto S3 and a
filesystem offload directory; runs phase one (LedgerDeletionService + metadata update) and then
checks the protocol's guarantees: no orphans, no in-use ledger deleted, forged requests harmless,
every permanently failing request in the DLQ with its reason."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pulsar

from pulsar_lifecycle.deletion.codec import encode
from pulsar_lifecycle.deletion.model import LedgerType, TopicRef
from pulsar_lifecycle.deletion.service import LedgerDeletionService
from pulsar_lifecycle.deletion.storage.s3 import object_keys
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.deletion.trusted import TrustedLedgerRegistry
from pulsar_lifecycle.timing import DelayedProducer
from servers.bookie_http_server import BookieHttpServer, pulsar_metadata
from servers.internal_stats_server import InternalStatsServer
from support.deletion import S3_CREDS, req, s3_client

UUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
BUCKET = "offload"


@dataclass
class Scenario:
    """Everything the checks need to know about what was set up."""

    topics: DeletionTopics
    admin: InternalStatsServer
    bookie: BookieHttpServer
    s3_endpoint: str
    fs_base: Path
    removed_bk: Dict[int, str] = field(default_factory=dict)  # ledger -> topic, removed from metadata
    removed_s3: Dict[int, str] = field(default_factory=dict)
    removed_fs: Dict[int, str] = field(default_factory=dict)
    in_use_requested: Set[int] = field(default_factory=set)  # requested but still in metadata
    forged: Set[int] = field(default_factory=set)
    poison: Set[int] = field(default_factory=set)
    malformed: int = 0

    @property
    def expected_dlq(self) -> int:
        return len(self.in_use_requested) + len(self.forged) + len(self.poison) + self.malformed

    def user_config(self, **extra: object) -> Dict[str, object]:
        cfg: Dict[str, object] = {
            "deletionNamespace": self.topics.namespace,
            "deletionTopicName": self.topics.topic_name,
            "ledgerDeletionParallelism": self.topics.parallelism,
            "delayBackend": "broker",  # the embedded broker delivers deliver_at messages at once
            "reconsumeLaterSeconds": 0,
            "maxRedeliverCount": 20,  # 30% of storage calls fail: leave room for unlucky streaks
            "pulsarAdminUrl": self.admin.url,
            "bookieHttpUrls": [self.bookie.url],
            "s3EndpointUrl": self.s3_endpoint,
            "s3Region": "us-east-1",
            "s3Bucket": BUCKET,
            "s3AccessKeyIdSecret": "s3-access-key",
            "s3SecretAccessKeySecret": "s3-secret-key",
            "fileSystemBasePath": str(self.fs_base),
        }
        cfg.update(extra)
        return cfg

    secrets = {"s3-access-key": S3_CREDS["aws_access_key_id"], "s3-secret-key": S3_CREDS["aws_secret_access_key"]}

    # -- checks --------------------------------------------------------------------------------
    def s3_keys(self) -> Set[str]:
        c = s3_client(self.s3_endpoint)
        keys: Set[str] = set()
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            keys |= {o["Key"] for o in page.get("Contents", [])}
        return keys

    def fs_exists(self, ledger: int, topic: str) -> bool:
        return (self.fs_base / TopicRef.parse(topic).managed_ledger_name / f"{ledger}-{UUID}").exists()

    def orphans(self) -> Set[int]:
        """Ledgers removed from metadata that are still in storage (poison ones excluded)."""
        keys = self.s3_keys()
        left = {l for l in self.removed_bk if self.bookie.exists(l)}
        left |= {l for l in self.removed_s3 if set(object_keys(UUID, l)) & keys}
        left |= {l for l, t in self.removed_fs.items() if self.fs_exists(l, t)}
        return left - self.poison

    def deleted_in_use(self) -> Set[int]:
        in_use: Set[int] = set()
        for t in list(self.admin.topics):
            in_use |= self.admin.in_use(t)
        return set(self.bookie.deleted) & in_use


def build(topics: DeletionTopics, admin: InternalStatsServer, bookie: BookieHttpServer, s3_endpoint: str,
          fs_base: Path, n_topics: int = 5, per_topic: int = 20, delete_per_topic: int = 15) -> Scenario:
    """Create topics, ledgers and offloaded objects; nothing sent yet."""
    sc = Scenario(topics, admin, bookie, s3_endpoint, fs_base)
    s3 = s3_client(s3_endpoint)
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for k in range(n_topics):
        topic = f"public/default/del-{topics.topic_name}-{k}-partition-0"
        base = 100_000 * (k + 1)
        ids = [base + i for i in range(per_topic)]
        cursor_ledger = base + 99_000  # the newest ledger of the topic: ids below it are not "stale"
        admin.set_topic(topic, ledgers=ids, cursors={"sub": cursor_ledger})
        for lid in ids:
            bookie.add_ledger(lid, pulsar_metadata(topic))
        bookie.add_ledger(cursor_ledger, pulsar_metadata(topic, cursor="sub"))
    victim = f"public/default/del-{topics.topic_name}-victim-partition-0"
    admin.set_topic(victim, ledgers=[150_000, 150_001, 150_002, 999_999_999])
    for lid in admin.topics[victim].ledgers:
        bookie.add_ledger(lid, pulsar_metadata(victim))
    # Offloaded ledgers (ids below each topic's current ledger, as in real topics).
    t2 = f"public/default/del-{topics.topic_name}-2-partition-0"
    ml = TopicRef.parse(t2).managed_ledger_name
    for lid in range(300_050, 300_055):
        admin.add_ledger(t2, lid)
        for key in object_keys(UUID, lid):
            s3.put_object(Bucket=BUCKET, Key=key, Body=b"x", Metadata={"ManagedLedgerName": ml})
    t3 = f"public/default/del-{topics.topic_name}-3-partition-0"
    for lid in range(400_050, 400_052):
        admin.add_ledger(t3, lid)
        d = fs_base / TopicRef.parse(t3).managed_ledger_name / f"{lid}-{UUID}"
        d.mkdir(parents=True)
        (d / "data").write_bytes(b"x")
    return sc


def phase_one(sc: Scenario, client: pulsar.Client, delete_per_topic: int = 15) -> None:
    """Send every request (append, THEN metadata update, as the protocol requires)."""
    delayed = DelayedProducer(client, backend="broker")
    service = LedgerDeletionService(client, sc.topics, delayed, send_delay_seconds=1, trusted=TrustedLedgerRegistry())
    prefix = f"public/default/del-{sc.topics.topic_name}-"
    try:
        for topic in sorted(t for t in sc.admin.topics if t.startswith(prefix) and "victim" not in t):
            ledgers = list(sc.admin.topics[topic].ledgers)
            bk = [l for l in ledgers if l % 100_000 < 50][:delete_per_topic]
            for lid in bk:
                service.append(req(topic, lid))
                sc.admin.remove_ledger(topic, lid)
                sc.removed_bk[lid] = topic
            # Case 1 of the seed: request sent, metadata update never happened.
            still = ledgers[delete_per_topic]
            service.append(req(topic, still))
            sc.in_use_requested.add(still)
            for lid in [l for l in ledgers if 300_050 <= l < 300_055]:
                service.append(req(topic, lid, ltype=LedgerType.OFFLOAD_LEDGER, uuid=UUID, driver="aws-s3"))
                sc.admin.remove_ledger(topic, lid)
                sc.removed_s3[lid] = topic
            for lid in [l for l in ledgers if 400_050 <= l < 400_052]:
                service.append(req(topic, lid, ltype=LedgerType.OFFLOAD_LEDGER, uuid=UUID, driver="filesystem"))
                sc.admin.remove_ledger(topic, lid)
                sc.removed_fs[lid] = topic
        # Forged: topic 0 claims the victim's ledgers (not in topic 0's metadata, below its max).
        t0 = f"{prefix}0-partition-0"
        victim = f"{prefix}victim-partition-0"
        for lid in sc.admin.topics[victim].ledgers[:3]:
            service.append(req(t0, lid))
            sc.forged.add(lid)
        # Permanently failing: the bookie answers 500 for these, whatever we do.
        t1 = f"{prefix}1-partition-0"
        for lid in (200_000 + delete_per_topic + 1, 200_000 + delete_per_topic + 2):
            sc.bookie.poisoned.add(lid)
            service.append(req(t1, lid))
            sc.admin.remove_ledger(t1, lid)
            sc.removed_bk[lid] = t1
            sc.poison.add(lid)
        prod = client.create_producer(sc.topics.deletion_partition(0), batching_enabled=False)
        prod.send(b"\x08not-avro")
        prod.close()
        sc.malformed = 1
    finally:
        service.close()
        delayed.close()


def collect_dlq(client: pulsar.Client, sc: Scenario, until: float, done: "callable") -> List[pulsar.Message]:
    """Read the DLQ until `done(messages)` or the deadline (bounded)."""
    consumer = client.subscribe(sc.topics.dlq_topic(), "test-check", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    got: Dict[str, pulsar.Message] = {}
    try:
        while time.monotonic() < until:
            try:
                m = consumer.receive(timeout_millis=200)
                got[str(m.message_id())] = m
                consumer.acknowledge(m)
            except pulsar.Timeout:
                pass
            if done(list(got.values())):
                break
    finally:
        consumer.close()
    return list(got.values())


def dlq_by_ledger(msgs: List[pulsar.Message]) -> Tuple[Dict[int, str], List[str]]:
    """ledger id -> reason, plus reasons of undecodable messages."""
    from pulsar_lifecycle.deletion.codec import decode
    from pulsar_lifecycle.deletion.model import InvalidRequestError

    out: Dict[int, str] = {}
    bad: List[str] = []
    for m in msgs:
        reason = (m.properties() or {}).get("REASON", "")
        try:
            out[decode(m.data()).ledger_id] = reason
        except InvalidRequestError:
            bad.append(reason)
    return out, bad


__all__ = ["Scenario", "build", "phase_one", "collect_dlq", "dlq_by_ledger", "encode"]
