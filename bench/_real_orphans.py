"""Orphan ledgers on a real Apache Pulsar standalone, for the deletion benchmark's real-storage mode.

PIP-186's orphan, made as tests/integration/test_deletion_real_pulsar.py makes it: topics whose
ledgers roll every 5 entries are written while a subscription holds them; a child znode under each
full ledger's ZooKeeper node makes its delete fail (support/zookeeper.py); the subscription is
removed and the topic trimmed, so the broker's metadata forgets the ledgers while the broker's
deletes fail; then the child znodes go. The ledgers are then in no metadata and still on the
bookie, which is what the deletion worker exists for.

The broker retries a failed data-ledger delete a minute after the trim (three times, 60 s apart),
so a benchmark measures each set right after it is made and counts those the broker deleted before
the contender got to them.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import List, Tuple

import pulsar
import requests

from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.model import TopicRef
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from support.helpers import publish_all
from support.rolling import ENTRIES_PER_LEDGER
from support.zookeeper import ZooKeeperClient, ledger_znode

BLOCK = "pl-bench-block-delete"


@dataclass
class Orphans:
    """Ledgers (topic short name, ledger id) in no metadata and still on the bookie."""

    work: List[Tuple[str, int]]
    made_at: float  # time.monotonic() when the last block was lifted

    def ids(self) -> List[int]:
        return [lid for _t, lid in self.work]


def _ledger_ids(admin: PulsarAdminClient, topic: TopicRef) -> List[int]:
    stats = admin.internal_stats(topic)
    return [int(item["ledgerId"]) for item in (stats or {}).get("ledgers", [])]


def make_orphans(p: PulsarStandalone, n: int, topics: int, tag: str, timeout_s: float = 120) -> Orphans:
    """`n` orphan ledgers spread over `topics` topics of `p` (which runs with ROLLING)."""
    per = math.ceil(n / topics)
    admin = PulsarAdminClient.connect([p.admin_url])
    bookie = BookieHttpClient.connect([p.bookie_http_url])
    client = quiet_client(p.service_url)
    refs = [TopicRef.parse(f"public/default/orphans-{tag}-{t}") for t in range(topics)]
    holds = []
    try:
        for ref in refs:
            holds.append(client.subscribe(ref.full_name, "hold", consumer_type=pulsar.ConsumerType.Shared,
                                          receiver_queue_size=1))
            prod = client.create_producer(ref.full_name, batching_enabled=False)
            publish_all(prod, [b"x"] * (ENTRIES_PER_LEDGER * per + 1))  # `per` full ledgers and a current one
            prod.close()
        chosen = {ref.short_name: _ledger_ids(admin, ref)[:per] for ref in refs}
        work = [(t, lid) for t, ids in chosen.items() for lid in ids][:n]
        if len(work) < n:
            raise RuntimeError(f"made {len(work)} full ledgers, wanted {n}: did the standalone run with ROLLING?")
        with ZooKeeperClient(p.host, p.ports["zookeeper"]) as zk:
            blocks = [ledger_znode(zk, lid) + "/" + BLOCK for _t, lid in work]
            for path in blocks:
                zk.create(path)
            for ref, hold in zip(refs, holds):
                hold.close()
                r = requests.delete(f"{p.admin_url}/admin/v2/persistent/{ref.short_name}/subscription/hold", timeout=30)
                r.raise_for_status()
                requests.post(f"{p.admin_url}/admin/v2/persistent/{ref.short_name}/trim", timeout=30)
            wanted = {lid for _t, lid in work}
            deadline = time.monotonic() + timeout_s
            while any(wanted & set(_ledger_ids(admin, ref)) for ref in refs):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the broker did not trim the {n} ledgers within {timeout_s}s")
                time.sleep(0.2)
            for path in blocks:
                zk.delete(path)
        missing = wanted - bookie.list_ledger_ids()
        if missing:
            raise RuntimeError(f"{len(missing)} of the {n} ledgers left the bookie while blocked")
        return Orphans(work, time.monotonic())
    finally:
        client.close()
        admin.close()
        bookie.endpoints.close()

