"""A local Pulsar admin REST server speaking the internalStats JSON (reference §6).

Field names, 404 reasons and the partitioned shape are those of an Apache Pulsar 4.0.0 broker
(tests/integration/test_deletion_real_pulsar.py compares them with a real standalone's).

Endpoints (same paths as the broker's PersistentTopics v2 resource):
  GET /admin/v2/persistent/{tenant}/{ns}/{topic}/internalStats            -> PersistentTopicInternalStats
  GET /admin/v2/persistent/{tenant}/{ns}/{topic}/partitioned-internalStats -> PartitionedTopicInternalStats
  PUT /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions  (body: N)      -> 204, 409 if it exists
  GET /admin/v2/tenants, /admin/v2/namespaces/{tenant}, /admin/v2/persistent/{tenant}/{ns}
       (topic list: partitions of partitioned topics and non-partitioned topics, as full names)
Unknown topics answer 404 like the broker. Topic state is set from Python by the test, which plays
the broker's metadata side (add a ledger, remove it from metadata, delete the topic)."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple
from urllib.parse import unquote_plus

from ._deletion_http_base import LocalHttpServer

PREFIX = "/admin/v2/persistent/"


@dataclass
class TopicLedgers:
    """The parts of a managed ledger that internalStats reports."""

    ledgers: List[int] = field(default_factory=list)
    cursors: Dict[str, int] = field(default_factory=dict)  # subscription -> cursorLedger (-1: none)
    schema_ledgers: List[int] = field(default_factory=list)
    compacted_ledger: int = -1

    def internal_stats(self) -> Dict[str, Any]:
        """PersistentTopicInternalStats JSON with the broker's field names."""
        led = lambda i: {"ledgerId": i, "entries": 10, "size": 1024, "offloaded": False, "underReplicated": False}  # noqa: E731
        last = self.ledgers[-1] if self.ledgers else -1
        return {
            "entriesAddedCounter": 10 * len(self.ledgers),
            "numberOfEntries": 10 * len(self.ledgers),
            "totalSize": 1024 * len(self.ledgers),
            "currentLedgerEntries": 10,
            "currentLedgerSize": 1024,
            "lastLedgerCreatedTimestamp": "2026-01-01T00:00:00Z",
            "waitingCursorsCount": 0,
            "pendingAddEntriesCount": 0,
            "lastConfirmedEntry": f"{last}:9",
            "state": "LedgerOpened",
            "ledgers": [led(i) for i in self.ledgers],
            "cursors": {
                name: {
                    "markDeletePosition": f"{last}:9",
                    "readPosition": f"{last}:10",
                    "waitingReadOp": False,
                    "pendingReadOps": 0,
                    "messagesConsumedCounter": 0,
                    "cursorLedger": cl,
                    "cursorLedgerLastEntry": 0,
                    "individuallyDeletedMessages": "[]",
                    "lastLedgerSwitchTimestamp": "2026-01-01T00:00:00Z",
                    "state": "Open",
                    "active": True,
                    "numberOfEntriesSinceFirstNotAckedMessage": 1,
                    "totalNonContiguousDeletedMessagesRange": 0,
                    "subscriptionHavePendingRead": False,
                    "subscriptionHavePendingReplayRead": False,
                    "properties": {},
                }
                for name, cl in self.cursors.items()
            },
            "schemaLedgers": [led(i) for i in self.schema_ledgers],
            "compactedLedger": {"ledgerId": self.compacted_ledger, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False},
        }

    def all_ids(self) -> set:
        """Every id the topic references."""
        ids = set(self.ledgers) | set(self.schema_ledgers) | {c for c in self.cursors.values() if c >= 0}
        if self.compacted_ledger >= 0:
            ids.add(self.compacted_ledger)
        return ids


class InternalStatsServer(LocalHttpServer):
    """The admin REST subset; `calls` counts requests per (topic, endpoint)."""

    def __init__(self, fail_rate: float = 0.0, seed: int = 0, latency_s: float = 0.0) -> None:
        super().__init__(fail_rate, seed)
        self.topics: Dict[str, TopicLedgers] = {}
        self.partitioned: Dict[str, int] = {}
        self.calls: Counter = Counter()
        self.latency_s = latency_s
        self.request_times: List[float] = []  # monotonic time of every admin request
        self.fail_topics: set = set()  # topics whose internalStats answers 500

    # -- the test's side (plays the broker's metadata) ------------------------------------------
    @staticmethod
    def _key(topic: str) -> str:
        return topic.split("://", 1)[-1]

    def set_topic(self, topic: str, ledgers: Iterable[int] = (), cursors: Optional[Dict[str, int]] = None,
                  schema_ledgers: Iterable[int] = (), compacted_ledger: int = -1) -> None:
        """Create or replace a topic's ledger lists."""
        with self.lock:
            self.topics[self._key(topic)] = TopicLedgers(list(ledgers), dict(cursors or {}), list(schema_ledgers), compacted_ledger)

    def set_partitioned(self, topic: str, partitions: int) -> None:
        """Declare `topic` partitioned; its partitions are the topics `<topic>-partition-<k>`."""
        with self.lock:
            self.partitioned[self._key(topic)] = partitions

    def remove_ledger(self, topic: str, ledger_id: int) -> None:
        """The metadata update of phase one: the ledger leaves the topic's metadata."""
        with self.lock:
            t = self.topics[self._key(topic)]
            t.ledgers = [i for i in t.ledgers if i != ledger_id]
            t.schema_ledgers = [i for i in t.schema_ledgers if i != ledger_id]
            t.cursors = {k: (-1 if v == ledger_id else v) for k, v in t.cursors.items()}

    def add_ledger(self, topic: str, ledger_id: int) -> None:
        """A ledger roll-over: a new data ledger joins the topic."""
        with self.lock:
            self.topics[self._key(topic)].ledgers.append(ledger_id)

    def delete_topic(self, topic: str) -> None:
        """The topic is gone (internalStats answers 404)."""
        with self.lock:
            self.topics.pop(self._key(topic), None)

    def in_use(self, topic: str) -> set:
        """Ids the topic references now."""
        with self.lock:
            t = self.topics.get(self._key(topic))
            return t.all_ids() if t else set()

    def calls_for(self, topic: str, endpoint: str = "internalStats") -> int:
        """How many times `endpoint` was asked about `topic`."""
        with self.lock:
            return self.calls[(self._key(topic), endpoint)]

    # -- HTTP ----------------------------------------------------------------------------------
    def _namespaces(self) -> Dict[str, List[str]]:
        """namespace -> full topic names (partitions of partitioned topics included)."""
        out: Dict[str, List[str]] = {}
        for name in list(self.topics) + [f"{b}-partition-{k}" for b, n in self.partitioned.items() for k in range(n)]:
            tenant, ns, _ = name.split("/", 2)
            full = f"persistent://{name}"
            lst = out.setdefault(f"{tenant}/{ns}", [])
            if full not in lst:
                lst.append(full)
        return out

    def route(self, method: str, path: str, params: Dict[str, str], body: bytes) -> Tuple[int, Any]:
        import time

        with self.lock:
            self.request_times.append(time.monotonic())
        if method == "GET" and path == "/admin/v2/tenants":
            with self.lock:
                return 200, sorted({ns.split("/")[0] for ns in self._namespaces()})
        if method == "GET" and path.startswith("/admin/v2/namespaces/"):
            tenant = path[len("/admin/v2/namespaces/"):]
            with self.lock:
                names = sorted(ns for ns in self._namespaces() if ns.split("/")[0] == tenant)
            return (200, names) if names else (404, {"reason": "Tenant does not exist"})
        if not path.startswith(PREFIX):
            return 404, {"reason": "Not Found"}
        parts = path[len(PREFIX):].split("/")
        if method == "GET" and len(parts) == 2:
            with self.lock:
                topics = self._namespaces().get(f"{parts[0]}/{parts[1]}")
            return (200, sorted(topics)) if topics is not None else (404, {"reason": "Namespace does not exist"})
        if len(parts) != 4:
            return 404, {"reason": "Not Found"}
        tenant, ns, enc_topic, endpoint = parts
        topic = f"{tenant}/{ns}/{unquote_plus(enc_topic)}"
        with self.lock:
            self.calls[(topic, endpoint)] += 1
            if method == "GET" and endpoint == "internalStats":
                if topic in self.fail_topics:
                    return 500, {"reason": "Internal error (injected)"}
                t = self.topics.get(topic)
                if t is None:
                    return 404, {"reason": f"Topic persistent://{topic} not found"}
                return 200, t.internal_stats()
            if method == "GET" and endpoint == "partitioned-internalStats":
                n = self.partitioned.get(topic)
                if not n:
                    return 404, {"reason": f"Partitioned Topic persistent://{topic} not found"}
                parts_stats = {
                    f"persistent://{topic}-partition-{k}": self.topics.get(f"{topic}-partition-{k}", TopicLedgers()).internal_stats()
                    for k in range(n)
                }
                return 200, {"metadata": {"partitions": n, "deleted": False}, "partitions": parts_stats}
            if method == "PUT" and endpoint == "partitions":
                if topic in self.partitioned:
                    return 409, {"reason": "This topic already exists"}
                self.partitioned[topic] = int(json.loads(body or b"0"))
                return 204, ""
        return 404, {"reason": "Not Found"}
