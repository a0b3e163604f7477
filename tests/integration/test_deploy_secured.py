"""The shipped set deployed on a SECURED Apache Pulsar 4.0.0 standalone (TLS on both ports, token
authentication, authorization, super user `superuser`) through its real function worker and the
real `pulsar-admin` (pulsar-client-tools 4.0.8) as an operator types it on such a cluster:

    pulsar-admin --admin-url https://127.0.0.1:<port> \\
      --auth-plugin org.apache.pulsar.client.impl.auth.AuthenticationToken --auth-params token:<jwt> \\
      --tls-trust-cert-path ca.cert.pem functions create --py <wheel> --function-config-file <shipped yaml>

The worker (ClearTextFunctionTokenAuthProvider) runs each instance with its submitter's token over
pulsar+ssl://. The shipped YAMLs are deployed unchanged but for what the unsecured deploy test
changes too (the deletion worker's admin and bookie URLs, shorter delays and delay-level units,
parallelism 1 for the 2 shared cores) and the deletion worker's admin token, which comes from a
function secret: userConfig `adminTokenSecret: pulsar-admin-token` and `secrets:
{pulsar-admin-token: <jwt>}` in the config file. Pulsar's process runtime uses its default
secrets-provider configurator (DefaultSecretsProviderConfigurator: for Python instances
`secretsprovider.ClearTextSecretsProvider`, the value in `secrets` is the secret itself).

Each function does its job end to end: a delayed message released once (writer), a parked one
forwarded and released (syncer + writer), an orphan ledger deleted and a live one kept (deletion
worker, its in-use check on the https admin API with the secret's token). One secured standalone
with its worker for the module.
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pulsar
import pytest
import requests
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.strategy import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.deletion.admin import AdminAccess, PulsarAdminClient
from pulsar_lifecycle.deletion.model import TopicRef
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient
from pulsar_lifecycle.packaging.zip_builder import build_wheel
from pulsar_lifecycle.runtime.client import ClientSettings
from pulsar_lifecycle.runtime.connect import open_client
from pulsar_lifecycle.runtime.pulsar_security import AUTH_TOKEN_PLUGIN
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.timing import DelayedProducer
from support.cli import CLI, assert_one_line_error, cli_env
from support.helpers import publish_all, wait_for, wait_value
from support.paths import REPO
from support.real_worker import PulsarAdmin, RealWorker, skip_unless_real_pulsar, start_secured_worker_standalone
from support.zookeeper import ZooKeeperClient, ledger_znode

pytestmark = [pytest.mark.pulsar_only("a secured real Pulsar standalone with its function worker"),
              pytest.mark.xdist_group("real-worker-secured")]

CONFIGS = REPO / "function-configs"
SECRET_NAME = "pulsar-admin-token"
UNIT_S = 5  # the syncer's and the producer's delay-level unit (the shipped one is a day)
MAX_DELAY_S = 600
TIMES: Dict[str, float] = {}


@dataclass
class SecuredDeploy:
    """The shipped set on a secured worker: config file name -> fqfn, and the configs deployed."""

    worker: RealWorker
    functions: Dict[str, str]
    configs: Dict[str, dict]
    client_conf: Path

    @property
    def standalone(self) -> PulsarStandalone:
        return self.worker.standalone

    def client(self) -> pulsar.Client:
        """A client as the super user over pulsar+ssl:// (the conventions of every command)."""
        sa = self.standalone
        return open_client(ClientSettings(service_url=sa.service_url_tls, use_tls=True,
                                          tls_trust_cert_path=str(sa.ca_path), auth_plugin=AUTH_TOKEN_PLUGIN,
                                          auth_params=f"token:{sa.token(sa.super_user)}"), 10.0)

    def logs(self, name: str) -> str:
        fqfn = self.functions[name]
        n = int(self.configs[name].get("parallelism") or 1)
        return "\n".join(self.worker.instance_log_text(fqfn, i) for i in range(n))


def _deployed_configs(sa: PulsarStandalone) -> Dict[str, dict]:
    """The shipped YAMLs with the keys the test changes (see the module docstring)."""
    out = {}
    for name in ("bucket-snapshot-writer.yaml", "delay-level-syncer.yaml", "ledger-deletion-worker.yaml"):
        out[name] = load_function_config(CONFIGS / name)
    out["delay-level-syncer.yaml"]["userConfig"].update(
        partitionBy="SECONDS", unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=MAX_DELAY_S, lookaheadMillis=3000,
        partitionDiscoverySeconds=1)
    deleter = out["ledger-deletion-worker.yaml"]
    deleter["parallelism"] = 1
    deleter["userConfig"].update(pulsarAdminUrl=sa.admin_url_tls, bookieHttpUrls=[sa.bookie_http_url],
                                 sendDelaySeconds=2, reconsumeLaterSeconds=3, ledgersCacheTtlSeconds=1,
                                 adminTokenSecret=SECRET_NAME)
    deleter["secrets"] = {SECRET_NAME: sa.token(sa.super_user)}
    return out


@pytest.fixture(scope="module")
def secured_deploy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredDeploy]:
    skip_unless_real_pulsar()
    d = tmp_path_factory.mktemp("secured-worker")
    t0 = time.monotonic()
    # The deletion worker's admin calls (Python requests) trust the cluster's CA through the
    # instance's environment, which the process runtime inherits from the worker.
    ca = d / "pulsar" / "security" / "ca.cert.pem"
    sa = start_secured_worker_standalone(d, env={"REQUESTS_CA_BUNDLE": str(ca)})
    try:
        assert sa.ca_path == ca
        TIMES["standalone and worker up"] = time.monotonic() - t0
        admin = PulsarAdmin.secured(sa, d / "admin")
        worker = RealWorker(sa, admin)
        wheel = build_wheel(REPO, d / "wheel")
        configs = _deployed_configs(sa)
        functions = {}
        t1 = time.monotonic()
        for name, cfg in configs.items():
            path = d / name
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            assert admin.create(wheel, path) == "Created successfully"
            functions[name] = f"{cfg['tenant']}/{cfg['namespace']}/{cfg['name']}"
        for name, fqfn in functions.items():
            admin.wait_running(fqfn, int(configs[name].get("parallelism") or 1), timeout_s=300)
        TIMES["functions create + running"] = time.monotonic() - t1
        conf = d / "client.conf"
        conf.write_text(sa.security.client_conf(service_url=sa.service_url_tls, admin_url=sa.admin_url_tls))
        yield SecuredDeploy(worker, functions, configs, conf)
    finally:
        sa.stop(remove_data=True)
        print("secured deploy timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items()))


def test_instances_run_with_the_submitters_token_over_tls(secured_deploy: SecuredDeploy) -> None:
    sa = secured_deploy.standalone
    for fqfn in secured_deploy.functions.values():
        _pid, argv = secured_deploy.worker.instance_process(fqfn, 0)
        assert argv[argv.index("--pulsar_serviceurl") + 1] == sa.service_url_tls, argv
        assert argv[argv.index("--client_auth_plugin") + 1] == AUTH_TOKEN_PLUGIN, argv
        assert argv[argv.index("--client_auth_params") + 1] == f"token:{sa.token(sa.super_user)}"
        assert argv[argv.index("--tls_trust_cert_path") + 1] == str(sa.ca_path)
    # The worker refuses a client with no token.
    res = subprocess.run([*PulsarAdmin(sa.admin_url_tls, sa.service_url_tls, sa.data_dir / "anon-admin",
                                       global_args=("--tls-trust-cert-path", str(sa.ca_path))).command(),
                          "functions", "list", "--tenant", "public", "--namespace", "default"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and ("401" in out or "Unauthorized" in out or "Authentication required" in out), out


def _drain(consumer: pulsar.Consumer, want: int, timeout_s: float, until_ms: int = 0) -> List[Tuple[str, int]]:
    got: List[Tuple[str, int]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (len(got) < want or time.time() * 1000 < until_ms):
        try:
            msg = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            continue
        got.append((msg.data().decode(), msg.publish_timestamp()))
        consumer.acknowledge(msg)
    return got


def _check_once(got: List[Tuple[str, int]], due: Dict[str, int]) -> None:
    counts: Dict[str, int] = {}
    for payload, _at in got:
        counts[payload] = counts.get(payload, 0) + 1
    missing = sorted(set(due) - set(counts))
    twice = sorted(p for p, n in counts.items() if n > 1)
    early = sorted(p for p, at in got if p in due and at < due[p])
    unexpected = sorted(set(counts) - set(due))
    assert not (missing or twice or early or unexpected), (missing[:5], twice[:5], early[:5], unexpected[:5])


@pytest.mark.timeout(300)
def test_writer_releases_a_delayed_message_once(secured_deploy: SecuredDeploy, unique: str) -> None:
    cfg = secured_deploy.configs["bucket-snapshot-writer.yaml"]
    t0 = time.monotonic()
    client = secured_deploy.client()
    try:
        releases = client.subscribe(cfg["output"], f"check-{unique}", initial_position=pulsar.InitialPosition.Latest)
        producer = client.create_producer(cfg["userConfig"]["schedulingTopic"])
        due_ms = int(time.time() * 1000) + 3000
        due = {}
        for i in range(10):
            payload = f"{unique}-{i}"
            producer.send(payload.encode(), properties={"__pl_deliver_at__": str(due_ms)})
            due[payload] = due_ms
        got = [g for g in _drain(releases, len(due), 120, until_ms=due_ms + 3000) if g[0].startswith(unique)]
    finally:
        client.close()
    _check_once(got, due)
    TIMES["writer: 10 released once"] = time.monotonic() - t0


@pytest.mark.timeout(300)
def test_syncer_forwards_a_parked_message_and_the_writer_releases_it(secured_deploy: SecuredDeploy,
                                                                     unique: str) -> None:
    writer_cfg = secured_deploy.configs["bucket-snapshot-writer.yaml"]
    syncer_cfg = secured_deploy.configs["delay-level-syncer.yaml"]
    business = f"persistent://public/default/secured-business-{unique}"
    t0 = time.monotonic()
    client = secured_deploy.client()
    try:
        releases = client.subscribe(business, f"check-{unique}", initial_position=pulsar.InitialPosition.Earliest)
        strategy = DelayLevelTopicPartitionStrategy(MAX_DELAY_S, PartitionBy.SECONDS, unit_seconds=UNIT_S)
        near = DelayedProducer(client, scheduling_topic=writer_cfg["userConfig"]["schedulingTopic"])
        producer = DelayLevelProducer(client, business, near, strategy=strategy)
        assert producer.delay_level_topic == syncer_cfg["userConfig"]["delayLevelTopic"]
        now = int(time.time() * 1000)
        due: Dict[str, int] = {}
        for i in range(5):
            sent = producer.send(f"parked-{i}".encode(), deliver_at_ms=now + 15_000 + 100 * i)
            assert sent.parked, sent
            due[f"parked-{i}"] = now + 15_000 + 100 * i
        # The first parked message starts a fresh syncer (its tick); the cancel goes once it runs.
        wait_value("the syncer started", lambda: "event=delay_level_syncer_started"
                   in secured_deploy.logs("delay-level-syncer.yaml"), timeout_s=60)
        cancel_at = int(time.time() * 1000) + 12_000
        cancelled = producer.send(b"cancelled", deliver_at_ms=cancel_at)
        assert cancelled.parked
        producer.cancel(cancelled)
        got = _drain(releases, len(due), 120, until_ms=max(now + 20_000, cancel_at + 5000))
    finally:
        client.close()
    logs = secured_deploy.logs("delay-level-syncer.yaml")
    assert "cancelled" not in [p for p, _ in got], [ln for ln in logs.splitlines() if "cancel" in ln][-10:]
    _check_once(got, due)
    TIMES["syncer + writer: 5 parked forwarded and released once"] = time.monotonic() - t0


def _enqueue(deploy: SecuredDeploy, topic: TopicRef, ledger_id: int, cursor: str = "") -> None:
    """`pulsar-lifecycle deletion enqueue` with the cluster's client.conf (pulsar+ssl://, token, CA)."""
    which = ["--component", "MANAGED_CURSOR", "--cursor", cursor] if cursor else []
    res = subprocess.run([*CLI, "deletion", "enqueue", "--client-conf", str(deploy.client_conf),
                          "--topic", topic.short_name, "--ledger-id", str(ledger_id), *which, "--send-delay-seconds", "2",
                          "--worker-config", str(CONFIGS / "ledger-deletion-worker.yaml")],
                         cwd=deploy.client_conf.parent, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL, env=cli_env(deploy.client_conf.parent))
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"


@pytest.mark.timeout(400)
def test_orphan_deleted_with_the_admin_token_from_a_secret_and_a_live_ledger_kept(secured_deploy: SecuredDeploy,
                                                                                   unique: str) -> None:
    sa = secured_deploy.standalone
    t0 = time.monotonic()
    access = AdminAccess(sa.admin_url_tls, sa.token(sa.super_user), str(sa.ca_path), who=f"role {sa.super_user!r}")
    pa = PulsarAdminClient.connect([sa.admin_url_tls], timeout=30, access=access)
    bookie = BookieHttpClient.connect([sa.bookie_http_url])
    topic = TopicRef.parse(f"public/default/secured-ledgers-{unique}")
    https = {"headers": sa.admin_headers(), "verify": str(sa.ca_path), "timeout": 30}
    client = secured_deploy.client()
    try:
        keep = client.subscribe(topic.full_name, "keep", consumer_type=pulsar.ConsumerType.Shared)
        gone = client.subscribe(topic.full_name, "gone", consumer_type=pulsar.ConsumerType.Shared)
        publish_all(client.create_producer(topic.full_name, batching_enabled=False), [b"m"] * 6)
        for consumer in (keep, gone):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))

        def cursors() -> Dict[str, int]:
            stats = pa.internal_stats(topic) or {"cursors": {}}
            found = {n: int(c["cursorLedger"]) for n, c in stats["cursors"].items()}
            return found if all(found.get(s, -1) >= 0 for s in ("keep", "gone")) else {}

        orphan = wait_value("both cursors in a ledger", cursors, timeout_s=60)["gone"]
        live = min(int(item["ledgerId"]) for item in (pa.internal_stats(topic) or {})["ledgers"])
        # Removing "gone" with its ledger's delete blocked orphans its cursor ledger (the PIP's case).
        zk = ZooKeeperClient(sa.host, sa.ports["zookeeper"])
        block = ledger_znode(zk, orphan) + "/pl-block-delete"
        zk.create(block)
        try:
            gone.close()
            r = requests.delete(f"{sa.admin_url_tls}/admin/v2/persistent/{topic.short_name}/subscription/gone", **https)
            assert r.status_code == 204, r.text
            assert wait_for(lambda: "gone" not in (pa.internal_stats(topic) or {}).get("cursors", {}), timeout=30,
                            interval=0.5)
            time.sleep(2)  # the broker's one delete of the cursor ledger has been tried (and failed) by now
        finally:
            zk.delete(block)
            zk.close()
        assert orphan in bookie.list_ledger_ids(), "not an orphan: the broker deleted it"
        requests.put(f"{sa.admin_url_tls}/admin/v2/persistent/{topic.short_name}/unload", **https)
        client.create_producer(topic.full_name).send(b"after")
        assert max(pa.in_use_ledger_ids(topic) or {0}) > orphan

        _enqueue(secured_deploy, topic, orphan, "gone")
        _enqueue(secured_deploy, topic, live)
        wait_value("the orphan deleted", lambda: orphan not in bookie.list_ledger_ids(), timeout_s=180)
        logs = secured_deploy.logs("ledger-deletion-worker.yaml")
        assert re.search(rf"deleted topic=\S+ ledger={orphan}\b", logs), logs[-3000:]
        wait_value("the live ledger's request retried (in use)",
                   lambda: f"retry sent ledger={live} " in secured_deploy.logs("ledger-deletion-worker.yaml"),
                   timeout_s=120)
        assert live in bookie.list_ledger_ids() and live in (pa.in_use_ledger_ids(topic) or set()), \
            "the live data ledger was deleted"
    finally:
        client.close()
        pa.close()
        bookie.endpoints.close()
    logs = secured_deploy.logs("ledger-deletion-worker.yaml")
    assert " 401" not in logs and " 403" not in logs, logs[-3000:]
    TIMES["deletion: orphan deleted, live kept"] = time.monotonic() - t0


# -- the commands' admin REST calls on the secured cluster -----------------------------------------

def _cli(deploy: SecuredDeploy, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=deploy.client_conf.parent, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=cli_env(deploy.client_conf.parent))


@pytest.mark.timeout(300)
def test_inspect_and_enqueue_topic_send_the_token_and_trust_the_ca(secured_deploy: SecuredDeploy, tmp_path: Path,
                                                                   unique: str) -> None:
    """`inspect deletion|syncer` and `deletion enqueue-topic` reach the https admin API with the
    client.conf's webServiceUrl, token and CA; a role the admin API refuses is one line naming
    the URL and the role."""
    sa = secured_deploy.standalone
    conf = str(secured_deploy.client_conf)
    configs = {}
    for name in ("ledger-deletion-worker.yaml", "delay-level-syncer.yaml"):
        configs[name] = tmp_path / name
        configs[name].write_text(yaml.safe_dump(secured_deploy.configs[name], sort_keys=False))
    t0 = time.monotonic()
    res = _cli(secured_deploy, "inspect", "deletion", "--function-config-file", str(configs["ledger-deletion-worker.yaml"]),
               "--client-conf", conf, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"admin-backlog"' in res.stdout, res.stdout[-3000:]
    res = _cli(secured_deploy, "inspect", "syncer", "--function-config-file", str(configs["delay-level-syncer.yaml"]),
               "--client-conf", conf, "--data-dir", str(tmp_path / "data"), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    TIMES["inspect deletion + syncer over https"] = time.monotonic() - t0

    # A role the broker authenticates but the admin API does not serve: one line, URL and role.
    t0 = time.monotonic()
    res = _cli(secured_deploy, "inspect", "deletion", "--function-config-file", str(configs["ledger-deletion-worker.yaml"]),
               "--client-conf", conf, "--auth-params", f"token:{sa.token('bob')}")
    line = assert_one_line_error(res, sa.admin_url_tls, "role 'bob'", "HTTP 401")
    refused_s = time.monotonic() - t0
    # Below the client's 30 s operation timeout: the refusal is not waited out (not a speed figure).
    assert refused_s < 25.0, (refused_s, line)
    print(f"inspect deletion as bob: {line}")
    TIMES["inspect deletion as bob: admin refusal line"] = refused_s

    # enqueue-topic: every ledger of a topic, its in-use check on the https admin API.
    topic = f"persistent://public/default/secured-enqueue-{unique}"
    client = secured_deploy.client()
    try:
        client.create_producer(topic).send(b"x")
    finally:
        client.close()
    res = _cli(secured_deploy, "deletion", "enqueue-topic", "--client-conf", conf, "--topic", topic,
               "--send-delay-seconds", "0")
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"ledgerId"' in res.stdout, res.stdout
    # bob: refused by the broker (producing to the deletion topics) or by the admin API, one line
    # naming the role either way.
    res = _cli(secured_deploy, "deletion", "enqueue-topic", "--client-conf", conf, "--auth-params",
               f"token:{sa.token('bob')}", "--topic", topic, "--send-delay-seconds", "0")
    line = assert_one_line_error(res, "role 'bob'")
    print(f"enqueue-topic as bob: {line}")


@pytest.mark.timeout(300)
def test_up_runs_a_function_against_the_secured_broker(secured_deploy: SecuredDeploy, tmp_path: Path,
                                                       unique: str) -> None:
    """`up --broker-service-url pulsar+ssl://... --client-conf`: the function connects with the
    token and CA (it would be refused otherwise); without a token, one line at once."""
    sa = secured_deploy.standalone
    cfg = load_function_config(CONFIGS / "example-function.yaml")
    cfg["name"] = f"example-{unique}"[:60]
    cfg["inputs"] = [f"persistent://public/default/secured-in-{unique}"]
    cfg["output"] = f"persistent://public/default/secured-out-{unique}"
    cfg["subName"] = cfg["name"]
    config = tmp_path / "example.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    t0 = time.monotonic()
    res = _cli(secured_deploy, "up", "--broker-service-url", sa.service_url_tls, "--tls-trust-cert-path",
               str(sa.ca_path), "--function-config-file", str(config), "--data-dir", str(tmp_path / "anon"),
               "--run-seconds", "5")
    assert_one_line_error(res, sa.service_url_tls, "refused authentication")
    TIMES["up without a token: refusal line"] = time.monotonic() - t0

    up = subprocess.Popen([*CLI, "up", "--broker-service-url", sa.service_url_tls, "--client-conf",
                           str(secured_deploy.client_conf), "--function-config-file", str(config),
                           "--data-dir", str(tmp_path / "data"), "--run-seconds", "90"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL, env=cli_env(tmp_path))
    client = secured_deploy.client()
    try:
        out = client.subscribe(cfg["output"], "check", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(cfg["inputs"][0])
        for i in range(3):
            producer.send(f"m{i}".encode())
        got = _drain(out, 3, 90)
    finally:
        client.close()
        up.terminate()
        stdout, stderr = up.communicate(timeout=60)
    assert sorted(p for p, _ in got) == ["m0!", "m1!", "m2!"], (got, stdout[-2000:], stderr[-2000:])
    assert up.returncode == 0, stderr[-3000:]
    TIMES["up: example function through the secured broker"] = time.monotonic() - t0
