"""No role reaches through the writer what it may not reach itself (issue 45 item 4), on a secured
real Pulsar standalone (TLS, tokens, authorization; support/secured.py).

The writer runs in-process (LocalRunner) as the super user, with the shipped config's
allowedTargetPrefix (`persistent://public/default/` and the deletion topics), its admin URL and the
super user's token as the function secret `adminTokenSecret` names; targetPermissionCheck is the
default `auto`, which turns on because the broker refuses an anonymous admin read.

Bad actors and what refuses them:
- alice may produce to the scheduling topic S only; her message to X is refused to S-INVALID naming
  her, nothing reaches X. Before the check, the writer (a super user) released it into X: this test
  fails on that code.
- the same with a deletion request released into pulsar/system/__ledger_deletion-partition-0 (fails
  on that code the same way).
- alice producing directly to the deletion topic and to another tenant's scheduling (cancel) topic
  and -CANCEL-REPLY topic: the broker refuses each (shown here, not this project's code).
Then alice's grant on S is revoked: bob, who may produce to S and to X, has his message released to X.

One standalone for the module; about a minute with its start.
"""
from __future__ import annotations

import json
import time
import urllib.error
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import ClientSettings, PermissionRefused, receive_messages
from pulsar_lifecycle.runtime.connect import open_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.runtime.pulsar_security import AUTH_TOKEN_PLUGIN
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP, cancel_reply_topic
from support.secured import SECURED_GROUP, admin_call, grant
from support.writer import writer_spec

pytestmark = [pytest.mark.pulsar_only("a secured real Pulsar standalone"), pytest.mark.xdist_group(SECURED_GROUP)]

DELETION = "persistent://pulsar/system/__ledger_deletion-partition-0"
ERROR_PROP = "__pl_error__"


def _settings(sa, role: str) -> ClientSettings:
    return ClientSettings(service_url=sa.service_url_tls, use_tls=True, tls_trust_cert_path=str(sa.ca_path),
                          auth_plugin=AUTH_TOKEN_PLUGIN, auth_params=f"token:{sa.token(role)}")


def _put_ignoring_conflict(sa, path: str, body: object = None) -> None:
    try:
        admin_call(sa, "PUT", path, body)
    except urllib.error.HTTPError as exc:
        if exc.code not in (204, 409):
            raise


def _schedule(client: pulsar.Client, sched: str, target: str, body: bytes) -> None:
    producer = client.create_producer(sched)
    try:
        producer.send(body, properties={DELIVER_AT_PROP: str(int(time.time() * 1000) + 500), TARGET_PROP: target})
    finally:
        producer.close()


def _bodies(msgs: List[pulsar.Message]) -> List[bytes]:
    return [m.data() for m in msgs]


def test_a_role_gets_nothing_released_where_it_may_not_produce(secured_pulsar, tmp_path, unique, monkeypatch) -> None:
    sa = secured_pulsar
    cluster = json.loads(admin_call(sa, "GET", "/admin/v2/clusters"))[0]
    _put_ignoring_conflict(sa, "/admin/v2/tenants/pulsar", {"adminRoles": [], "allowedClusters": [cluster]})
    _put_ignoring_conflict(sa, "/admin/v2/namespaces/pulsar/system")
    other_tenant = f"other{unique}".replace("-", "")[:40]
    _put_ignoring_conflict(sa, f"/admin/v2/tenants/{other_tenant}",
                           {"adminRoles": ["other-admin"], "allowedClusters": [cluster]})
    _put_ignoring_conflict(sa, f"/admin/v2/namespaces/{other_tenant}/app")

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(sa.ca_path))  # the writer's admin calls trust the test CA
    spec, sched = writer_spec(unique, tmp_path, pulsarAdminUrl=sa.admin_url_tls, adminTokenSecret="ADMIN_TOKEN",
                              targetPermissionCacheSeconds=1, tickMode="runner")
    spec.secrets = {"ADMIN_TOKEN": sa.token(sa.super_user)}
    x = f"persistent://public/default/x-{unique}"
    grant(sa, sched, "alice", ["produce"])
    grant(sa, sched, "bob", ["produce"])
    grant(sa, x, "bob", ["produce"])
    # The writer's outputs exist before it starts (its -INVALID topic is read below).
    for t in (spec.output, f"{sched}-INVALID"):
        _put_ignoring_conflict(sa, "/admin/v2/persistent/" + t.replace("persistent://", ""))

    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=sa.service_url_tls, client=_settings(sa, sa.super_user),
                                               data_dir=tmp_path / "run")).start()
    alice = open_client(_settings(sa, "alice"), 10.0)
    bob = open_client(_settings(sa, "bob"), 10.0)
    admin = open_client(_settings(sa, sa.super_user), 10.0)
    try:
        # The broker refuses alice everything outside S (not this project's code).
        for topic in (x, DELETION, f"persistent://{other_tenant}/app/delayed-scheduling",
                      cancel_reply_topic(f"persistent://{other_tenant}/app/delayed-scheduling"),
                      cancel_reply_topic(sched)):
            with pytest.raises(PermissionRefused, match=f"role 'alice'.*produce to {topic}"):
                alice.create_producer(topic)

        # Through the writer: refused at intake, the roles named; fails on the code before the check.
        _schedule(alice, sched, x, b"alice-to-x")
        _schedule(alice, sched, DELETION, b"alice-to-deletion")
        # bob may produce to X, but alice may schedule on S too: the capability decides, not the sender.
        _schedule(bob, sched, x, b"bob-to-x-while-alice-may-schedule")
        invalid = receive_messages(admin, f"{sched}-INVALID", "check", 3, 60)
        reasons = {m.data(): m.properties().get(ERROR_PROP, "") for m in invalid}
        assert set(reasons) == {b"alice-to-x", b"alice-to-deletion", b"bob-to-x-while-alice-may-schedule"}, reasons
        assert "['alice']" in reasons[b"alice-to-x"] and x in reasons[b"alice-to-x"]
        assert "['alice']" in reasons[b"bob-to-x-while-alice-may-schedule"]
        assert "['alice', 'bob']" in reasons[b"alice-to-deletion"] and DELETION in reasons[b"alice-to-deletion"]

        # Alice no longer schedules on S: bob, who may produce to X himself, has his message released.
        admin_call(sa, "DELETE", "/admin/v2/persistent/" + sched.replace("persistent://", "") + "/permissions/alice")
        time.sleep(1.5)  # targetPermissionCacheSeconds=1
        _schedule(bob, sched, x, b"bob-to-x")
        released = receive_messages(admin, x, "check", 2, 30)
        assert _bodies(released) == [b"bob-to-x"], "only bob's message, once, and nothing of alice's"
        assert receive_messages(admin, DELETION, "check", 1, 3) == []
    finally:
        for c in (alice, bob, admin):
            c.close()
        runner.stop()


def test_with_the_check_off_the_writer_is_the_deputy_it_was(secured_pulsar, tmp_path, unique) -> None:
    """targetPermissionCheck=off is the writer before the check: alice, refused on X by the broker,
    has her scheduled message released into X with the writer's (super user's) role. The abuse the
    test above shows refused."""
    sa = secured_pulsar
    spec, sched = writer_spec(unique, tmp_path, targetPermissionCheck="off", tickMode="runner")
    x = f"persistent://public/default/x-{unique}"
    grant(sa, sched, "alice", ["produce"])
    _put_ignoring_conflict(sa, "/admin/v2/persistent/" + x.replace("persistent://", ""))
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=sa.service_url_tls, client=_settings(sa, sa.super_user),
                                               data_dir=tmp_path / "run")).start()
    alice = open_client(_settings(sa, "alice"), 10.0)
    admin = open_client(_settings(sa, sa.super_user), 10.0)
    try:
        with pytest.raises(PermissionRefused):
            alice.create_producer(x)
        _schedule(alice, sched, x, b"alice-to-x")
        assert _bodies(receive_messages(admin, x, "check", 1, 60)) == [b"alice-to-x"]
    finally:
        for c in (alice, admin):
            c.close()
        runner.stop()
