"""Builders shared by the orphan-audit tests: a small cluster in the local bookie and admin servers."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List

from servers.bookie_http_server import BookieHttpServer, pulsar_metadata
from servers.internal_stats_server import InternalStatsServer

DAY_MS = 24 * 3600 * 1000


def old_ms(days: float = 3.0) -> int:
    """A ctime `days` ago."""
    return int(time.time() * 1000 - days * DAY_MS)


@dataclass
class SmallCluster:
    """Topics with ledgers in metadata (admin server) and storage (bookie server).

    public/default/t: data 10, 11 (in use), cursor ledger 12 (sub `s`), schema 13 (in use);
    orphans in storage only: data 5, cursor 6, schema 7 (all 3 days old);
    unlabelled ledger 3 (no Pulsar metadata); newest known id: 13.
    """

    bookie: BookieHttpServer
    admin: InternalStatsServer
    orphans: Dict[int, str]

    @classmethod
    def build(cls, bookie: BookieHttpServer, admin: InternalStatsServer) -> "SmallCluster":
        topic = "public/default/t"
        admin.set_topic(topic, ledgers=[10, 11], cursors={"s": 12}, schema_ledgers=[13])
        for lid in (10, 11):
            bookie.add_ledger(lid, pulsar_metadata(topic), old_ms())
        bookie.add_ledger(12, pulsar_metadata(topic, cursor="s"), old_ms())
        bookie.add_ledger(13, pulsar_metadata(topic, component="schema"), old_ms())
        bookie.add_ledger(5, pulsar_metadata(topic), old_ms())
        bookie.add_ledger(6, pulsar_metadata(topic, cursor="old-sub"), old_ms())
        bookie.add_ledger(7, pulsar_metadata(topic, component="schema"), old_ms())
        bookie.add_ledger(3, {"application": "something-else"}, old_ms())
        return cls(bookie, admin, {5: "managed-ledger", 6: "managed-cursor", 7: "schema"})


def orphan_ids(report) -> List[int]:
    """Ledger ids of a report's orphan sample."""
    return sorted(int(r["ledger_id"]) for r in report.sample)
