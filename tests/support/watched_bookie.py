"""A bookie stand-in that watches concurrency: how many ledger calls are in progress at once, and
whether two calls about one ledger ever overlap (the deletion worker must never let them)."""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Dict, List, Tuple

from servers.bookie_http_server import BookieHttpServer

_PER_LEDGER = ("/api/v1/ledger/delete", "/api/v1/ledger/metadata")


class WatchedBookie(BookieHttpServer):
    """BookieHttpServer whose per-ledger calls (metadata, delete) take `call_s` and are counted
    while they run: `in_progress` now, `most_in_progress` ever, and `overlaps`, the ledgers that
    had a call start while another call about them was still running."""

    def __init__(self, *args: Any, call_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.call_s = call_s
        self._watch = threading.Lock()
        self._busy: Counter = Counter()  # ledger -> calls about it in progress
        self.in_progress = 0
        self.most_in_progress = 0
        self.overlaps: List[int] = []
        self.delete_requests: Counter = Counter()  # ledger -> DELETE calls received

    def route(self, method: str, path: str, params: Dict[str, str], body: bytes) -> Tuple[int, Any]:
        if path not in _PER_LEDGER or "ledger_id" not in params:
            return super().route(method, path, params, body)
        lid = int(params["ledger_id"])
        with self._watch:
            if self._busy[lid]:
                self.overlaps.append(lid)
            self._busy[lid] += 1
            self.in_progress += 1
            self.most_in_progress = max(self.most_in_progress, self.in_progress)
            if path.endswith("/delete"):
                self.delete_requests[lid] += 1
        try:
            if self.call_s:
                time.sleep(self.call_s)  # storage latency: what deletions in flight overlap
            return super().route(method, path, params, body)
        finally:
            with self._watch:
                self._busy[lid] -= 1
                self.in_progress -= 1

    def deletes_in_progress(self) -> int:
        """Per-ledger calls running right now."""
        with self._watch:
            return self.in_progress
