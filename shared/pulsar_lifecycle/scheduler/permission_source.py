"""The writer's target permission check, wired: grants read from Pulsar's admin REST API.

Calls (each needs a tenant admin of the topic's tenant, or a super user: PersistentTopicsBase
.internalGetPermissionsOnTopic asks validateAdminAccessForTenant):

- GET /admin/v2/namespaces/{tenant}/{ns}/permissions: the namespace's grants;
- GET /admin/v2/{domain}/{tenant}/{ns}/{topic}/permissions: the namespace's and that topic's grants
  (404 while the topic does not exist: the namespace's grants then stand alone, as a topic grant
  needs an existing topic); for a partition also the partitioned topic's, which Pulsar's
  checkPermission counts for its partitions;
- GET /admin/v2/tenants/{tenant}: `adminRoles`, who may produce to any topic of the tenant;
- GET /admin/v2/brokers/configuration/runtime: `superUserRoles` (answered to super users only; for any
  other role they are unknown and counted like any role).

The admin URL and token follow the LedgerDeletionWorker's conventions: userConfig `pulsarAdminUrl`
(one or more URLs, tried in turn) and `adminTokenSecret`, the name of a function secret holding a
Bearer token; the HTTP client is the deletion worker's (PulsarAdminClient.connect).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, FrozenSet, Optional, Sequence

from ..config.settings import ConfigError
from ..deletion.admin import PulsarAdminClient
from ..deletion.ports import StorageError
from ..deletion.storage.http import HttpEndpoints
from ..topics import TopicName, java_url_encode
from .target_permissions import (
    PermissionsUnavailable,
    PermissionsUnreadable,
    ProducePermissions,
    TargetPermissionCheck,
    produce_grants,
)

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 10.0  # the deletion worker's adminTimeoutSeconds default


@dataclass
class AdminPermissionSource:
    """PermissionSource over the admin REST API (see the module docstring)."""

    endpoints: HttpEndpoints

    @classmethod
    def connect(cls, admin_urls: Sequence[str], token: Optional[str],
                timeout: float = ADMIN_TIMEOUT_S) -> "AdminPermissionSource":
        """A source on `admin_urls` sending `token` as a Bearer token (None: no token)."""
        return cls(PulsarAdminClient.connect(admin_urls, timeout, token, pool_size=2).endpoints)

    def _get(self, path: str, *, missing_ok: bool = False) -> Optional[Any]:
        try:
            res = self.endpoints.request("GET", path)
        except StorageError as exc:  # no endpoint reachable
            raise PermissionsUnavailable(f"admin GET {path}: {exc}") from None
        if res.status == 200:
            try:
                return res.json()
            except StorageError as exc:
                raise PermissionsUnavailable(f"admin GET {path}: {exc}") from None
        if res.status == 404 and missing_ok:
            return None
        if res.status in (401, 403, 404):
            raise PermissionsUnreadable(f"admin GET {path} answered {res.status}: {res.text[:160]!r}")
        raise PermissionsUnavailable(f"admin GET {path} answered {res.status}: {res.text[:160]!r}")

    def produce_permissions(self, topic: str) -> ProducePermissions:
        """Who may produce to `topic` (the grants with `produce`, the tenant's admins)."""
        name = TopicName.from_client(topic)
        grants = [self._get(f"/admin/v2/namespaces/{name.tenant}/{name.namespace}/permissions")]
        for t in (name, name.base) if name.partition else (name,):
            grants.append(self._get(f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/"
                                    f"{java_url_encode(t.local_name)}/permissions", missing_ok=True))
        tenant = self._get(f"/admin/v2/tenants/{name.tenant}") or {}
        maps = [g for g in grants if isinstance(g, dict)]
        admins = tenant.get("adminRoles") if isinstance(tenant, dict) else None
        return ProducePermissions(name.full_name, produce_grants(*maps), frozenset(admins or ()))

    def super_users(self) -> FrozenSet[str]:
        """`superUserRoles` of the broker's runtime configuration; empty unless the token is a super
        user's (or the call fails)."""
        try:
            res = self.endpoints.request("GET", "/admin/v2/brokers/configuration/runtime")
            body = res.json() if res.status == 200 else None
        except StorageError as exc:
            log.debug("event=super_users_unread error=%r", exc)
            return frozenset()
        text = body.get("superUserRoles", "") if isinstance(body, dict) else ""
        roles = text.strip("[]").split(",") if isinstance(text, str) else list(text or ())
        return frozenset(r.strip() for r in roles if r.strip())

    def close(self) -> None:
        """Close pooled connections."""
        self.endpoints.close()


def admin_token(context: Any, secret_name: Optional[str]) -> Optional[str]:
    """The Bearer token the function secret `secret_name` holds (the deletion worker's convention);
    None when no secret is named; ConfigError naming the key when it is not set."""
    if not secret_name:
        return None
    get_secret = getattr(context, "get_secret", None)
    if get_secret is None:
        raise ConfigError(f"adminTokenSecret names secret {secret_name!r} but no secrets are available")
    value = get_secret(secret_name)
    if value in (None, ""):
        raise ConfigError(f"adminTokenSecret: secret {secret_name!r} is not set")
    return str(value)


def broker_authenticates(admin_urls: Sequence[str], namespace: str, timeout: float = ADMIN_TIMEOUT_S) -> bool:
    """Whether the broker behind `admin_urls` refuses an anonymous admin read (401/403): the sign of a
    broker with authentication, and so authorization worth checking. False when it answers one (an
    open broker); PermissionsUnavailable when it cannot be asked."""
    source = AdminPermissionSource.connect(admin_urls, None, timeout)
    try:
        res = source.endpoints.request("GET", f"/admin/v2/namespaces/{namespace}/permissions")
    except StorageError as exc:
        raise PermissionsUnavailable(f"targetPermissionCheck=auto: the admin API at {list(admin_urls)} cannot be "
                                     f"asked whether the broker checks permissions: {exc}") from None
    finally:
        source.close()
    if res.status in (401, 403):
        return True
    if res.status in (200, 404):
        return False
    raise PermissionsUnavailable(f"targetPermissionCheck=auto: the admin API at {list(admin_urls)} answered "
                                 f"{res.status} to an anonymous read: {res.text[:160]!r}")


def target_permission_check(cfg: Any, context: Any, scheduling_topic: str,
                            default_target: str) -> Optional[TargetPermissionCheck]:
    """The check this writer runs (None: off). `cfg` is the WriterConfig: targetPermissionCheck `off`
    -> None; `on` needs pulsarAdminUrl; `auto` is on when pulsarAdminUrl is set and the broker refuses
    an anonymous admin read, off otherwise (pulsar-lite, an open broker)."""
    mode = cfg.target_permission_check
    urls = tuple(cfg.pulsar_admin_url)
    if mode == "off":
        return None
    if not urls:
        if mode == "on":
            raise ConfigError("userConfig targetPermissionCheck=on needs pulsarAdminUrl (and adminTokenSecret "
                              "on a broker with authentication)")
        log.info("event=target_permission_check state=off reason='targetPermissionCheck=auto and no pulsarAdminUrl'")
        return None
    name = TopicName.from_client(scheduling_topic)
    if mode == "auto" and not broker_authenticates(urls, name.namespace_name):
        log.info("event=target_permission_check state=off reason='targetPermissionCheck=auto: the broker answers "
                 "anonymous admin reads (no authentication)' admin=%s", list(urls))
        return None
    token = admin_token(context, cfg.admin_token_secret)
    if token is None and mode == "auto":
        raise ConfigError("userConfig targetPermissionCheck=auto: the broker at pulsarAdminUrl checks credentials, "
                          "so the check needs adminTokenSecret (a function secret with a token of a tenant admin "
                          "of the scheduling topic's and the targets' tenants, or of a super user); or set "
                          "targetPermissionCheck=off")
    check = TargetPermissionCheck(AdminPermissionSource.connect(urls, token), name.full_name, default_target,
                                  ttl_seconds=cfg.target_permission_cache_seconds)
    log.info("event=target_permission_check state=on scheduling_topic=%s admin=%s ttl_s=%d", name.full_name,
             list(urls), cfg.target_permission_cache_seconds)
    return check

