"""The writer's target permission check (issue 45 item 4): every role that may produce to the
scheduling topic must be able to produce to a target before the writer releases to it.

Pure engine (scheduler/target_permissions.py) on role sets, the intake's refusal (classify), and
the admin-REST adapter (scheduler/permission_source.py) on recorded Pulsar 4.0 answers."""
from __future__ import annotations

import json
from typing import Dict, FrozenSet, List, Optional, Tuple

import pytest

from pulsar_lifecycle.bucket.records import DelayedMessage
from pulsar_lifecycle.config.settings import ConfigError
from pulsar_lifecycle.deletion.ports import StorageError
from pulsar_lifecycle.deletion.storage.http import HttpResult
from pulsar_lifecycle.scheduler.config import parse_writer_config
from pulsar_lifecycle.scheduler.intake import Invalid, classify
from pulsar_lifecycle.scheduler.permission_source import AdminPermissionSource, admin_token, target_permission_check
from pulsar_lifecycle.scheduler.target_permissions import (
    PermissionsUnavailable,
    PermissionsUnreadable,
    ProducePermissions,
    TargetPermissionCheck,
    lacking_roles,
    produce_grants,
)

S = "persistent://acme/app/delayed-scheduling"
X = "persistent://acme/app/orders"
OUT = "persistent://acme/app/released"
DEL = "persistent://pulsar/system/__ledger_deletion-partition-0"


def perms(topic: str, *granted: str, admins: Tuple[str, ...] = ()) -> ProducePermissions:
    return ProducePermissions(topic, frozenset(granted), frozenset(admins))


# -- role sets ---------------------------------------------------------------------------------

def test_produce_grants_keep_roles_with_produce_only() -> None:
    ns = {"alice": ["produce", "consume"], "reader": ["consume"], "fn": ["functions"]}
    topic = {"bob": ["produce"], "carol": []}
    assert produce_grants(ns, topic, None) == {"alice", "bob"}


def test_every_producer_of_the_scheduling_topic_must_produce_to_the_target() -> None:
    s = perms(S, "alice", "bob")
    assert lacking_roles(s, perms(X, "alice", "bob", "zed")) == ()
    assert lacking_roles(s, perms(X, "bob")) == ("alice",)
    assert lacking_roles(s, perms(X)) == ("alice", "bob")


def test_tenant_admins_produce_to_their_tenant_and_count_as_producers() -> None:
    # Pulsar: an admin of a topic's tenant may produce to it (allowTopicOperationAsync asks
    # validateTenantAdminAccess first), so acme's admin is a producer of S ...
    s = perms(S, "alice", admins=("acme-admin",))
    # ... who may produce to X in the same tenant, and alice by a grant:
    assert lacking_roles(s, perms(X, "alice", admins=("acme-admin",))) == ()
    # ... but not to the deletion topic of tenant pulsar, where neither is admin nor granted.
    assert lacking_roles(s, perms(DEL, "deleter", admins=("ops",))) == ("acme-admin", "alice")
    # An admin of the target's tenant needs no grant there.
    assert lacking_roles(perms(S, "ops"), perms(DEL, admins=("ops",))) == ()


def test_super_users_are_left_out() -> None:
    s = perms(S, "alice", "root", admins=("root",))
    assert lacking_roles(s, perms(DEL, "alice"), super_users={"root"}) == ()
    assert lacking_roles(s, perms(DEL, "alice")) == ("root",)  # when they are not known: counted


def test_wildcard_grants_match_literally() -> None:
    # With authorizationAllowWildcardsMatching a grant `app.*` covers every role starting with
    # `app.`: a set the writer cannot list, so only the same grant on the target covers it.
    assert lacking_roles(perms(S, "app.*"), perms(X, "app.*")) == ()
    assert lacking_roles(perms(S, "app.*"), perms(X, "app.orders")) == ("app.*",)
    # and a concrete producer is not assumed to be covered by a wildcard on the target (it is only
    # when the broker matches wildcards, which the admin API does not say).
    assert lacking_roles(perms(S, "app.orders"), perms(X, "app.*")) == ("app.orders",)
    # `*` granted on S: anyone may schedule, so X must be open to anyone too.
    assert lacking_roles(perms(S, "*"), perms(X, "alice")) == ("*",)
    assert lacking_roles(perms(S, "*"), perms(X, "*")) == ()


def test_nobody_granted_on_the_scheduling_topic_refuses_nothing() -> None:
    assert lacking_roles(perms(S), perms(X)) == ()


# -- the cached check --------------------------------------------------------------------------

class FakeSource:
    def __init__(self, topics: Dict[str, object], supers: FrozenSet[str] = frozenset()) -> None:
        self.topics = topics
        self.supers = supers
        self.calls: List[str] = []

    def produce_permissions(self, topic: str) -> ProducePermissions:
        self.calls.append(topic)
        got = self.topics[topic]
        if isinstance(got, Exception):
            raise got
        assert isinstance(got, ProducePermissions)
        return got

    def super_users(self) -> FrozenSet[str]:
        return self.supers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_refusal_names_the_roles_and_the_topics_and_is_cached_for_the_ttl() -> None:
    src = FakeSource({S: perms(S, "alice", "bob"), X: perms(X, "bob"), OUT: perms(OUT, "alice", "bob")})
    clock = Clock()
    check = TargetPermissionCheck(src, S, OUT, ttl_seconds=60, clock=clock)
    reason = check.refusal(X)
    assert reason is not None
    assert "['alice']" in reason and S in reason and X in reason and "__pl_target__" in reason
    assert check.refusal(None) is None  # the output: both may produce there
    assert check.refusal(X) == reason
    assert src.calls == [S, X, OUT]  # S read once, each target once
    # A grant takes effect once the TTL has passed.
    src.topics[X] = perms(X, "alice", "bob")
    clock.now += 59
    assert check.refusal(X) == reason
    clock.now += 2
    assert check.refusal(X) is None


def test_unreadable_target_is_refused_unavailable_raises() -> None:
    src = FakeSource({S: perms(S, "alice"), X: PermissionsUnreadable("admin GET ... answered 403"),
                      OUT: PermissionsUnavailable("no endpoint reachable")})
    check = TargetPermissionCheck(src, S, OUT, ttl_seconds=60, clock=Clock())
    reason = check.refusal(X)
    assert reason is not None and "cannot be read" in reason and "403" in reason
    with pytest.raises(PermissionsUnavailable):  # nothing decided: the batch is redelivered
        check.refusal(None)


def test_super_users_from_the_source_are_not_asked_for() -> None:
    src = FakeSource({S: perms(S, "alice", "root"), X: perms(X, "alice")}, supers=frozenset({"root"}))
    assert TargetPermissionCheck(src, S, OUT, ttl_seconds=60, clock=Clock()).refusal(X) is None


# -- intake ------------------------------------------------------------------------------------

def _classify(props: dict, target_check=None):
    return classify(payload=b"p", properties=props, key=None, event_time=0, position=(7, 3, -1, -1), now_ms=1000,
                    max_delay_ms=10**9, allowed_target_prefixes=("persistent://acme/",), target_check=target_check)


def test_classify_refuses_what_the_check_refuses_and_keeps_the_prefix_rule_first() -> None:
    src = FakeSource({S: perms(S, "alice"), X: perms(X), OUT: perms(OUT, "alice")})
    check = TargetPermissionCheck(src, S, OUT, ttl_seconds=60, clock=Clock()).refusal
    refused = _classify({"__pl_deliver_at__": "2000", "__pl_target__": X}, check)
    assert isinstance(refused, Invalid) and "['alice']" in refused.reason
    assert isinstance(_classify({"__pl_deliver_at__": "2000"}, check), DelayedMessage)  # the output is allowed
    outside = _classify({"__pl_deliver_at__": "2000", "__pl_target__": "persistent://other/x/y"}, check)
    assert isinstance(outside, Invalid) and "allowedTargetPrefix" in outside.reason
    # Without a check (the default; pulsar-lite, an open broker): as before.
    assert isinstance(_classify({"__pl_deliver_at__": "2000", "__pl_target__": X}), DelayedMessage)
    # A cancel is not a release: not checked (anyone who may produce to S may cancel on it).
    assert type(_classify({"__pl_cancel__": "5:6"}, check)).__name__ == "Cancel"


# -- the admin REST adapter --------------------------------------------------------------------

class FakeEndpoints:
    """Answers as Pulsar 4.0's admin API does (recorded shapes), per path."""

    def __init__(self, answers: Dict[str, Tuple[int, object]]) -> None:
        self.answers = answers
        self.paths: List[str] = []
        self.unreachable = False

    def request(self, method: str, path: str, params: Optional[dict] = None, **kw: object) -> HttpResult:
        self.paths.append(path)
        if self.unreachable:
            raise StorageError(f"{method} {path}: no endpoint reachable")
        status, body = self.answers.get(path, (404, {"reason": "Topic not found"}))
        return HttpResult(status, json.dumps(body))

    def close(self) -> None:
        pass


def test_adapter_unions_namespace_topic_and_partitioned_topic_grants_and_tenant_admins() -> None:
    ep = FakeEndpoints({
        "/admin/v2/namespaces/acme/app/permissions": (200, {"ns-role": ["produce", "consume"], "r": ["consume"]}),
        "/admin/v2/persistent/acme/app/sched-partition-1/permissions": (200, {"ns-role": ["produce"], "p1": ["produce"]}),
        "/admin/v2/persistent/acme/app/sched/permissions": (200, {"base": ["produce"]}),
        "/admin/v2/tenants/acme": (200, {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}),
    })
    got = AdminPermissionSource(ep).produce_permissions("persistent://acme/app/sched-partition-1")  # type: ignore[arg-type]
    assert got.granted == {"ns-role", "p1", "base"} and got.tenant_admins == {"acme-admin"}
    # A topic that does not exist yet: the namespace's grants alone.
    got = AdminPermissionSource(ep).produce_permissions("persistent://acme/app/new")  # type: ignore[arg-type]
    assert got.granted == {"ns-role"}


def test_adapter_errors_unreadable_or_unavailable() -> None:
    ep = FakeEndpoints({"/admin/v2/namespaces/acme/app/permissions": (403, {"reason": "Unauthorized"})})
    with pytest.raises(PermissionsUnreadable, match="403"):
        AdminPermissionSource(ep).produce_permissions(X)  # type: ignore[arg-type]
    ep = FakeEndpoints({"/admin/v2/namespaces/acme/app/permissions": (503, {})})
    with pytest.raises(PermissionsUnavailable, match="503"):
        AdminPermissionSource(ep).produce_permissions(X)  # type: ignore[arg-type]
    ep.unreachable = True
    with pytest.raises(PermissionsUnavailable, match="no endpoint"):
        AdminPermissionSource(ep).produce_permissions(X)  # type: ignore[arg-type]


def test_adapter_reads_super_users_only_when_answered() -> None:
    ep = FakeEndpoints({"/admin/v2/brokers/configuration/runtime": (200, {"superUserRoles": "[root, admin]"})})
    assert AdminPermissionSource(ep).super_users() == {"root", "admin"}  # type: ignore[arg-type]
    ep = FakeEndpoints({"/admin/v2/brokers/configuration/runtime": (403, {})})
    assert AdminPermissionSource(ep).super_users() == frozenset()  # type: ignore[arg-type]


class Ctx:
    def __init__(self, secrets: Dict[str, str]) -> None:
        self.secrets = secrets

    def get_secret(self, name: str) -> Optional[str]:
        return self.secrets.get(name)


def test_config_modes() -> None:
    off = parse_writer_config({"targetPermissionCheck": "off", "pulsarAdminUrl": "http://127.0.0.1:1"})
    assert target_permission_check(off, Ctx({}), S, OUT) is None
    auto = parse_writer_config({})
    assert auto.target_permission_check == "auto" and target_permission_check(auto, Ctx({}), S, OUT) is None
    with pytest.raises(ConfigError, match="pulsarAdminUrl"):
        target_permission_check(parse_writer_config({"targetPermissionCheck": "on"}), Ctx({}), S, OUT)
    with pytest.raises(ConfigError, match="targetPermissionCheck"):
        parse_writer_config({"targetPermissionCheck": "maybe"})
    assert admin_token(Ctx({"T": "jwt"}), "T") == "jwt" and admin_token(Ctx({}), None) is None
    with pytest.raises(ConfigError, match="adminTokenSecret: secret 'T' is not set"):
        admin_token(Ctx({}), "T")
