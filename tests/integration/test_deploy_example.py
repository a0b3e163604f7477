"""The deploy example of docs/operations.md, run as written under this repository's reproduction of
Pulsar's Python instance (support/pulsar_python_instance/, started by support/functions_create.py
as a function worker starts it), on a real Pulsar standalone whose table service keeps the
function state.

`pulsar-lifecycle ...` lines run as commands in a copy of the repository layout; each
`pulsar-admin functions create` line starts the function's instances with the worker's command
line, `--state_storage_serviceurl` included. The shipped writer then keeps its index on that
table service and releases every message exactly once and never early, also across a SIGKILL
and a start in a new directory (another worker); the user-metric series the docs name are the
ones the runtime's Summary serves.
"""
from __future__ import annotations

import base64
import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.bucket.storage import bookkeeper_snapshot_storage
from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.packaging.zip_builder import build_wheel
from pulsar_lifecycle.state.bk_table import BookKeeperStateStore
from support.docs_blocks import doc_blocks
from support.functions_create import DeployedFunction, FunctionWorker, Instance
from support.paths import REPO

OPERATIONS = REPO / "docs" / "operations.md"
DEPLOY_HEADING = "## Deploying on a Pulsar cluster"
# What an operator's checkout has that the example's commands use.
CHECKOUT = (".venv", "pyproject.toml", "shared", "functions", "function-configs")
STATE_REASON = "the tables live on the real standalone's table service (pulsar-lite has none)"


def deploy_commands() -> List[str]:
    """The commands of the docs' deploy example, continuation lines joined."""
    text = OPERATIONS.read_text()
    heading_line = text[:text.index(DEPLOY_HEADING)].count("\n") + 1
    block = next(b for b in doc_blocks("bash", [OPERATIONS]) if b.line > heading_line)
    return [c.strip() for c in block.text.replace("\\\n", " ").splitlines() if c.strip()]


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


def _wait_for(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(interval_s)


@pytest.fixture
def worker(broker, tmp_path: Path) -> Iterator[FunctionWorker]:
    """A function worker with function state: the standalone's table service."""
    w = FunctionWorker(broker.service_url, broker.state_storage_url, tmp_path / "worker")
    yield w
    w.stop_all()


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


@pytest.mark.pulsar_only(STATE_REASON)
@pytest.mark.timeout(1200)
def test_the_docs_deploy_example_runs_as_written(broker, worker: FunctionWorker, tmp_path: Path) -> None:
    project = _checkout(tmp_path)
    deployed: Dict[str, DeployedFunction] = {}
    commands = deploy_commands()
    assert any(c.startswith("pulsar-admin functions create") for c in commands), commands
    for command in commands:
        if command.startswith("pulsar-admin functions create "):
            args = shlex.split(command)
            config = project / _argument(args, "--function-config-file")
            deployed[config.name] = worker.create(project / _argument(args, "--py"), config)
        elif command.startswith(".venv/bin/pulsar-lifecycle "):
            res = subprocess.run(["bash", "-c", command], cwd=project, capture_output=True, text=True, timeout=900)
            assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
        else:
            pytest.fail(f"the deploy example has a step this test cannot run: {command}")

    writer = deployed["bucket-snapshot-writer.yaml"]
    for fn in deployed.values():  # the deletion worker's four instances too
        for instance in fn.instances:
            instance.wait_running(timeout_s=300)
    cfg = load_function_config(project / "function-configs" / "bucket-snapshot-writer.yaml")
    run = f"deploy-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        releases = Releases(client, cfg["output"], run)
        producer = client.create_producer(cfg["userConfig"]["schedulingTopic"])
        now = int(time.time() * 1000)
        due = _schedule(producer, run, 0, 100, now + 4000)
        later = now + 120_000
        due.update(_schedule(producer, run, 100, 100, later))  # pending at the kill below, unless it comes late
        releases.drain(100, timeout_s=180)
        assert len(releases.got) >= 100, f"{len(releases.got)} of the first 100 released"

        first = writer.instances[0]
        log = first.log_text()
        assert f"event=bucket_index_location storage=bookkeeper at={broker.state_storage_url}" in log, log[-3000:]
        assert not (first.directory / "buckets").exists()
        index_id, followed = _index_on_the_table_service(broker.state_storage_url, writer.fqfn)
        assert index_id and index_id == followed, (index_id, followed)
        _check_user_metrics(first, writer)

        # SIGKILL, then start in a new directory, as a worker elsewhere would.
        released_before_kill, killed_at = len(releases.got), int(time.time() * 1000)
        if killed_at < later - 5000:
            assert released_before_kill == 100, "the later 100 must still be pending in the index at the kill"
        moved = writer.restart(0)
        moved.wait_running(timeout_s=300)
        due.update(_schedule(producer, run, 200, 50, int(time.time() * 1000) + 3000))
        releases.drain(len(due), timeout_s=300)
        assert _index_on_the_table_service(broker.state_storage_url, writer.fqfn) == (index_id, index_id)
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
    print(f"deploy example: {len(commands)} commands; {len(due)} scheduled, {len(releases.got)} released, "
          f"0 missing, 0 twice, 0 early; {released_before_kill} released before the SIGKILL, "
          f"{len(due) - released_before_kill} after the start in a new directory; index {index_id} on "
          f"{broker.state_storage_url}")


def _check_user_metrics(instance: Instance, writer: DeployedFunction) -> None:
    """The writer's recordings are in the runtime's Summary under the names the docs use."""
    def released_series() -> List[Dict[str, str]]:
        series = _series(instance.metrics()).get("pulsar_function_user_metric_count", [])
        return [s for s in series if s.get("metric") == "pulsar_lifecycle_scheduler_released_total"]

    found = _wait_for("the writer's released_total recording", released_series, timeout_s=90)
    tenant, namespace, name = writer.fqfn.split("/")
    assert found == [{"tenant": tenant, "namespace": namespace, "name": name, "instance_id": "0",
                      "cluster": writer.worker.cluster_name, "fqfn": writer.fqfn,
                      "metric": "pulsar_lifecycle_scheduler_released_total"}]
    served = set(_series(instance.metrics()))
    documented = documented_user_metric_series()
    assert documented, "docs/operations.md names no user-metric series"
    assert set(documented) <= served, f"named in the docs, not served: {sorted(set(documented) - served)}"
    assert not [s for s in served if s.startswith("pulsar_function_user_metric__")]


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


@pytest.mark.pulsar_only(STATE_REASON)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["no-function-state", "directory-without-snapshotDir"])
def test_what_a_cluster_refuses_names_the_key_to_set(broker, tmp_path: Path, unique: str, wheel: Path,
                                                     case: str) -> None:
    """The error a writer stops with at its first message under Pulsar's runtime (the message is
    nacked, the error in the instance's log): the docs' line for a worker without function
    state; snapshotDir for the config as shipped before `auto`."""
    if case == "no-function-state":
        worker = FunctionWorker(broker.service_url, None, tmp_path / "worker")
        path, cfg = _writer_config(tmp_path, unique)
        expected = _documented_no_state_error()
    else:
        worker = FunctionWorker(broker.service_url, broker.state_storage_url, tmp_path / "worker")
        path, cfg = _writer_config(tmp_path, unique, snapshotStorage="directory")
        expected = "userConfig snapshotStorage=directory needs snapshotDir under Pulsar's runtime"
    try:
        fn = worker.create(wheel, path)
        instance = fn.instances[0]
        instance.wait_running(timeout_s=180)
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            client.create_producer(cfg["userConfig"]["schedulingTopic"]).send(
                b"x", properties={"__pl_deliver_at__": str(int(time.time() * 1000) + 1000)})
        finally:
            client.close()
        _wait_for(f"the instance's log naming {expected!r}", lambda: expected in instance.log_text(), timeout_s=120)
        assert "Exception while executing user method" in instance.log_text()
    finally:
        worker.stop_all()
