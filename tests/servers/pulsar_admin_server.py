"""A local Pulsar admin REST server for the delay-level syncer's questions (broker v2 paths).

  GET /admin/v2/persistent/{tenant}/{ns}              -> ["persistent://t/ns/topic", ...]
  GET /admin/v2/persistent/{tenant}/{ns}/partitioned  -> partitioned topic names
  GET /admin/v2/namespaces/{tenant}/{ns}              -> Policies (message_ttl_in_seconds, backlog_quota_map)
  GET /admin/v2/persistent/{tenant}/{ns}/{topic}/stats -> TopicStats (subscriptions.{sub}.msgBacklog)
The test sets topics, policies and backlogs from Python (it plays the broker's metadata side)."""
from __future__ import annotations

from typing import Any, Dict, Set, Tuple
from urllib.parse import unquote

from ._deletion_http_base import LocalHttpServer


class PulsarAdminServer(LocalHttpServer):
    """Topics, namespace policies and subscription backlogs, as the broker reports them."""

    def __init__(self) -> None:
        super().__init__()
        self.topics: Set[str] = set()
        self.partitioned: Set[str] = set()
        self.policies: Dict[str, Dict[str, Any]] = {}
        self.backlogs: Dict[Tuple[str, str], int] = {}  # (topic, subscription) -> msgBacklog
        self.calls: Dict[str, int] = {}

    def route(self, method: str, path: str, params: Dict[str, str], body: bytes) -> Tuple[int, Any]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method != "GET" or parts[:2] != ["admin", "v2"]:
            return 404, "not found"
        rest = parts[2:]
        with self.lock:
            kind = "/".join(rest[:1] + (["stats"] if rest[-1:] == ["stats"] else []))
            self.calls[kind] = self.calls.get(kind, 0) + 1
            if rest[0] == "namespaces" and len(rest) == 3:
                ns = f"{rest[1]}/{rest[2]}"
                return (200, self.policies[ns]) if ns in self.policies else (404, {"reason": "Namespace does not exist"})
            if rest[0] == "persistent" and len(rest) == 3:
                prefix = f"persistent://{rest[1]}/{rest[2]}/"
                return 200, sorted(t for t in self.topics if t.startswith(prefix))
            if rest[0] == "persistent" and len(rest) == 4 and rest[3] == "partitioned":
                prefix = f"persistent://{rest[1]}/{rest[2]}/"
                return 200, sorted(t for t in self.partitioned if t.startswith(prefix))
            if rest[0] == "persistent" and len(rest) == 5 and rest[4] == "stats":
                topic = f"persistent://{rest[1]}/{rest[2]}/{rest[3]}"
                subs = {s: {"msgBacklog": n, "type": "Shared"} for (t, s), n in self.backlogs.items() if t == topic}
                if topic not in self.topics and not subs:
                    return 404, {"reason": "Topic not found"}
                return 200, {"msgRateIn": 0.0, "subscriptions": subs}
        return 404, "not found"
