"""What the syncer asks Pulsar's admin REST API (only when `pulsarAdminUrl` is set).

- Does a business topic still exist? GET /admin/v2/persistent/{tenant}/{ns} (topics, partitions
  included) and .../{ns}/partitioned; one pair of calls per namespace, cached `ttl` seconds.
- Would a namespace policy drop parked messages? GET /admin/v2/namespaces/{tenant}/{ns}:
  `message_ttl_in_seconds` and `backlog_quota_map` (policy `consumer_backlog_eviction`).
- How far behind is the writer? GET .../{topic}/stats: subscriptions[sub].msgBacklog.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple
from urllib.parse import quote

from ..deletion.admin import AdminAccess
from ..deletion.ports import StorageError
from ..deletion.storage.http import HttpEndpoints
from ..deletion.ttl_cache import TtlCache
from ..topics import PARTITION_SUFFIX, TopicName, normalize_topic

log = logging.getLogger(__name__)

__all__ = ["AdminView", "retention_problems", "split_topic"]


def split_topic(topic: str) -> Tuple[str, str, str, str]:
    """(domain, tenant, namespace, local name) of a topic name."""
    t = TopicName.from_client(topic)
    return t.domain, t.tenant, t.namespace, t.local_name


def retention_problems(policies: Dict[str, Any], max_delay_seconds: int, namespace: str) -> List[str]:
    """Namespace policies that would silently drop parked (unacked) messages. Pure."""
    out = []
    ttl = policies.get("message_ttl_in_seconds")
    if isinstance(ttl, int) and 0 < ttl < max_delay_seconds:
        out.append(f"namespace {namespace} has message TTL {ttl} s < the maximum delay {max_delay_seconds} s: "
                   "the broker would expire parked messages before they are forwarded")
    for kind, quota in (policies.get("backlog_quota_map") or {}).items():
        if isinstance(quota, dict) and quota.get("policy") == "consumer_backlog_eviction":
            out.append(f"namespace {namespace} has a {kind} backlog quota with policy consumer_backlog_eviction: "
                       "the broker would evict parked messages when the quota is reached (use producer_request_hold "
                       "or producer_exception)")
    return out


@dataclass
class AdminView:
    """Cached answers of the admin API. Every call is bounded by the HTTP timeout."""

    endpoints: HttpEndpoints
    ttl_seconds: float = 600.0
    clock: Callable[[], float] = time.monotonic
    access: Optional[AdminAccess] = None

    def __post_init__(self) -> None:
        self._topics: TtlCache[Tuple[str, str, str], Set[str]] = TtlCache(
            self._list_namespace, self.ttl_seconds, clock=self.clock, name="admin topic listing")

    @classmethod
    def connect(cls, url: str, ttl_seconds: float, timeout: float = 10.0,
                access: Optional[AdminAccess] = None, token: Optional[str] = None) -> "AdminView":
        """A view over the admin REST API at `url`; `token` (the function's `adminTokenSecret`)
        is sent as a Bearer token; `access` (a command's): its token and CA, and a 401/403 raises
        AdminRefused naming the URL and the caller."""
        if access is None:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return cls(HttpEndpoints([url], timeout=timeout, headers=headers), ttl_seconds)
        view = cls(HttpEndpoints([url], timeout=timeout, headers=access.headers(), session=access.session()),
                   ttl_seconds)
        view.access = access
        return view

    def _get_json(self, path: str) -> Optional[Any]:
        res = self.endpoints.request("GET", path)
        if self.access is not None:
            self.access.check(res.status, "GET", path, res.text)
        if res.status == 404:
            return None
        if res.status != 200:
            raise StorageError(f"admin GET {path} answered {res.status}: {res.text[:200]!r}")
        return res.json()

    def _namespace_topics(self, domain: str, tenant: str, namespace: str) -> Set[str]:
        return self._topics.get((domain, tenant, namespace))[0]

    def _list_namespace(self, key: Tuple[str, str, str]) -> Set[str]:
        domain, tenant, namespace = key
        base = f"/admin/v2/{domain}/{quote(tenant)}/{quote(namespace)}"
        names: Set[str] = set()
        for path in (base, base + "/partitioned"):
            body = self._get_json(path) or []
            if not isinstance(body, list):
                raise StorageError(f"admin GET {path}: expected a JSON list of topic names")
            names.update(str(n) for n in body)
        log.info("event=delay_level_topics_listed namespace=%s/%s topics=%d", tenant, namespace, len(names))
        return names

    def topic_exists(self, topic: str) -> bool:
        """True when the topic (or, for a partitioned topic, its base name) exists."""
        full = normalize_topic(topic)
        domain, tenant, namespace, _ = split_topic(full)
        names = self._namespace_topics(domain, tenant, namespace)
        return full in names or any(n.startswith(full + PARTITION_SUFFIX) for n in names)

    def forget(self, topic: str) -> None:
        """Drop the cached listing of the topic's namespace (re-read on the next question)."""
        domain, tenant, namespace, _ = split_topic(topic)
        self._topics.invalidate((domain, tenant, namespace))

    def namespace_policies(self, topic: str) -> Dict[str, Any]:
        """The policies of the topic's namespace ({} when the namespace is unknown)."""
        _, tenant, namespace, _ = split_topic(topic)
        body = self._get_json(f"/admin/v2/namespaces/{quote(tenant)}/{quote(namespace)}")
        return body if isinstance(body, dict) else {}

    def subscription_backlog(self, topic: str, subscription: str) -> Optional[int]:
        """msgBacklog of `subscription` on `topic`, or None when either does not exist."""
        domain, tenant, namespace, local = split_topic(topic)
        body = self._get_json(f"/admin/v2/{domain}/{quote(tenant)}/{quote(namespace)}/{quote(local)}/stats")
        if not isinstance(body, dict):
            return None
        sub = (body.get("subscriptions") or {}).get(subscription)
        if not isinstance(sub, dict) or not isinstance(sub.get("msgBacklog"), int):
            return None
        return int(sub["msgBacklog"])

    def close(self) -> None:
        """Close pooled connections."""
        self.endpoints.close()
