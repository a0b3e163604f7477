"""The syncer's targetPermissionCheck: no role reaches through the syncer what it may not reach itself.

The syncer forwards parked messages with its own role, to the writer's scheduling topic (which the
writer then releases to each message's `__pl_target__` X) or, with the `broker` backend, to X
itself. A role that may produce to the delay-level topic D but not to X would otherwise get its
message into X, as the writer's check (scheduler/target_permissions.py) cannot see it: the
scheduling topic's producer is the syncer. So the syncer applies the writer's rule with D in place of
the scheduling topic: a forward to X is allowed only when EVERY role that may produce to D (tenant
admins included, super users aside) may produce to X; a refused message goes to `<D>-DLQ` with the
reason naming the roles, and is acked.

The engine (TargetPermissionCheck, its cache) and the admin REST adapter (AdminPermissionSource,
the `auto` / `on` / `off` decision, the admin token from a function secret) are the writer's,
reused as they are; this module only maps SyncerConfig onto them and words the refusal for the
syncer.

D is checked by its (partitioned) topic name: the namespace's grants and D's (a grant on D covers
its partitions). A grant on one partition of D alone is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from ..scheduler.permission_source import admin_token, target_permission_check
from ..scheduler.target_permissions import TargetPermissionCheck
from .config import SyncerConfig

__all__ = ["SyncerTargetCheck", "syncer_target_check"]

_WRITER_ADVICE = ("the writer releases to a topic only what every producer of its scheduling topic may produce there "
                  "itself; grant them produce on it, or schedule through a scheduling topic they alone produce to")
_SYNCER_ADVICE = ("the syncer forwards to a topic only what every producer of its delay-level topic may produce there "
                  "itself; grant them produce on it, or park through a delay-level topic they alone produce to, "
                  "with a syncer of its own")


@dataclass(frozen=True)
class _CheckSettings:
    """SyncerConfig's targetPermissionCheck keys in the shape the writer's wiring reads (WriterConfig's
    names; pulsarAdminUrl as a tuple of URLs)."""

    target_permission_check: str
    pulsar_admin_url: Tuple[str, ...]
    admin_token_secret: Optional[str]
    target_permission_cache_seconds: int


@dataclass
class SyncerTargetCheck:
    """`refusal(target)`: the reason a forward to `target` is refused (worded for the syncer), or None."""

    check: TargetPermissionCheck
    delay_level_topic: str

    def refusal(self, target: str) -> Optional[str]:
        """None when every role that may produce to the delay-level topic may produce to `target`;
        PermissionsUnavailable when the admin API cannot answer now."""
        why = self.check.refusal(target)
        if why is None:
            return None
        why = why.replace(f"the scheduling topic {self.delay_level_topic}", f"the delay-level topic {self.delay_level_topic}")
        return "syncer targetPermissionCheck: " + why.replace(_WRITER_ADVICE, _SYNCER_ADVICE)

    def close(self) -> None:
        """Close the admin connections."""
        close: Optional[Callable[[], None]] = getattr(self.check.source, "close", None)
        if close is not None:
            close()


def syncer_target_check(cfg: SyncerConfig, context: Any) -> Optional[SyncerTargetCheck]:
    """The check this syncer runs, None when off (the writer's rules: `off`; `auto` without
    pulsarAdminUrl or on a broker that answers anonymous admin reads). ConfigError: `on` without
    pulsarAdminUrl, `auto` on an authenticating broker without adminTokenSecret, a named secret
    that is not set. PermissionsUnavailable: `auto` cannot ask the broker."""
    settings = _CheckSettings(cfg.target_permission_check, (cfg.pulsar_admin_url,) if cfg.pulsar_admin_url else (),
                              cfg.admin_token_secret, cfg.target_permission_cache_seconds)
    check = target_permission_check(settings, context, cfg.delay_level_topic, cfg.delay_level_topic)
    return None if check is None else SyncerTargetCheck(check, cfg.delay_level_topic)


def syncer_admin_token(cfg: SyncerConfig, context: Any) -> Optional[str]:
    """The Bearer token of `adminTokenSecret` for the syncer's other admin calls (None: no secret named)."""
    return admin_token(context, cfg.admin_token_secret)
