"""A secured Apache Pulsar standalone (TLS, token authentication, authorization) and every
command that connects to it: a missing or refused credential is one line naming the URL within
seconds (not the client's 15-30 s timeout), a refused permission names the role and the topic,
and a client.conf or the flags connect.

One standalone for the module (support/secured.py); each test well under a minute.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import ClientSettings, PermissionRefused, receive_messages
from pulsar_lifecycle.runtime.connect import AuthenticationRefused, TlsRefused, open_client
from pulsar_lifecycle.runtime.pulsar_security import AUTH_TOKEN_PLUGIN
from support.cli import CLI, assert_no_client_log_lines, assert_one_line_error, cli_env, run_cli
from support.paths import REPO
from support.secured import SECURED_GROUP, grant

pytestmark = [pytest.mark.pulsar_only("a secured real Pulsar standalone"), pytest.mark.xdist_group(SECURED_GROUP)]

CONFIGS = REPO / "function-configs"
# Seconds a command may take from start to its one-line refusal: below the client's 30 s
# operation timeout, which a command that waits out the refusal (retrying the connection) reaches.
# Not a speed figure: the refusal comes in milliseconds after the CONNECT and a command takes 1-2 s
# (docs/security.md); the rest is room for Python and the CLI starting on 2 shared, loaded cores.
REFUSAL_BOUND_S = 25.0
MEASURED: Dict[str, float] = {}


def _settings(sa, role=None, **kw) -> ClientSettings:
    auth = {"auth_plugin": AUTH_TOKEN_PLUGIN, "auth_params": f"token:{sa.token(role)}"} if role else {}
    return ClientSettings(service_url=sa.service_url_tls, use_tls=True, tls_trust_cert_path=str(sa.ca_path),
                          **auth, **kw)


def test_refused_without_token_then_refused_to_produce_then_granted(secured_pulsar, unique) -> None:
    sa = secured_pulsar
    topic = f"persistent://public/default/granted-{unique}"
    t0 = time.monotonic()
    with pytest.raises(AuthenticationRefused, match=f"{re.escape(sa.service_url_tls)}.*no credentials"):
        open_client(_settings(sa), 10.0)
    assert time.monotonic() - t0 < 2.0
    forged = ClientSettings(service_url=sa.service_url_tls, tls_trust_cert_path=str(sa.ca_path),
                            auth_plugin=AUTH_TOKEN_PLUGIN,
                            auth_params="token:" + sa.token("alice")[:-4] + "AAAA")  # a signature that does not match
    with pytest.raises(AuthenticationRefused, match="role 'alice'"):
        open_client(forged, 10.0)
    # The plain-text port is secured too.
    with pytest.raises(AuthenticationRefused):
        open_client(sa.service_url, 10.0)

    client = open_client(_settings(sa, "alice"), 10.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(PermissionRefused, match=f"role 'alice'.*produce to {topic}") as err:
            client.create_producer(topic)
        assert isinstance(err.value, pulsar.AuthorizationError) and time.monotonic() - t0 < 2.0
        grant(sa, topic, "alice", ["produce"])
        producer = client.create_producer(topic)
        producer.send(b"granted")
        producer.close()
        with pytest.raises(PermissionRefused, match="consume from"):
            client.subscribe(topic, "alice-sub")
    finally:
        client.close()
    admin = open_client(_settings(sa, sa.super_user), 10.0)
    try:
        got = receive_messages(admin, topic, "check", 1, 20)
        assert [m.data() for m in got] == [b"granted"]
    finally:
        admin.close()


def test_untrusted_certificate_is_one_line(secured_pulsar) -> None:
    sa = secured_pulsar
    with pytest.raises(TlsRefused, match="CERTIFICATE_VERIFY_FAILED"):
        open_client(ClientSettings(service_url=sa.service_url_tls), 10.0)
    client = open_client(ClientSettings(service_url=sa.service_url_tls, tls_allow_insecure=True,
                                        auth_plugin="token", auth_params=f"token:{sa.token(sa.super_user)}"), 10.0)
    client.close()


def _commands(sa, tmp_path: Path) -> Dict[str, List[str]]:
    url, writer, syncer = sa.service_url_tls, str(CONFIGS / "bucket-snapshot-writer.yaml"), "none"
    return {
        "delayed send": ["delayed", "send", "persistent://public/default/orders", "hello", "--in", "30s",
                         "--service-url", url, "--writer-config", writer, "--syncer-config", syncer],
        "delayed cancel": ["delayed", "cancel", "5:12:0", "--no-wait", "--service-url", url, "--writer-config", writer,
                           "--syncer-config", syncer],
        "inspect syncer": ["inspect", "syncer", "--function-config-file", str(CONFIGS / "delay-level-syncer.yaml"),
                           "--service-url", url],
        "inspect deletion": ["inspect", "deletion", "--function-config-file",
                             str(CONFIGS / "ledger-deletion-worker.yaml"), "--service-url", url],
        "send-ticks": ["send-ticks", "--service-url", url, "--tick-topic", "persistent://public/default/ticks"],
        "deletion enqueue": ["deletion", "enqueue", "--topic", "public/default/t", "--ledger-id", "7",
                             "--send-delay-seconds", "0", "--service-url", url,
                             "--worker-config", str(CONFIGS / "ledger-deletion-worker.yaml")],
        "export-backlog": ["export-backlog", "--out", str(tmp_path / "backlog"), "--service-url", url,
                           "--topic", "persistent://public/default/delayed-scheduling", "--subscription", "s"],
    }


COMMANDS = ["delayed send", "delayed cancel", "inspect syncer", "inspect deletion", "send-ticks", "deletion enqueue",
            "export-backlog"]


@pytest.mark.parametrize("name", COMMANDS)
def test_missing_credential_is_one_line_at_once(secured_pulsar, tmp_path: Path, name: str) -> None:
    sa = secured_pulsar
    args = _commands(sa, tmp_path)[name] + ["--tls-trust-cert-path", str(sa.ca_path)]
    t0 = time.monotonic()
    res = run_cli(*args, tmp_path=tmp_path, timeout=60)
    MEASURED[name] = elapsed = time.monotonic() - t0
    line = assert_one_line_error(res, sa.service_url_tls, "refused authentication", "no credentials")
    assert_no_client_log_lines(res)
    assert elapsed < REFUSAL_BOUND_S, (name, elapsed, line)
    # A token the broker did not sign: refused the same way, naming the role it claims.
    res = run_cli(*args, "--auth-plugin", AUTH_TOKEN_PLUGIN, "--auth-params",
                  "token:" + sa.token("mallory")[:-4] + "AAAA", tmp_path=tmp_path, timeout=60)
    assert_one_line_error(res, sa.service_url_tls, "refused authentication", "mallory")


def test_refused_permission_names_role_and_topic(secured_pulsar, tmp_path: Path) -> None:
    sa = secured_pulsar
    args = _commands(sa, tmp_path)["delayed send"]
    t0 = time.monotonic()
    res = run_cli(*args, "--tls-trust-cert-path", str(sa.ca_path), "--auth-plugin", AUTH_TOKEN_PLUGIN,
                  "--auth-params", f"token:{sa.token('bob')}", tmp_path=tmp_path, timeout=60)
    assert_one_line_error(res, "role 'bob'", "produce to persistent://public/default/delayed-scheduling")
    assert_no_client_log_lines(res)
    assert time.monotonic() - t0 < REFUSAL_BOUND_S


def test_client_conf_connects_and_flags_win(secured_pulsar, tmp_path: Path, unique: str) -> None:
    sa = secured_pulsar
    conf = tmp_path / "client.conf"
    conf.write_text(sa.security.client_conf(service_url=sa.service_url_tls, admin_url=sa.admin_url_tls))
    ticks = f"persistent://public/default/ticks-{unique}"
    # No --service-url: brokerServiceUrl, the token and the CA from PULSAR_CLIENT_CONF.
    res = subprocess.run([*CLI, "send-ticks", "--tick-topic", ticks, "--count", "2"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env=cli_env(tmp_path, PULSAR_CLIENT_CONF=str(conf)))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "sent 2 tick(s)" in res.stdout
    # --auth-params wins over the file's authParams: bob may not produce there.
    res = run_cli("send-ticks", "--tick-topic", ticks, "--client-conf", str(conf), "--auth-params",
                  f"token:{sa.token('bob')}", tmp_path=tmp_path, timeout=60)
    assert_one_line_error(res, "role 'bob'", ticks)
    # The writer's scheduling topic gets what `delayed send` sends as the super user.
    res = run_cli("delayed", "send", f"persistent://public/default/out-{unique}", "hi", "--in", "60s",
                  "--writer-config", str(CONFIGS / "bucket-snapshot-writer.yaml"), "--syncer-config", "none",
                  "--client-conf", str(conf), tmp_path=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "cancel: pulsar-lifecycle delayed cancel" in res.stderr


def test_secured_function_worker_authenticates_and_authorizes(tmp_path: Path) -> None:
    """The standalone's function worker on the secured cluster: its REST API wants a token, a
    role without the `functions` permission is refused, the super user is served; instances
    would run with their submitter's token (ClearTextFunctionTokenAuthProvider in its config)."""
    import json as _json
    import urllib.error
    import urllib.request

    from pulsar_lifecycle.runtime.pulsar_release import resolve
    from pulsar_lifecycle.runtime.pulsar_security import FUNCTION_AUTH_PROVIDER
    from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone, SecuritySetup
    from support.broker_fixtures import broker_kinds
    from support.real_worker import python_instance_dir, worker_env

    if "pulsar" not in broker_kinds():
        pytest.skip("not on pulsar: TEST_BROKERS leaves real Pulsar out")
    # The process runtime wants a Python instance to start with, even with no function yet.
    instance = python_instance_dir(resolve(), tmp_path / "python-instance")
    sa = PulsarStandalone(data_dir=tmp_path / "pulsar", function_worker=True, security=SecuritySetup(),
                          worker_config={"pythonInstanceLocation": instance}, env=worker_env())
    sa.start()
    try:
        worker_yml = _json.loads((sa.data_dir / "functions_worker.yml").read_text())
        assert worker_yml["functionAuthProviderClassName"] == FUNCTION_AUTH_PROVIDER
        assert worker_yml["authenticationEnabled"] and worker_yml["authorizationEnabled"]

        def status(headers: Dict[str, str]) -> int:
            req = urllib.request.Request(f"{sa.admin_url_tls}/admin/v3/functions/public/default", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=10, context=sa.ssl_context()) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code

        deadline = time.monotonic() + 120
        while status(sa.admin_headers()) != 200:  # 503 while the worker initializes
            assert time.monotonic() < deadline, "the secured worker did not answer within 120 s"
            time.sleep(1)
        assert status({}) == 401
        assert status({"Authorization": f"Bearer {sa.token('alice')}"}) in (401, 403)
    finally:
        sa.stop()
