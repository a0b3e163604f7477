"""No role reaches through the DelayLevelSyncer what it may not reach itself (issue 45 item 4, the
syncer's part), on a secured real Pulsar standalone (TLS, tokens, authorization; support/secured.py).

The syncer runs in-process (LocalRunner) as the super user, forwarding to the writer's scheduling
topic S (no writer runs: S is read directly), with its admin URL and the super user's token as the
function secret `adminTokenSecret` names; targetPermissionCheck is the default `auto`, which turns on
because the broker refuses an anonymous admin read.

Bad actors and what refuses them:
- alice may produce to the delay-level topic D only; the broker refuses her a producer on X. Her
  message parked on D for X goes to D-DLQ with the reason naming her and is acked; nothing reaches S.
  Before the check the syncer (a super user) forwarded it to S, and the writer, whose producers of S
  are the syncer and bob, released it into X: this test fails on that code.
- bob, who may produce to D and X, parks for X while alice may park on D too: refused naming alice
  (the capability decides, not the sender).
Then alice's grant on D is revoked: bob's message to X is forwarded to S.

One standalone for the module; about a minute with its start.
"""
from __future__ import annotations

import json
import time
import urllib.error

import pulsar
import pytest
import yaml

from pulsar_lifecycle.config.function_config import spec_from_config
from pulsar_lifecycle.delaylevel.rule import BASE_PROP, LEVEL_PROP, dead_letter_topic, partition_topic, tick_topic
from pulsar_lifecycle.runtime.client import ClientSettings, PermissionRefused, receive_messages
from pulsar_lifecycle.runtime.connect import open_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.runtime.pulsar_security import AUTH_TOKEN_PLUGIN
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP, TICK_PROP
from support.paths import REPO
from support.secured import SECURED_GROUP, admin_call, grant

pytestmark = [pytest.mark.pulsar_only("a secured real Pulsar standalone"), pytest.mark.xdist_group(SECURED_GROUP)]

ERROR_PROP = "__pl_error__"
UNIT_S, MAX_DELAY_S = 2, 20  # 10 delay-level partitions


def _settings(sa, role: str) -> ClientSettings:
    return ClientSettings(service_url=sa.service_url_tls, use_tls=True, tls_trust_cert_path=str(sa.ca_path),
                          auth_plugin=AUTH_TOKEN_PLUGIN, auth_params=f"token:{sa.token(role)}")


def _path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.replace("persistent://", "")


def _put_ignoring_conflict(sa, path: str, body: object = None) -> None:
    try:
        admin_call(sa, "PUT", path, body)
    except urllib.error.HTTPError as exc:
        if exc.code not in (204, 409):
            raise


def _park(client: pulsar.Client, dl: str, target: str, body: bytes) -> None:
    """Park a message on partition 0 of `dl` as DelayLevelProducer does (forwarded ~1.5 s later)."""
    now = int(time.time() * 1000)
    producer = client.create_producer(partition_topic(dl, 0))
    try:
        producer.send(body, properties={DELIVER_AT_PROP: str(now + 2600), BASE_PROP: str(now), LEVEL_PROP: "0",
                                        TARGET_PROP: target})
    finally:
        producer.close()


def _syncer_spec(unique: str, dl: str, sched: str, sa):
    cfg = yaml.safe_load((REPO / "function-configs" / "delay-level-syncer.yaml").read_text())
    cfg["inputSpecs"] = {tick_topic(dl): {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg.update(name=f"dlsec-{unique[-8:]}", subName=f"dlsec-{unique[-8:]}")
    cfg["userConfig"].update(delayLevelTopic=dl, schedulingTopic=sched, tickTopic=tick_topic(dl), tickMode="hold",
                             partitionBy="SECONDS", unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=MAX_DELAY_S,
                             lookaheadMillis=500, partitionDiscoverySeconds=0, pulsarAdminUrl=sa.admin_url_tls,
                             adminTokenSecret="ADMIN_TOKEN", targetPermissionCacheSeconds=1)
    spec = spec_from_config(cfg)
    spec.secrets = {"ADMIN_TOKEN": sa.token(sa.super_user)}
    return spec


def test_a_role_gets_nothing_forwarded_where_it_may_not_produce(secured_pulsar, tmp_path, unique, monkeypatch) -> None:
    sa = secured_pulsar
    ns = "persistent://public/default"
    dl, sched, x = f"{ns}/dl-{unique}", f"{ns}/sched-{unique}", f"{ns}/x-{unique}"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(sa.ca_path))  # the syncer's admin calls trust the test CA
    admin_call(sa, "PUT", _path(dl) + "/partitions", MAX_DELAY_S // UNIT_S)
    for role in ("alice", "bob"):
        admin_call(sa, "POST", _path(dl) + f"/permissions/{role}", ["produce"])
    grant(sa, x, "bob", ["produce"])
    for t in (sched, dead_letter_topic(dl)):
        _put_ignoring_conflict(sa, _path(t))
    assert json.loads(admin_call(sa, "GET", _path(dl) + "/permissions")).keys() >= {"alice", "bob"}

    runner = LocalRunner(_syncer_spec(unique, dl, sched, sa),
                         LocalRunOptions(broker_service_url=sa.service_url_tls, client=_settings(sa, sa.super_user),
                                         data_dir=tmp_path / "run")).start()
    alice = open_client(_settings(sa, "alice"), 10.0)
    bob = open_client(_settings(sa, "bob"), 10.0)
    admin = open_client(_settings(sa, sa.super_user), 10.0)
    try:
        with pytest.raises(PermissionRefused, match=f"role 'alice'.*produce to {x}"):
            alice.create_producer(x)  # the broker refuses alice on X (not this project's code)
        admin.create_producer(tick_topic(dl)).send(b"tick", properties={TICK_PROP: "0"})

        _park(alice, dl, x, b"alice-to-x")
        _park(bob, dl, x, b"bob-to-x-while-alice-may-park")
        letters = receive_messages(admin, dead_letter_topic(dl), "check", 2, 60)
        reasons = {m.data(): m.properties().get(ERROR_PROP, "") for m in letters}
        assert set(reasons) == {b"alice-to-x", b"bob-to-x-while-alice-may-park"}, reasons
        for why in reasons.values():
            assert "['alice']" in why and x in why and f"the delay-level topic {dl}" in why, why
        assert receive_messages(admin, sched, "check", 1, 3) == [], "nothing of theirs on S"

        # Alice no longer parks on D: bob, who may produce to X himself, has his message forwarded.
        admin_call(sa, "DELETE", _path(dl) + "/permissions/alice")
        time.sleep(1.5)  # targetPermissionCacheSeconds=1
        _park(bob, dl, x, b"bob-to-x")
        forwarded = receive_messages(admin, sched, "check", 2, 30)
        assert [(m.data(), m.properties().get(TARGET_PROP)) for m in forwarded] == [(b"bob-to-x", x)]
        assert receive_messages(admin, dead_letter_topic(dl), "check", 1, 1) == [], "no further dead letter"
    finally:
        for c in (alice, bob, admin):
            c.close()
        runner.stop()
