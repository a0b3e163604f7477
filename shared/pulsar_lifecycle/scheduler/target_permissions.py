"""Whether the writer may release to a target: no role reaches through it what it may not reach itself.

The broker does not tell a consumer which role produced a message, so the writer cannot check a
message's own producer. It checks the capability instead: the capability to schedule is the
permission to produce to the scheduling topic S, so a release to X is allowed only when EVERY role
that may produce to S may also produce to X. A target that fails is refused at intake (the
message goes to `-INVALID` with the roles that lack produce on X), never indexed.

Who may produce to a topic, as Pulsar 4.0's PulsarAuthorizationProvider decides it for a producer
(ServerCnx asks allowTopicOperationAsync(PRODUCE)):

- a super user, or an admin of the topic's tenant (validateTenantAdminAccess, asked first);
- otherwise a role whose `produce` grant is in the namespace's grants, the topic's grants or, for a
  partition, the partitioned topic's grants (checkPermission);
- with `authorizationAllowWildcardsMatching`, a grant `*x` / `x*` covers every role ending /
  starting with x. This check matches grant keys literally: a wildcard grant on S is covered only by
  the same grant (or a literal grant of that key) on X, which is conservative both ways.

Super users may produce anywhere, so they are left out of S's producers when the writer can learn
them (PermissionSource.super_users); when it cannot, a super user granted on S explicitly must be
granted on X too (a refusal names it).

Pure: the grants come from a PermissionSource (scheduler/permission_source.py reads the admin REST
API), the clock is injected.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import AbstractSet, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Protocol, Tuple, Union

from ..exceptions import PulsarLifecycleError
from ..scheduling_protocol import TARGET_PROP

PRODUCE = "produce"
#: targetPermissionCheck values.
MODES = ("auto", "on", "off")


class PermissionsUnreadable(PulsarLifecycleError):
    """The grants of a topic cannot be read for good (no such tenant or namespace, the admin token may
    not read them): a target whose grants are unreadable is refused."""


class PermissionsUnavailable(PulsarLifecycleError):
    """The grants cannot be read now (admin API unreachable, 5xx): nothing is decided; the intake
    fails, its batch stays unacked and is redelivered."""


@dataclass(frozen=True)
class ProducePermissions:
    """Who may produce to `topic`: the roles granted `produce` (namespace, topic and, for a partition,
    partitioned-topic grants; keys as granted) and the admins of its tenant."""

    topic: str
    granted: FrozenSet[str]
    tenant_admins: FrozenSet[str] = frozenset()

    @property
    def roles(self) -> FrozenSet[str]:
        """Every role (grant key) that may produce to the topic, super users aside."""
        return self.granted | self.tenant_admins


def produce_grants(*grant_maps: Optional[Mapping[str, Iterable[str]]]) -> FrozenSet[str]:
    """The roles whose actions include `produce` in any of `grant_maps` (role -> actions, as
    GET .../permissions answers)."""
    return frozenset(role for grants in grant_maps for role, actions in (grants or {}).items()
                     if PRODUCE in set(actions or ()))


def lacking_roles(source: ProducePermissions, target: ProducePermissions,
                  super_users: AbstractSet[str] = frozenset()) -> Tuple[str, ...]:
    """The roles that may produce to `source` but not to `target` (sorted), super users left out."""
    may = target.roles
    return tuple(sorted(r for r in source.roles if r not in may and r not in super_users))


class PermissionSource(Protocol):
    """Where the grants come from (the admin REST API: scheduler/permission_source.py)."""

    def produce_permissions(self, topic: str) -> ProducePermissions:
        """Who may produce to `topic`; PermissionsUnreadable / PermissionsUnavailable."""

    def super_users(self) -> FrozenSet[str]:
        """The broker's super-user roles, empty when they cannot be read."""


Clock = Callable[[], float]
_Loaded = Union[ProducePermissions, PermissionsUnreadable]


class TargetPermissionCheck:
    """`refusal(target)`: None when every role that may produce to the scheduling topic may produce to
    `target` (None: the writer's output topic), else the reason. Grants are cached for `ttl_seconds`
    per topic, a decision per target as long as the grants it rests on; an unreadable topic is
    cached too (refused until it expires); an unavailable one is not (PermissionsUnavailable)."""

    def __init__(self, source: PermissionSource, scheduling_topic: str, default_target: str, *,
                 ttl_seconds: float, clock: Clock = time.monotonic) -> None:
        self.source = source
        self.scheduling_topic = scheduling_topic
        self.default_target = default_target
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.loads = 0  # admin reads made (tests, metrics)
        self._grants: Dict[str, Tuple[_Loaded, float]] = {}
        self._decisions: Dict[Optional[str], Tuple[Optional[str], float]] = {}
        self._super: Optional[Tuple[FrozenSet[str], float]] = None
        self._lock = threading.Lock()

    def refusal(self, target: Optional[str]) -> Optional[str]:
        """The reason a release to `target` is refused, or None; runs once per scheduling message."""
        now = self.clock()
        hit = self._decisions.get(target)  # a plain dict read: the common case takes no lock
        if hit is not None and now < hit[1]:
            return hit[0]
        with self._lock:
            decision, expires = self._decide(target, now)
            self._decisions[target] = (decision, expires)
        return decision

    def _decide(self, target: Optional[str], now: float) -> Tuple[Optional[str], float]:
        topic = target or self.default_target
        named = f"{TARGET_PROP}={target!r}" if target else f"the writer's output {topic!r} (no {TARGET_PROP})"
        source, s_until = self._load(self.scheduling_topic, now)
        if isinstance(source, PermissionsUnreadable):
            return (f"{named} refused: the producers of the scheduling topic {self.scheduling_topic} cannot be "
                    f"read ({source}); targetPermissionCheck refuses what it cannot prove allowed"), s_until
        dest, t_until = self._load(topic, now)
        until = min(s_until, t_until)
        if isinstance(dest, PermissionsUnreadable):
            return (f"{named} refused: who may produce to {topic} cannot be read ({dest}); targetPermissionCheck "
                    "refuses what it cannot prove allowed"), until
        supers, su_until = self._super_users(now)
        lacking = lacking_roles(source, dest, supers)
        if not lacking:
            return None, min(until, su_until)
        return (f"{named} refused: role(s) {list(lacking)} may produce to the scheduling topic "
                f"{self.scheduling_topic} but not to {topic} (targetPermissionCheck: the writer releases to a topic "
                "only what every producer of its scheduling topic may produce there itself; grant them produce on "
                "it, or schedule through a scheduling topic they alone produce to)"), min(until, su_until)

    def _load(self, topic: str, now: float) -> Tuple[_Loaded, float]:
        hit = self._grants.get(topic)
        if hit is not None and now < hit[1]:
            return hit
        self.loads += 1
        loaded: _Loaded
        try:
            loaded = self.source.produce_permissions(topic)
        except PermissionsUnreadable as exc:
            loaded = exc
        entry = (loaded, now + self.ttl_seconds)
        self._grants[topic] = entry
        return entry

    def _super_users(self, now: float) -> Tuple[FrozenSet[str], float]:
        if self._super is None or now >= self._super[1]:
            self._super = (self.source.super_users(), now + self.ttl_seconds)
        return self._super
