"""Pulsar admin REST: topic internal stats (reference §6) and partitioned-topic creation.

internalStats gives the ledgers a topic still uses: `ledgers[].ledgerId`,
`cursors.*.cursorLedger`, `schemaLedgers[].ledgerId` (and `compactedLedger.ledgerId`).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Set

from ..topics import java_url_encode
from .model import TopicRef
from .ports import StorageError
from .storage.http import DEFAULT_POOL_SIZE, HttpEndpoints, pooled_session

log = logging.getLogger(__name__)


def ledger_ids_from_internal_stats(stats: Dict[str, Any]) -> Set[int]:
    """The in-use ledger ids named by one PersistentTopicInternalStats JSON."""
    if not isinstance(stats, dict):
        raise StorageError(f"internalStats is not a JSON object: {str(stats)[:200]!r}")
    ids: Set[int] = set()
    try:
        for item in stats.get("ledgers") or []:
            ids.add(int(item["ledgerId"]))
        for cursor in (stats.get("cursors") or {}).values():
            if cursor.get("cursorLedger") is not None:
                ids.add(int(cursor["cursorLedger"]))
        for item in stats.get("schemaLedgers") or []:
            ids.add(int(item["ledgerId"]))
        compacted = stats.get("compactedLedger")
        if isinstance(compacted, dict) and compacted.get("ledgerId") is not None:
            ids.add(int(compacted["ledgerId"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StorageError(f"internalStats has an unexpected shape: {type(exc).__name__}: {exc}") from None
    return {i for i in ids if i >= 0}  # -1 means "no ledger yet"


class AdminRefused(StorageError):
    """The admin REST API refused the request's credential (HTTP 401) or its role (HTTP 403);
    the message names the URL and who asked."""


@dataclass(frozen=True)
class AdminAccess:
    """How a command reaches the admin REST API on a secured cluster: its URL, the Bearer token
    (the client settings' token), the CA it trusts (`--tls-trust-cert-path`,
    `tlsTrustCertsFilePath`; None: the system CAs) or any certificate (`insecure`), and `who`
    names the caller in a refusal ("role 'alice'", "no token")."""

    url: str
    token: Optional[str] = None
    ca_path: Optional[str] = None
    insecure: bool = False
    who: str = ""

    @classmethod
    def of_client(cls, url: str, *, token: Optional[str], role: Optional[str], ca_path: Optional[str],
                  insecure: bool) -> "AdminAccess":
        """The access of a command's client settings: their token, the role it names, their CA."""
        who = f"role {role!r}" if role else ("a token" if token else "no token")
        return cls(url.rstrip("/"), token, ca_path, insecure, who)

    @property
    def caller(self) -> str:
        """Who asks, for a refusal's message."""
        return self.who or ("a token" if self.token else "no token")

    def headers(self) -> Dict[str, str]:
        """The Authorization header, when there is a token."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def session(self, pool_size: int = DEFAULT_POOL_SIZE) -> Any:
        """A pooled requests.Session verifying https:// answers against `ca_path` (or not at all
        when `insecure`)."""
        session = pooled_session(pool_size)
        if not (self.insecure or self.ca_path):
            return session  # the system CAs, or REQUESTS_CA_BUNDLE as requests reads it
        session.verify = False if self.insecure else self.ca_path
        # The given CA wins over REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE, which requests would
        # otherwise put first; the environment's proxies for the URL are kept.
        import requests.utils

        session.trust_env = False
        session.proxies.update(requests.utils.get_environ_proxies(self.url))
        return session

    def check(self, status: int, method: str, path: str, text: str) -> None:
        """AdminRefused on 401 or 403 (Pulsar answers 401 to a missing or bad token and to a role
        without the permission too), one line naming the URL and the caller."""
        if status not in (401, 403):
            return
        hint = ("give a token: --auth-plugin/--auth-params, or authPlugin/authParams in the client.conf"
                if not self.token else "the role needs to be the tenant's admin or a super user")
        raise AdminRefused(f"the admin API at {self.url} refused {self.caller}: HTTP {status} on {method} {path} "
                           f"({_reason(text)}); {hint}")


def _reason(text: str) -> str:
    """The `reason` of Pulsar's JSON error body, or its first 120 characters."""
    try:
        import json

        body = json.loads(text)
        if isinstance(body, dict) and body.get("reason"):
            return str(body["reason"])[:200]
    except ValueError:
        pass  # not JSON: the body as it is
    return " ".join(text.split())[:120] or "no reason given"


@dataclass
class PulsarAdminClient:
    """The admin REST calls deletion needs, against one or more web service URLs."""

    endpoints: HttpEndpoints
    calls: int = 0
    access: Optional[AdminAccess] = None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def connect(cls, base_urls: Sequence[str], timeout: float = 10.0, token: Optional[str] = None,
                pool_size: int = DEFAULT_POOL_SIZE, access: Optional[AdminAccess] = None) -> "PulsarAdminClient":
        """A client for http(s)://broker:8080 URLs; `token` is sent as a Bearer token; `pool_size`
        concurrent callers keep their connections. `access` (a command's): its token and CA, and
        a 401/403 raises AdminRefused naming the URL and the caller."""
        if access is not None:
            token = access.token if token is None else token
            session = access.session(pool_size)
        else:
            session = pooled_session(pool_size)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return cls(HttpEndpoints(list(base_urls), timeout=timeout, headers=headers, session=session), access=access)

    def _refused(self, status: int, method: str, path: str, text: str) -> None:
        if self.access is not None:
            self.access.check(status, method, path, text)

    @staticmethod
    def _path(topic: "TopicRef", suffix: str) -> str:
        return f"/admin/v2/persistent/{topic.tenant}/{topic.namespace}/{java_url_encode(topic.local_name)}/{suffix}"

    def _get(self, topic: "TopicRef", suffix: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            self.calls += 1
        res = self.endpoints.request("GET", self._path(topic, suffix))
        log.debug("admin GET %s topic=%s status=%d", suffix, topic.short_name, res.status)
        self._refused(res.status, "GET", self._path(topic, suffix), res.text)
        if res.status == 404:
            return None
        if res.status != 200:
            raise StorageError(f"admin {suffix} {topic.short_name} answered {res.status}: {res.text[:200]!r}")
        body = res.json()
        if not isinstance(body, dict):
            raise StorageError(f"admin {suffix} {topic.short_name}: not a JSON object")
        return body

    def internal_stats(self, topic: "TopicRef") -> Optional[Dict[str, Any]]:
        """PersistentTopicInternalStats of a (partition) topic, or None if it does not exist."""
        return self._get(topic, "internalStats")

    def partitioned_internal_stats(self, topic: "TopicRef") -> Optional[Dict[str, Any]]:
        """PartitionedTopicInternalStats, or None if `topic` is not a partitioned topic."""
        return self._get(topic, "partitioned-internalStats")

    def in_use_ledger_ids(self, topic: "TopicRef") -> Optional[Set[int]]:
        """Ledger ids `topic` uses, over all partitions for a partitioned topic; None if no such topic.

        A partition name is asked directly. A base name is asked as a plain topic first and, when
        that is 404, as a partitioned topic (schema ledgers are requested under the base name)."""
        stats = self.internal_stats(topic)
        if stats is not None:
            return ledger_ids_from_internal_stats(stats)
        if topic.partition is not None:
            return None
        pstats = self.partitioned_internal_stats(topic)
        if pstats is None:
            return None
        parts = pstats.get("partitions")
        if not isinstance(parts, dict):
            raise StorageError(f"partitioned-internalStats {topic.short_name}: no partitions object")
        ids: Set[int] = set()
        for part in parts.values():
            ids |= ledger_ids_from_internal_stats(part)
        return ids

    def topic_internal_stats_any(self, topic: "TopicRef") -> Optional[Dict[str, Any]]:
        """internalStats of a topic, or the partitions' stats merged under `partitions`."""
        stats = self.internal_stats(topic)
        if stats is not None or topic.partition is not None:
            return stats
        return self.partitioned_internal_stats(topic)

    def create_partitioned_topic(self, topic: "TopicRef", partitions: int) -> bool:
        """PUT .../partitions; True if created, False if it already existed (409)."""
        with self._lock:
            self.calls += 1
        res = self.endpoints.request(
            "PUT", self._path(topic, "partitions"), data=str(int(partitions)), headers={"Content-Type": "application/json"}
        )
        self._refused(res.status, "PUT", self._path(topic, "partitions"), res.text)
        if res.status in (200, 204):
            return True
        if res.status == 409:
            return False
        raise StorageError(f"admin create partitioned {topic.short_name} answered {res.status}: {res.text[:200]!r}")

    def close(self) -> None:
        """Close pooled connections."""
        self.endpoints.close()
