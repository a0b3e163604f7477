"""The deploy example of docs/operations.md, run as written through Pulsar's real function worker:
an Apache Pulsar 4.0.0 standalone with its function worker (process runtime, function state on
its table service) and the real `pulsar-admin` CLI (support/real_worker.py), the instances
running this repository's reproduction of Pulsar's Python instance
(support/pulsar_python_instance/, which Pulsar does not publish on Maven Central).

bash runs the docs' block in a copy of the repository layout, `pulsar-admin` being the real CLI:
the whole shipped set is created (module fixture `deployed`). The shipped writer then keeps its
index on the table service and releases every message exactly once and never early, also
across a SIGKILL of its instance (the worker starts it again) and `functions restart`;
`functions status`, `functions stats` and the worker's /metrics/ show what the docs name. With
only userConfig keys changed by `functions update`, the set works as one system (a deletion
retried through the writer, parked delays forwarded by the syncer, a cancel); `functions delete`
then stops every instance. What a cluster refuses names the key to set, and `functions update`
with the key set lets the writer run. One standalone serves the module (xdist_group keeps its
tests on one xdist worker); the worker without function state has its own.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pulsar
import pytest
import requests
import yaml

from pulsar_lifecycle.bucket.storage import bookkeeper_snapshot_storage
from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.strategy import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.model import TopicRef
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient
from pulsar_lifecycle.packaging.zip_builder import build_wheel
from pulsar_lifecycle.state.bk_table import BookKeeperStateStore
from pulsar_lifecycle.timing import DelayedProducer
from support.docs_blocks import doc_blocks
from support.helpers import publish_all, wait_for, wait_value
from support.paths import REPO
from support.real_worker import PulsarAdmin, RealWorker, skip_unless_real_pulsar, start_worker_standalone
from support.zookeeper import ZooKeeperClient, ledger_znode

OPERATIONS = REPO / "docs" / "operations.md"
DEPLOY_HEADING = "## Deploying on a Pulsar cluster"
# What an operator's checkout has that the example's commands use.
CHECKOUT = (".venv", "pyproject.toml", "shared", "functions", "function-configs")
WORKER_REASON = "Pulsar's function worker and table service run on the real standalone only"
# One xdist worker runs this module, so its tests share the module's standalone.
pytestmark = [pytest.mark.pulsar_only(WORKER_REASON), pytest.mark.xdist_group("real-worker-deploy")]


def deploy_block() -> str:
    """The docs' deploy example, as a shell runs it."""
    text = OPERATIONS.read_text()
    heading_line = text[:text.index(DEPLOY_HEADING)].count("\n") + 1
    return next(b for b in doc_blocks("bash", [OPERATIONS]) if b.line > heading_line).text


def deploy_commands() -> List[str]:
    """The commands of the docs' deploy example, continuation lines joined."""
    return [c.strip() for c in deploy_block().replace("\\\n", " ").splitlines() if c.strip()]


def documented_user_metric_series() -> List[str]:
    """The user-metric series names the docs' Metrics section and its PromQL use."""
    text = OPERATIONS.read_text()
    section = text[text.index("\n## Metrics"):]
    section = section[:section.index("\n## ", 1)]
    # The series (`_count`, `_sum`); the Summary's own name and the Java instance's are not series here.
    return sorted({n for n in re.findall(r"\bpulsar_function_user_metric_\w+", section) if "__" not in n})


def _checkout(tmp_path: Path) -> Path:
    project = tmp_path / "checkout"
    project.mkdir()
    for name in CHECKOUT:
        (project / name).symlink_to(REPO / name)
    return project


def _argument(args: List[str], name: str) -> str:
    return args[args.index(name) + 1]


def _series(scrape: str) -> Dict[str, List[Dict[str, str]]]:
    """Series name -> the label sets it has, from Prometheus text."""
    out: Dict[str, List[Dict[str, str]]] = {}
    for line in scrape.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append(labels)
    return out


class Releases:
    """The writer's output topic, read from the start; only this run's payloads count."""

    def __init__(self, client: pulsar.Client, topic: str, run: str) -> None:
        self.run = run
        self.consumer = client.subscribe(topic, f"deploy-check-{run}", initial_position=pulsar.InitialPosition.Earliest)
        self.got: List[Tuple[str, int]] = []  # (payload, publish time in ms)

    def drain(self, want: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.got) < want and time.monotonic() < deadline:
            try:
                msg = self.consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            payload = msg.data().decode()
            if payload.startswith(self.run):
                self.got.append((payload, msg.publish_timestamp()))
            self.consumer.acknowledge(msg)


def _schedule(producer: pulsar.Producer, run: str, first: int, count: int, due_ms: int) -> Dict[str, int]:
    due = {}
    for i in range(first, first + count):
        payload = f"{run}-{i}"
        producer.send(payload.encode(), properties={"__pl_deliver_at__": str(due_ms)})
        due[payload] = due_ms
    return due


def _index_on_the_table_service(state_url: str, fqfn: str) -> Tuple[str, str]:
    """(the index id in the snapshot table, the id the dedup state of instance 0 follows)."""
    tenant, namespace, name = fqfn.split("/")
    snapshots = bookkeeper_snapshot_storage(state_url, tenant, namespace, name)
    state = BookKeeperStateStore(state_url, tenant, namespace, name, create=False)
    try:
        raw = state.get("dedup/0/index-id")
        followed = base64.b64decode(raw).decode() if raw else ""
        return snapshots.get_index_id() or "", followed
    finally:
        for store in (snapshots, state):
            close = getattr(store, "close", None)
            if callable(close):
                close()


@dataclass
class Deployed:
    """The shipped set, deployed by the docs' example: config file name -> fqfn."""

    project: Path
    functions: Dict[str, str]
    output: str


@pytest.fixture(scope="module")
def deployed(real_worker: RealWorker, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    """The docs' deploy example run by bash as written, in a copy of the repository layout, with
    `pulsar-admin` the real CLI against the module's worker; every function's instances running.
    The module's last test deletes them (`functions delete`)."""
    tmp = tmp_path_factory.mktemp("deploy")
    project = _checkout(tmp)
    commands = deploy_commands()
    assert any("pulsar-admin functions create" in c for c in commands), commands
    unknown = [c for c in commands if not c.startswith((".venv/bin/pulsar-lifecycle ", "pulsar-admin ", "for ", "done"))]
    assert not unknown, f"the deploy example has steps this test cannot run: {unknown}"
    real_worker.admin.write_shim(tmp / "bin")
    env = dict(os.environ, PATH=os.pathsep.join([str(tmp / "bin"), os.environ.get("PATH", "")]))
    res = subprocess.run(["bash", "-e", "-c", deploy_block()], cwd=project, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
    assert res.stdout.count("Created successfully") == len(list((project / "function-configs").glob("*.yaml"))), res.stdout
    functions = {}
    for config in sorted((project / "function-configs").glob("*.yaml")):
        cfg = load_function_config(config)
        functions[config.name] = fqfn = f"{cfg['tenant']}/{cfg['namespace']}/{cfg['name']}"
        real_worker.admin.wait_running(fqfn, int(cfg.get("parallelism") or 1), timeout_s=420)
    output = load_function_config(project / "function-configs" / "bucket-snapshot-writer.yaml")["output"]
    return Deployed(project, functions, output)


@pytest.mark.timeout(1200)
def test_the_docs_deploy_example_runs_as_written(real_worker: RealWorker, deployed: Deployed) -> None:
    admin = real_worker.admin
    project = deployed.project
    writer = deployed.functions["bucket-snapshot-writer.yaml"]
    cfg = load_function_config(project / "function-configs" / "bucket-snapshot-writer.yaml")
    run = f"deploy-{uuid.uuid4().hex[:8]}"
    state_url = real_worker.state_storage_url
    client = pulsar.Client(real_worker.service_url, operation_timeout_seconds=30)
    try:
        releases = Releases(client, cfg["output"], run)
        producer = client.create_producer(cfg["userConfig"]["schedulingTopic"])
        now = int(time.time() * 1000)
        due = _schedule(producer, run, 0, 100, now + 4000)
        later = now + 120_000
        due.update(_schedule(producer, run, 100, 100, later))  # pending at the kill below, unless it comes late
        releases.drain(100, timeout_s=180)
        assert len(releases.got) >= 100, f"{len(releases.got)} of the first 100 released"

        log = real_worker.instance_log_text(writer, 0)
        assert f"event=bucket_index_location storage=bookkeeper at={state_url}" in log, log[-3000:]
        _pid, argv = real_worker.instance_process(writer, 0)
        assert argv[0] == "python3" and "--state_storage_serviceurl" in argv, argv
        assert not (Path(_argument(argv, "--py")).parent / "buckets").exists()
        index_id, followed = _index_on_the_table_service(state_url, writer)
        assert index_id and index_id == followed, (index_id, followed)
        _check_user_metrics(real_worker, writer)
        _check_status_and_stats(real_worker, writer)

        # SIGKILL the instance: the worker's liveness check starts it again.
        released_before_kill, killed_at = len(releases.got), int(time.time() * 1000)
        if killed_at < later - 5000:
            assert released_before_kill == 100, "the later 100 must still be pending in the index at the kill"
        restarts = {i["instanceId"]: i["status"]["numRestarts"] for i in admin.status(writer)["instances"]}
        killed = real_worker.kill_instance(writer, 0)
        admin.wait_running(writer, 1, timeout_s=300, since_restarts=restarts)
        assert killed not in real_worker.instance_pids(writer, 0)
        due.update(_schedule(producer, run, 200, 50, int(time.time() * 1000) + 3000))
        releases.drain(len(due), timeout_s=300)
        # `functions restart`: the worker stops the instance and starts it again.
        before = real_worker.instance_pids(writer, 0)
        assert admin.restart(writer, 0) == "Restarted successfully"
        wait_value("a new writer process after `functions restart`",
                  lambda: (real_worker.instance_pids(writer, 0) or before) != before, timeout_s=120)
        admin.wait_running(writer, 1, timeout_s=300)
        due.update(_schedule(producer, run, 250, 20, int(time.time() * 1000) + 3000))
        releases.drain(len(due), timeout_s=300)
        assert _index_on_the_table_service(state_url, writer) == (index_id, index_id)
    finally:
        client.close()

    counts: Dict[str, int] = {}
    for payload, _at in releases.got:
        counts[payload] = counts.get(payload, 0) + 1
    missing = sorted(set(due) - set(counts))
    twice = sorted(p for p, n in counts.items() if n > 1)
    early = sorted(p for p, at in releases.got if at < due[p])
    assert not missing and not twice and not early, (
        f"missing {len(missing)} {missing[:5]}, twice {len(twice)} {twice[:5]}, early {len(early)} {early[:5]}")

    print(f"deploy example: {len(deployed.functions)} functions; {len(due)} scheduled, {len(releases.got)} released, "
          f"0 missing, 0 twice, 0 early; {released_before_kill} released before the SIGKILL, "
          f"{len(due) - released_before_kill} after the worker's restart and `functions restart`; index "
          f"{index_id} on {state_url}")


# -- the shipped set as one system ----------------------------------------------------------------

UNIT_S = 5  # the syncer's and the producer's delay-level unit for the test (the shipped one is a day)
MAX_DELAY_S = 600


def _deletion_logs(real_worker: RealWorker, fqfn: str, instances: int) -> str:
    return "\n".join(real_worker.instance_log_text(fqfn, i) for i in range(instances))


def _cursor_ledgers(admin: PulsarAdminClient, topic: TopicRef, subs: Set[str]) -> Dict[str, int]:
    """subscription -> its cursor ledger, once each of `subs` has persisted its position in one."""
    holder: Dict[str, Dict[str, int]] = {}

    def ready() -> bool:
        stats = admin.internal_stats(topic) or {"cursors": {}}
        holder["c"] = {n: int(c["cursorLedger"]) for n, c in stats["cursors"].items()}
        return all(holder["c"].get(s, -1) >= 0 for s in subs)

    assert wait_for(ready, timeout=60, interval=0.5), holder
    return holder["c"]


def _enqueue(project: Path, service_url: str, topic: TopicRef, ledger_id: int, cursor: str = "") -> None:
    """`pulsar-lifecycle deletion enqueue` as an operator runs it beside the shipped worker config:
    the request goes to the shipped deletion topics, its send delay through the shipped writer."""
    which = ["--component", "MANAGED_CURSOR", "--cursor", cursor] if cursor else []
    res = subprocess.run([".venv/bin/pulsar-lifecycle", "deletion", "enqueue", "--service-url", service_url,
                          "--topic", topic.short_name, "--ledger-id", str(ledger_id), *which, "--send-delay-seconds", "2",
                          "--worker-config", "function-configs/ledger-deletion-worker.yaml"],
                         cwd=project, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"


@pytest.mark.timeout(1200)
def test_the_shipped_set_joins_up_through_the_real_worker(real_worker: RealWorker, deployed: Deployed,
                                                          unique: str) -> None:
    """The shipped set as the docs deploy it, unchanged but for userConfig keys an operator sets
    with `functions update` (the deletion worker's admin and bookie URLs, shorter delays and
    delay-level units for the test's speed): a deletion request for a ledger still in use is
    retried through the writer and deletes the ledger once it is an orphan, a live ledger's
    request is retried and the ledger kept; long delays parked by a DelayLevelProducer on its
    default delay-level topic are forwarded by the syncer and released by the writer exactly once
    and none early, a cancelled one never; near-term ones go through the writer directly. Then
    `functions delete` stops every instance."""
    admin, sa = real_worker.admin, real_worker.standalone
    fns = deployed.functions
    syncer, deleter = fns["delay-level-syncer.yaml"], fns["ledger-deletion-worker.yaml"]
    writer_cfg = load_function_config(deployed.project / "function-configs" / "bucket-snapshot-writer.yaml")
    syncer_cfg = load_function_config(deployed.project / "function-configs" / "delay-level-syncer.yaml")
    deleter_n = int(load_function_config(deployed.project / "function-configs" / "ledger-deletion-worker.yaml")["parallelism"])
    before = {f: {i: real_worker.instance_pids(f, i) for i in range(deleter_n)} for f in (syncer, deleter)}
    assert admin.update_user_config(syncer, partitionBy="SECONDS", unitSeconds=UNIT_S,
                                    messageMaximumDelayTimeSeconds=MAX_DELAY_S, lookaheadMillis=3000,
                                    partitionDiscoverySeconds=1) == "Updated successfully"
    assert admin.update_user_config(deleter, pulsarAdminUrl=sa.admin_url, bookieHttpUrls=[sa.bookie_http_url],
                                    sendDelaySeconds=2, reconsumeLaterSeconds=3, ledgersCacheTtlSeconds=1) \
        == "Updated successfully"
    for fqfn, n in ((syncer, 1), (deleter, deleter_n)):
        def restarted(fqfn: str = fqfn, n: int = n) -> bool:
            return all(real_worker.instance_pids(fqfn, i) not in ([], before[fqfn][i]) for i in range(n))

        wait_value(f"{fqfn}: every instance started again by `functions update`", restarted, timeout_s=180)
        admin.wait_running(fqfn, n, timeout_s=300)
    assert admin.get(syncer)["userConfig"]["delayLevelTopic"] == syncer_cfg["userConfig"]["delayLevelTopic"]

    pa = PulsarAdminClient.connect([sa.admin_url])
    bookie = BookieHttpClient.connect([sa.bookie_http_url])
    topic = TopicRef.parse(f"public/default/e2e-ledgers-{unique}")
    business = f"persistent://public/default/e2e-business-{unique}"
    client = pulsar.Client(real_worker.service_url, operation_timeout_seconds=30)
    try:
        # Two subscriptions with cursor ledgers: "gone" will be removed; "keep" has not read the
        # first data ledger, which stays in use.
        keep = client.subscribe(topic.full_name, "keep", consumer_type=pulsar.ConsumerType.Shared)
        gone = client.subscribe(topic.full_name, "gone", consumer_type=pulsar.ConsumerType.Shared)
        publish_all(client.create_producer(topic.full_name, batching_enabled=False), [b"m"] * 6)
        for consumer in (keep, gone):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        cursors = _cursor_ledgers(pa, topic, {"keep", "gone"})
        live = min(int(item["ledgerId"]) for item in (pa.internal_stats(topic) or {})["ledgers"])
        _enqueue(deployed.project, real_worker.service_url, topic, cursors["gone"], "gone")
        _enqueue(deployed.project, real_worker.service_url, topic, live)

        # Long delays parked on the default delay-level topic, one cancelled; short ones near-term.
        releases = client.subscribe(business, f"e2e-{unique}", initial_position=pulsar.InitialPosition.Earliest)
        strategy = DelayLevelTopicPartitionStrategy(MAX_DELAY_S, PartitionBy.SECONDS, unit_seconds=UNIT_S)
        near = DelayedProducer(client, scheduling_topic=writer_cfg["userConfig"]["schedulingTopic"])
        producer = DelayLevelProducer(client, business, near, strategy=strategy)
        assert producer.delay_level_topic == syncer_cfg["userConfig"]["delayLevelTopic"]
        now = int(time.time() * 1000)
        due: Dict[str, int] = {}
        for i in range(20):
            sent = producer.send(f"parked-{i}".encode(), deliver_at_ms=now + 25_000 + 100 * i)
            assert sent.parked and sent.topic.startswith(producer.delay_level_topic), sent
            due[f"parked-{i}"] = now + 25_000 + 100 * i
        cancelled = producer.send(b"cancelled", deliver_at_ms=now + 26_000)
        assert cancelled.parked
        producer.cancel(cancelled)
        for i in range(5):
            sent = producer.send(f"near-{i}".encode(), deliver_at_ms=now + 3000)
            assert not sent.parked, sent
            due[f"near-{i}"] = now + 3000

        # The in-use ledger's request comes back through the writer as a retry.
        def retried(ledger: int) -> bool:
            return f"retry sent ledger={ledger} " in _deletion_logs(real_worker, deleter, deleter_n)

        wait_value("a retry of the request for gone's cursor ledger (still in use)", lambda: retried(cursors["gone"]),
                  timeout_s=120)
        # Removing "gone" orphans its cursor ledger: the broker's own delete fails.
        zk = ZooKeeperClient(sa.host, sa.ports["zookeeper"])
        block = ledger_znode(zk, cursors["gone"]) + "/pl-block-delete"
        zk.create(block)
        try:
            gone.close()
            r = requests.delete(f"{sa.admin_url}/admin/v2/persistent/{topic.short_name}/subscription/gone", timeout=30)
            assert r.status_code == 204, r.text
            assert wait_for(lambda: "gone" not in (pa.internal_stats(topic) or {}).get("cursors", {}), timeout=30,
                            interval=0.5)
            time.sleep(2)  # the broker's one delete of the cursor ledger has been tried (and failed) by now
        finally:
            zk.delete(block)
            zk.close()
        assert cursors["gone"] in bookie.list_ledger_ids(), "not an orphan: the broker deleted it"
        # A new data ledger above the orphan, as the topic goes on (the unload closes the current one).
        requests.put(f"{sa.admin_url}/admin/v2/persistent/{topic.short_name}/unload", timeout=30)
        client.create_producer(topic.full_name).send(b"after")
        assert max(pa.in_use_ledger_ids(topic) or {0}) > cursors["gone"]
        wait_value("the orphan deleted by a retry", lambda: cursors["gone"] not in bookie.list_ledger_ids(),
                  timeout_s=180)
        logs = _deletion_logs(real_worker, deleter, deleter_n)
        assert re.search(rf"deleted topic=\S+ ledger={cursors['gone']}\b", logs), logs[-3000:]

        got: List[Tuple[str, int]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (len(got) >= len(due) and time.time() * 1000 > now + 34_000):
            try:
                msg = releases.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            got.append((msg.data().decode(), msg.publish_timestamp()))
            releases.acknowledge(msg)
        assert retried(live), "the live ledger's request was not retried"
        assert live in bookie.list_ledger_ids() and live in (pa.in_use_ledger_ids(topic) or set()), \
            "the live data ledger was deleted"
    finally:
        client.close()
        pa.close()
        bookie.endpoints.close()

    counts: Dict[str, int] = {}
    for payload, _at in got:
        counts[payload] = counts.get(payload, 0) + 1
    missing = sorted(set(due) - set(counts))
    twice = sorted(p for p, n in counts.items() if n > 1)
    early = sorted(p for p, at in got if p in due and at < due[p])
    assert "cancelled" not in counts, got
    assert not missing and not twice and not early and set(counts) == set(due), (
        f"missing {missing[:5]}, twice {twice[:5]}, early {early[:5]}, unexpected {sorted(set(counts) - set(due))}")

    for fqfn in fns.values():
        admin.delete(fqfn)
    wait_value("every instance stopped after `functions delete`",
              lambda: not any(real_worker.instance_pids(f, i) for f in fns.values() for i in range(8)), timeout_s=120)
    assert not set(admin.list()) & {f.split("/")[-1] for f in fns.values() if f.startswith("public/default/")}
    print(f"shipped set: orphan {cursors['gone']} deleted after a retry, live {live} kept; "
          f"{len(due)} delayed released once, none early, the cancelled one never")


def _check_user_metrics(real_worker: RealWorker, writer: str) -> None:
    """The writer's recordings are in the worker's /metrics/ (the instance's Summary) under the
    names the docs use, with the runtime's labels."""
    def released_series() -> List[Dict[str, str]]:
        series = _series(real_worker.admin.worker_metrics()).get("pulsar_function_user_metric_count", [])
        return [s for s in series if s.get("metric") == "pulsar_lifecycle_scheduler_released_total"
                and s.get("fqfn") == writer]

    found = wait_value("the writer's released_total recording", released_series, timeout_s=90)
    tenant, namespace, name = writer.split("/")
    assert found == [{"tenant": tenant, "namespace": namespace, "name": name, "instance_id": "0",
                      "cluster": "standalone", "fqfn": writer,
                      "metric": "pulsar_lifecycle_scheduler_released_total"}]
    served = set(_series(real_worker.admin.worker_metrics()))
    documented = documented_user_metric_series()
    assert documented, "docs/operations.md names no user-metric series"
    assert set(documented) <= served, f"named in the docs, not served: {sorted(set(documented) - served)}"
    assert not [s for s in served if s.startswith("pulsar_function_user_metric__")]


def _check_status_and_stats(real_worker: RealWorker, writer: str) -> None:
    """`functions status` and `functions stats` count what the instance processed."""
    status = real_worker.admin.status(writer)
    assert status["numRunning"] == status["numInstances"] == 1, json.dumps(status)
    assert status["instances"][0]["status"]["numReceived"] >= 1, json.dumps(status)
    stats = real_worker.admin.stats(writer)
    (only,) = stats["instances"]
    assert only["metrics"]["processedSuccessfullyTotal"] >= 1, json.dumps(stats)
    released = only["metrics"]["userMetrics"].get("user_metric_pulsar_lifecycle_scheduler_released_total_count")
    assert released is not None and released >= 1, json.dumps(stats)


# -- what a cluster refuses, at the first message ------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project wheel `package` builds; unzipped by the instance, dependencies the worker's."""
    return build_wheel(REPO, tmp_path_factory.mktemp("wheel"))


def _writer_config(tmp_path: Path, unique: str, **user: str) -> Tuple[Path, Dict]:
    """The shipped writer config with this test's topics and name, userConfig `user` added."""
    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    ticks, sched = (f"persistent://public/default/{kind}-{unique}" for kind in ("ticks", "sched"))
    cfg["name"] = f"writer-{unique}"
    cfg["inputSpecs"] = {ticks: cfg["inputSpecs"]["persistent://public/default/delayed-ticks"],
                         sched: cfg["inputSpecs"]["persistent://public/default/delayed-scheduling"]}
    cfg["output"] = f"persistent://public/default/released-{unique}"
    cfg["userConfig"] = dict(cfg["userConfig"], schedulingTopic=sched, tickTopic=ticks, **user)
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path, cfg


def _documented_no_state_error() -> str:
    return next(b.text.strip() for b in doc_blocks("", [OPERATIONS])
                if b.text.startswith("userConfig snapshotStorage=auto"))


def _send_one(service_url: str, cfg: Dict) -> None:
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        client.create_producer(cfg["userConfig"]["schedulingTopic"]).send(
            b"x", properties={"__pl_deliver_at__": str(int(time.time() * 1000) + 1000)})
    finally:
        client.close()


def _wait_refused(real_worker: RealWorker, fqfn: str, expected: str) -> None:
    """The error the writer stops with at its first message is in its instance log (the message
    is nacked: Pulsar's runtime logs the user exception and goes on)."""
    def logged() -> bool:
        return expected in real_worker.instance_log_text(fqfn, 0)

    wait_value(f"the instance's log naming {expected!r}", logged, timeout_s=120)
    assert "Exception while executing user method" in real_worker.instance_log_text(fqfn, 0)


@pytest.mark.timeout(600)
def test_directory_storage_is_refused_until_an_update_sets_snapshotDir(real_worker: RealWorker, tmp_path: Path,
                                                                       unique: str, wheel: Path) -> None:
    """snapshotStorage=directory without snapshotDir names the key at the first message; `functions
    update` with the key set restarts the instance, which then releases what was scheduled."""
    admin = real_worker.admin
    path, cfg = _writer_config(tmp_path, unique, snapshotStorage="directory")
    fqfn = f"public/default/{cfg['name']}"
    admin.create(wheel, path)
    admin.wait_running(fqfn, 1, timeout_s=180)
    _send_one(real_worker.service_url, cfg)
    _wait_refused(real_worker, fqfn, "userConfig snapshotStorage=directory needs snapshotDir under Pulsar's runtime")

    cfg["userConfig"]["snapshotDir"] = str(tmp_path / "index")
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = real_worker.instance_pids(fqfn, 0)
    assert admin.update(fqfn, "--function-config-file", str(path)) == "Updated successfully"
    wait_value("the instance started again by `functions update`",
              lambda: (real_worker.instance_pids(fqfn, 0) or before) != before, timeout_s=120)
    admin.wait_running(fqfn, 1, timeout_s=180)
    client = pulsar.Client(real_worker.service_url, operation_timeout_seconds=30)
    try:
        releases = Releases(client, cfg["output"], "x")
        releases.drain(1, timeout_s=120)  # the nacked message, redelivered to the updated instance
    finally:
        client.close()
    assert [p for p, _ in releases.got] == ["x"], releases.got
    assert (tmp_path / "index").is_dir()
    admin.delete(fqfn)


@pytest.mark.timeout(720)
def test_a_worker_without_function_state_names_the_key_to_set(tmp_path: Path, unique: str, wheel: Path) -> None:
    """The docs' error line, at the first message, for a worker without function state (its own
    standalone, without a table service)."""
    skip_unless_real_pulsar()
    standalone = start_worker_standalone(tmp_path / "no-state", stream_storage=False)
    try:
        worker = RealWorker(standalone, PulsarAdmin(standalone.admin_url, standalone.service_url, tmp_path / "admin"))
        path, cfg = _writer_config(tmp_path, unique)
        fqfn = f"public/default/{cfg['name']}"
        worker.admin.create(wheel, path)
        # A brand-new worker's first instance: on a loaded host (three test workers beside it,
        # load average near 20) its status went unanswered for 180 s.
        worker.admin.wait_running(fqfn, 1, timeout_s=300)
        _pid, argv = worker.instance_process(fqfn, 0)
        assert "--state_storage_serviceurl" not in argv, argv
        _send_one(standalone.service_url, cfg)
        _wait_refused(worker, fqfn, _documented_no_state_error())
    finally:
        standalone.stop(remove_data=True)
