"""A local bookie HTTP admin server for ledger deletion, answering as a real bookie does.

Checked against the bookie of an Apache Pulsar 4.0.0 standalone (ZooKeeper metadata,
tests/integration/test_deletion_real_pulsar.py compares the shapes):

  DELETE /api/v1/ledger/delete?ledger_id=N  -> 200 "Deleted ledger: N" (a JSON string); missing
       param -> 404 "Not ledger found. Should provide ledger_id=<id>"; a missing ledger -> 200
       with ledger_manager="zk" (what the ZooKeeper ledger manager answers), 500 with
       "metadata-store"; other methods -> 404 "Not found method. Should be DELETE method"
  GET /api/v1/ledger/metadata?ledger_id=N   -> {"N": LedgerMetadata} with customMetadata values
       base64 and the real field names (`allEnsembles` of {"id": bookie}, `ctoken`); a missing
       ledger -> 500 "Internal Server Error"
  GET /api/v1/ledger/list                   -> {"<id>": null, ...}; with print_metadata=true and
       decode_meta=true {"<id>": LedgerMetadata, ...}, and with page=N (1-based) only the ledgers at
       positions (N-1)*100 .. N*100-1 counted from 1, as BookKeeper's ListLedgerService does
       (so page 1 holds 99); `fail_list_pages` answers 500 for those pages
`fail_rate` answers 500 before acting; `fail_after_delete_rate` deletes and THEN answers 500
(the worst case for a client: done, but told it failed)."""
from __future__ import annotations

import base64
import json
import random
import time
from typing import Any, Dict, List, Optional, Tuple

from ._deletion_http_base import LocalHttpServer


def pulsar_metadata(topic: str, component: str = "managed-ledger", cursor: Optional[str] = None) -> Dict[str, str]:
    """The custom metadata Pulsar writes (LedgerMetadataUtils) for `tenant/ns/topic`."""
    t = topic.split("://", 1)[-1]
    tenant, ns, local = t.split("/", 2)
    if component == "schema":
        return {"application": "pulsar", "component": "schema", "pulsar/schemaId": f"{tenant}/{ns}/{local}"}
    md = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": f"{tenant}/{ns}/persistent/{local}"}
    if cursor is not None:
        md["pulsar/cursor"] = cursor
    return md


class BookieHttpServer(LocalHttpServer):
    """In-memory ledgers with custom metadata behind the bookie HTTP admin endpoints."""

    def __init__(self, fail_rate: float = 0.0, seed: int = 0, ledger_manager: str = "metadata-store",
                 fail_after_delete_rate: float = 0.0) -> None:
        super().__init__(fail_rate, seed)
        if ledger_manager not in ("zk", "metadata-store"):
            raise ValueError(f"ledger_manager must be 'zk' or 'metadata-store', got {ledger_manager!r}")
        self.ledger_manager = ledger_manager
        self.fail_after_delete_rate = fail_after_delete_rate
        self._after_rng = random.Random(seed + 1)
        self.ledgers: Dict[int, Dict[str, str]] = {}
        self.deleted: List[int] = []  # in deletion order
        self.delete_calls = 0
        self.poisoned: set = set()  # ledgers whose every call answers 500 (a permanently failing storage)
        self.ctimes: Dict[int, int] = {}  # ledger -> ctime ms (default: now)
        self.fail_list_pages: set = set()  # list pages that answer 500
        self.list_requests: List[float] = []  # monotonic time of each list request

    def add_ledger(self, ledger_id: int, custom_metadata: Dict[str, str], ctime_ms: Optional[int] = None) -> None:
        """Create a ledger carrying `custom_metadata` (text values), created at `ctime_ms`."""
        with self.lock:
            self.ledgers[ledger_id] = dict(custom_metadata)
            if ctime_ms is not None:
                self.ctimes[ledger_id] = ctime_ms

    def exists(self, ledger_id: int) -> bool:
        """Whether the ledger is still stored."""
        with self.lock:
            return ledger_id in self.ledgers

    def _metadata_json(self, ledger_id: int) -> Dict[str, Any]:
        # Field names and order as the bookie's LedgerMetadata JSON has them.
        md = self.ledgers[ledger_id]
        return {
            "ledgerId": ledger_id,
            "metadataFormatVersion": 3,
            "ensembleSize": 1,
            "writeQuorumSize": 1,
            "ackQuorumSize": 1,
            "state": "CLOSED",
            "length": 1024,
            "lastEntryId": 9,
            "ctime": self.ctimes.get(ledger_id, int(time.time() * 1000)),
            "digestType": "CRC32C",
            "password": "",
            "customMetadata": {k: base64.b64encode(v.encode()).decode() for k, v in md.items()},
            "closed": True,
            "allEnsembles": {"0": [{"id": "127.0.0.1:3181"}]},
            "ctoken": 0,
        }

    def route(self, method: str, path: str, params: Dict[str, str], body: bytes) -> Tuple[int, Any]:
        if path == "/api/v1/ledger/delete":
            if method != "DELETE":
                return 404, "Not found method. Should be DELETE method"
            if "ledger_id" not in params:
                return 404, "Not ledger found. Should provide ledger_id=<id>"
            lid = int(params["ledger_id"])
            with self.lock:
                self.delete_calls += 1
                if lid in self.poisoned:
                    return 500, "Internal Server Error (poisoned ledger)"
                if lid not in self.ledgers:
                    if self.ledger_manager == "zk":
                        return 200, json.dumps(f"Deleted ledger: {lid}")
                    return 500, "Internal Server Error"
                del self.ledgers[lid]
                self.deleted.append(lid)
                if self.fail_after_delete_rate and self._after_rng.random() < self.fail_after_delete_rate:
                    self.injected_failures += 1
                    return 500, "Internal Server Error (injected after delete)"
            return 200, json.dumps(f"Deleted ledger: {lid}")
        if path == "/api/v1/ledger/metadata":
            if method != "GET" or "ledger_id" not in params:
                return 404, "Not found method. Should be GET method"
            lid = int(params["ledger_id"])
            with self.lock:
                if lid not in self.ledgers or lid in self.poisoned:
                    return 500, "Internal Server Error"
                return 200, {str(lid): self._metadata_json(lid)}
        if path == "/api/v1/ledger/list" and method == "GET":
            with self.lock:
                self.list_requests.append(time.monotonic())
                if params.get("print_metadata") != "true":
                    return 200, {str(i): None for i in sorted(self.ledgers)}
                page = int(params["page"]) if "page" in params else -1
                if page in self.fail_list_pages:
                    return 500, "Internal Server Error (list page)"
                ids = sorted(self.ledgers)
                if page > 0:
                    start, end = (page - 1) * 100, (page - 1) * 100 + 99
                    ids = [lid for pos, lid in enumerate(ids, start=1) if start <= pos <= end]
                if params.get("decode_meta") == "true":
                    return 200, {str(i): self._metadata_json(i) for i in ids}
                return 200, {str(i): f"serialized metadata of {i}" for i in ids}
        return 404, "Not found"
