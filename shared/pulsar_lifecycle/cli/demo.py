"""`pulsar-lifecycle demo`: the whole system on the embedded broker or real Apache Pulsar, end to end.

Starts one pulsar-lite (or, with `--pulsar`, a real Apache Pulsar standalone on loopback:
runtime/pulsar_standalone.py), runs every shipped function with its function-config YAML through
the local run mode, feeds each one and shows what comes out. Exit status 0 only if every scene
saw what it expected. On real Pulsar the function state lives in the standalone's BookKeeper
table service, and the partitioned topics the scenes use are created through its admin REST API
(pulsar-lite creates `<topic>-partition-<k>` as a plain topic on first use; real Pulsar needs
the partitioned topic's metadata first).
"""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Union

import click
import pulsar
import yaml
from rich.console import Console
from rich.table import Table

from ..bucket.storage.directory import DirectorySnapshotStorage
from ..config.function_config import load_function_config, spec_from_config
from ..delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from ..delaylevel.producer import DelayLevelProducer
from ..delaylevel.rule import ORIGIN_PARTITION_PROP
from ..deletion.admin import PulsarAdminClient
from ..deletion.model import TopicRef
from ..deletion.topics import DeletionTopics
from ..runtime.broker import EmbeddedBroker
from ..runtime.client import quiet_client, receive_messages
from ..runtime.local_paths import absolute_path
from ..runtime.localrun import LocalRunner, LocalRunOptions
from ..runtime.pulsar_release import cache_root, java_executable, pinned_version, resolve
from ..runtime.pulsar_standalone import PulsarStandalone
from ..scheduler.wake import send_start_ticks
from ..scheduling_protocol import RELEASED_AT_PROP
from ..timing import DelayedProducer, now_ms

log = logging.getLogger(__name__)

# The broker a demo runs on: pulsar-lite (a child process) or a real Pulsar standalone (a JVM).
DemoBroker = Union[EmbeddedBroker, PulsarStandalone]


@dataclass
class SceneResult:
    """What one scene showed: a title, rows to print and whether it matched expectations."""

    title: str
    columns: List[str]
    rows: List[List[str]]
    ok: bool
    note: str = ""


def find_config_dir() -> Path:
    """function-configs/ of the source checkout (the demo runs from a clone)."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / "function-configs").is_dir():
            return base / "function-configs"
    raise click.ClickException("function-configs/ not found: run the demo from the project checkout")


def start_function(config: Path, broker: DemoBroker, data_dir: Path, **overrides: Any) -> LocalRunner:
    """Run one function config on `broker` via the local run mode.

    On real Pulsar the function state goes to the standalone's table service (as
    `--state-storage-service-url` would send it); on pulsar-lite to `<data_dir>/<name>/state`.
    """
    spec = spec_from_config(load_function_config(config), overrides or None)
    state_url = broker.state_storage_url if isinstance(broker, PulsarStandalone) else None
    opts = LocalRunOptions(broker_service_url=broker.service_url, state_storage_service_url=state_url,
                           data_dir=data_dir / spec.name, nack_redelivery_delay_ms=1000)
    return LocalRunner(spec, opts).start()


def ensure_partitioned(broker: DemoBroker, topic: str, partitions: int) -> None:
    """Give `topic` `partitions` partitions on real Pulsar (admin REST; an existing one is kept).

    Nothing to do on pulsar-lite: its `default_partitions = 0` makes every `<topic>-partition-<k>`
    a plain topic created on first use.
    """
    if not isinstance(broker, PulsarStandalone):
        return
    admin = PulsarAdminClient.connect([broker.admin_url])
    try:
        created = admin.create_partitioned_topic(TopicRef.parse(topic), partitions)
    finally:
        admin.close()
    log.info("event=demo_partitioned_topic topic=%s partitions=%d created=%s", topic, partitions, created)


def receive_n(client: pulsar.Client, topic: str, n: int, timeout: float) -> List[pulsar.Message]:
    """Up to `n` messages from `topic` within `timeout` seconds (Shared, Earliest)."""
    return receive_messages(client, topic, "demo-reader", n, timeout)


def scene_example(broker: DemoBroker, data_dir: Path, configs: Path) -> SceneResult:
    """The example function: inputs in, exclaimed outputs out."""
    runner = start_function(configs / "example-function.yaml", broker, data_dir)
    client = quiet_client(broker.service_url)
    try:
        prod = client.create_producer(runner.spec.inputs[0])
        words = ["hello", "pulsar", "lifecycle"]
        for w in words:
            prod.send(w.encode())
        got = receive_n(client, runner.spec.output, len(words), timeout=20)
    finally:
        client.close()
        runner.stop()
    rows = [[w, m.data().decode()] for w, m in zip(words, got)]
    ok = sorted(m.data().decode() for m in got) == sorted(f"{w}!" for w in words)
    return SceneResult("example-function", ["input", "output"], rows, ok)


def _wait_started(runner: LocalRunner, timeout: float = 15.0) -> None:
    """Wait until the runner's function built its service (on its first tick)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and getattr(runner.functions()[0], "service", None) is None:
        time.sleep(0.05)


def scene_delayed_delivery(broker: DemoBroker, data_dir: Path, configs: Path) -> SceneResult:
    """BucketSnapshotWriter + LedgerDeletionWorker: messages leave on time, exhausted snapshots
    are deleted through two-phase deletion."""
    snap_dir = data_dir / "bucket-snapshots"
    wcfg = load_function_config(configs / "bucket-snapshot-writer.yaml")
    sched = wcfg["userConfig"]["schedulingTopic"]
    writer = start_function(configs / "bucket-snapshot-writer.yaml", broker, data_dir, userConfig=dict(
        wcfg["userConfig"], snapshotDir=str(snap_dir), snapshotDeletion="two-phase",
        snapshotDeletionSendDelaySeconds=1, maxUnackedPerBucket=4, tickTimeMillis=200))
    dcfg = load_function_config(configs / "ledger-deletion-worker.yaml")
    # On real Pulsar the worker talks to the standalone's admin REST API and bookie HTTP API;
    # pulsar-lite has neither, so there it only serves the scheduler's snapshot requests.
    duser = {k: v for k, v in dcfg["userConfig"].items() if k not in ("pulsarAdminUrl", "bookieHttpUrls")}
    if isinstance(broker, PulsarStandalone):
        duser.update(pulsarAdminUrl=broker.admin_url, bookieHttpUrls=[broker.bookie_http_url])
    topics = DeletionTopics(namespace=duser["deletionNamespace"], topic_name=duser["deletionTopicName"],
                            parallelism=duser["ledgerDeletionParallelism"])
    for name in (topics.deletion_topic(None), topics.retry_topic(None)):
        ensure_partitioned(broker, name, topics.parallelism)
    worker = start_function(configs / "ledger-deletion-worker.yaml", broker, data_dir, parallelism=1, userConfig=dict(
        duser, schedulingTopic=sched, reconsumeLaterSeconds=1,
        bucketSnapshotHooks="pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks",
        bucketSnapshotDir=str(snap_dir)))
    client = quiet_client(broker.service_url)
    producer = DelayedProducer(client, scheduling_topic=sched)
    store = DirectorySnapshotStorage(snap_dir)
    # The shipped writer (tickMode hold) builds its service (recovery, publisher) on its first
    # input message. One tick, as `pulsar-lifecycle send-ticks` sends it, starts it before the
    # first order, so the table shows release times rather than the writer's start-up.
    send_start_ticks(client, wcfg["userConfig"]["tickTopic"], 1)
    _wait_started(writer)
    delays = [3500, 500, 2500, 0, 1500, 3000, 1000, 2000]
    try:
        start = now_ms()
        at = {}
        for i, d in enumerate(delays):
            at[f"order-{i}"] = start + d
            producer.send(writer.spec.output, f"order-{i}".encode(), start + d)
        got = receive_n(client, writer.spec.output, len(delays), timeout=30)
        deadline = time.monotonic() + 20
        created = 0
        while time.monotonic() < deadline:
            created = max(created, _snapshot_count(store))
            if _snapshot_count(store) == 0 and created:
                break
            time.sleep(0.2)
        left = _snapshot_count(store)
    finally:
        producer.close()
        client.close()
        worker.stop()
        writer.stop()
    rows, ok = [], len(got) == len(delays)
    for m in sorted(got, key=lambda m: int(m.properties()[RELEASED_AT_PROP])):
        name = m.data().decode()
        released = int(m.properties()[RELEASED_AT_PROP])
        late = released - at[name]
        ok = ok and late >= 0
        rows.append([name, f"+{at[name] - start} ms", f"+{released - start} ms", f"{late} ms"])
    note = (f"bucket snapshots sealed: {created or 'none seen'}; left after two-phase deletion: {left}"
            + ("" if left == 0 else " (the worker had not finished)"))
    return SceneResult("bucket-snapshot-writer + ledger-deletion-worker",
                       ["message", "deliver at", "released at", "lateness"], rows, ok and len(set(at)) == len(got), note)


def scene_delay_level(broker: DemoBroker, data_dir: Path, configs: Path) -> SceneResult:
    """DelayLevelProducer -> delay-level partitions -> DelayLevelSyncer -> BucketSnapshotWriter:
    parked messages are forwarded a lookahead before their deliver-at and released on time."""
    ns = "persistent://public/default"
    sched, business, wticks, sticks = (f"{ns}/dl-demo-scheduling", f"{ns}/dl-demo-orders",
                                       f"{ns}/dl-demo-writer-ticks", f"{ns}/dl-demo-syncer-ticks")
    unit_s, max_s, lookahead_ms = 3, 30, 1000
    bytes_serde = {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}
    wcfg = load_function_config(configs / "bucket-snapshot-writer.yaml")
    writer = start_function(configs / "bucket-snapshot-writer.yaml", broker, data_dir, name="dl-demo-writer",
                            subName="dl-demo-writer", output=business, inputSpecs={wticks: bytes_serde},
                            userConfig=dict(wcfg["userConfig"], schedulingTopic=sched, tickTopic=wticks,
                                            tickTimeMillis=200, snapshotDir=str(data_dir / "dl-demo-snapshots"),
                                            schedulingSubscription="dl-demo-writer",
                                            # its only input is the tick topic here: the local
                                            # runner's ticks start it (the shipped `hold` mode
                                            # waits for a scheduling message on an input)
                                            tickMode="runner"))
    scfg = load_function_config(configs / "delay-level-syncer.yaml")
    strategy = DelayLevelTopicPartitionStrategy(max_s, PartitionBy.SECONDS, unit_seconds=unit_s)
    ensure_partitioned(broker, f"{business}-delay-level", strategy.partitions)
    syncer = start_function(configs / "delay-level-syncer.yaml", broker, data_dir, name="dl-demo-syncer",
                            subName="dl-demo-syncer", inputSpecs={sticks: bytes_serde},
                            userConfig=dict(scfg["userConfig"], delayLevelTopic=f"{business}-delay-level",
                                            schedulingTopic=sched, schedulingSubscription="dl-demo-writer",
                                            partitionBy="SECONDS", unitSeconds=unit_s,
                                            messageMaximumDelayTimeSeconds=max_s, lookaheadMillis=lookahead_ms,
                                            tickTopic=sticks, tickTimeMillis=200, tickMode="runner"))
    client = quiet_client(broker.service_url)
    watch = client.subscribe(sched, "dl-demo-watch", consumer_type=pulsar.ConsumerType.Shared,
                             initial_position=pulsar.InitialPosition.Earliest)
    out = client.subscribe(business, "dl-demo-reader", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    # The demo's syncer counts in 3-s units, so it serves a delay-level topic of its own; the shipped
    # syncer serves DelayLevelProducer's default, the shared persistent://public/default/delay-level.
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched), strategy=strategy,
                                  delay_level_topic=f"{business}-delay-level")
    delays = {"in-1s": 1000, "in-4.5s": 4500, "in-8s": 8000, "in-13s": 13000}
    sent: Dict[str, Any] = {}
    forwarded: Dict[str, Any] = {}
    released: Dict[str, Any] = {}
    try:
        _wait_started(writer)
        _wait_started(syncer)
        start = now_ms()
        for name, d in delays.items():
            sent[name] = (start + d, producer.send(name.encode(), deliver_at_ms=start + d))
        deadline = time.monotonic() + max(delays.values()) / 1000 + 15
        while len(released) < len(delays) and time.monotonic() < deadline:
            for consumer, into in ((watch, forwarded), (out, released)):
                try:
                    m = consumer.receive(timeout_millis=50)
                except pulsar.Timeout:
                    continue
                props = m.properties()
                at = int(props[RELEASED_AT_PROP]) if into is released else m.publish_timestamp()
                if into is released or ORIGIN_PARTITION_PROP in props:
                    into[m.data().decode()] = at
                consumer.acknowledge(m)
    finally:
        producer.close()
        client.close()
        syncer.stop()
        writer.stop()
    rows, ok = [], len(released) == len(delays)
    for name, (deliver_at, where) in sent.items():
        rel = released.get(name)
        fwd = forwarded.get(name)
        path = f"partition {where.partition}" if where.parked else "near-term"
        ok = ok and rel is not None and rel >= deliver_at and (not where.parked or (fwd is not None and fwd < deliver_at))
        rows.append([name, path, f"+{deliver_at - start} ms", f"+{fwd - start} ms" if fwd else "-",
                     f"+{rel - start} ms" if rel else "not released", f"{rel - deliver_at} ms" if rel else "-"])
    note = (f"delay-level topic {business}-delay-level: {strategy.partitions} partitions of {unit_s} s; "
            f"parked messages are forwarded {lookahead_ms} ms before their slice ends")
    return SceneResult("delay-level-syncer + bucket-snapshot-writer",
                       ["message", "path", "deliver at", "forwarded at", "released at", "lateness"], rows, ok, note)


SPARK_JOBS = 120  # delayed messages the offline scene exports, seeds, verifies and releases
SPARK_DUE_S = (90, 150)  # when they come due, in seconds after they were sent


def _cli(*args: str, cwd: Path) -> "subprocess.CompletedProcess[str]":
    """One `pulsar-lifecycle` command in a child process (each Spark command starts its own JVM)."""
    return subprocess.run([sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "ERROR", *args], cwd=cwd,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)


def _said(res: "subprocess.CompletedProcess[str]", look_for: str = "") -> str:
    """What a step's command said: its stdout line containing `look_for` (else its last), past the
    progress lines; its stderr (the JVM's own notices included) only when stdout is empty."""
    for text in (res.stdout, res.stderr):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "stage(s) active" not in ln]
        if lines:
            return next((ln for ln in lines if look_for and look_for in ln), lines[-1])[:160]
    return f"exit {res.returncode}"


def scene_spark(broker: DemoBroker, data_dir: Path, configs: Path) -> SceneResult:
    """The offline pipeline: delayed messages wait on the scheduling topic of a writer that is not
    deployed yet; export-backlog drains them to Parquet, `spark seed` builds the writer's bucket
    snapshots with PySpark, `spark verify` checks them (and draws buckets.png), and the writer
    started on the seeded store releases them on time without replaying the backlog."""
    work = data_dir / "spark-scene"
    work.mkdir(parents=True, exist_ok=True)
    ns = "persistent://public/default"
    cfg = load_function_config(configs / "bucket-snapshot-writer.yaml")
    ticks, sched, out = f"{ns}/spark-demo-ticks", f"{ns}/spark-demo-scheduling", f"{ns}/spark-demo-released"
    specs = list(cfg["inputSpecs"].values())
    cfg.update(name="spark-demo-writer", output=out, inputSpecs={ticks: specs[0], sched: specs[1]})
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=ticks, schedulingTopic=sched, snapshotDir=str(work / "store"),
                             delayedDeliveryMinIndexCountPerBucket=40)
    config = work / "writer.yaml"
    config.write_text(yaml.safe_dump(cfg))
    fqfn = f"{cfg['tenant']}/{cfg['namespace']}/{cfg['name']}"
    client = quiet_client(broker.service_url)
    producer = DelayedProducer(client, scheduling_topic=sched)
    start = now_ms()
    # Due SPARK_DUE_S from now: the export, the seed and the verify take about 110 s on a loaded
    # 2-core machine, so most come due after the writer starts and show it keeping time; any due
    # before it started are released at its start.
    first_s, last_s = SPARK_DUE_S
    due = {f"job-{i}": start + first_s * 1000 + (i * (last_s - first_s) * 1000) // SPARK_JOBS for i in range(SPARK_JOBS)}
    try:
        for name, at in due.items():
            producer.send_async(out, name.encode(), at, lambda res, mid: None)
        producer.flush()
    finally:
        producer.close()
        client.close()
    steps = [
        ("export-backlog", ["export-backlog", "--service-url", broker.service_url, "--topic", sched, "--subscription",
                            fqfn, "--store", "store", "--wake-topic", ticks, "--out", "backlog/", "--idle-ms", "1500"]),
        ("spark seed", ["spark", "seed", "backlog/", "--store", "store", "--function-config-file", str(config),
                        "--master", "local[2]"]),
        ("spark verify", ["spark", "verify", "--store", "store", "--against", "backlog/", "--function-config-file",
                          str(config), "--out", "verify-report/", "--master", "local[2]"]),
    ]
    rows: List[List[str]] = []
    ok = True
    for label, args in steps:
        t0 = time.monotonic()
        res = _cli(*args, cwd=work)
        rows.append([label, f"{time.monotonic() - t0:.1f} s", _said(res, "violations" if label == "spark verify" else "")])
        if res.returncode != 0:
            return SceneResult("offline pipeline (PySpark)", ["step", "took", "said"], rows, False,
                               f"{label} failed: {(res.stdout + res.stderr)[-1500:]}")
        ok = ok and (label != "spark verify" or "OK: no violations" in res.stdout)
    picture = work / "verify-report" / "buckets.png"
    store = DirectorySnapshotStorage(work / "store")
    seeded = len(store.list_snapshots())
    writer = start_function(config, broker, data_dir)
    client = quiet_client(broker.service_url)
    writer_start = now_ms()
    try:
        got = receive_n(client, out, SPARK_JOBS, timeout=max(0, max(due.values()) - now_ms()) / 1000 + 30)
    finally:
        client.close()
        writer.stop()
    lateness = [int(m.properties()[RELEASED_AT_PROP]) - due[m.data().decode()] for m in got]
    names = [m.data().decode() for m in got]
    ok = ok and len(got) == SPARK_JOBS and len(set(names)) == SPARK_JOBS and min(lateness, default=-1) >= 0
    on_time = sorted(late for m, late in zip(got, lateness) if due[m.data().decode()] > writer_start + 5000)
    rows.append(["writer on the seeded store", f"started +{(writer_start - start) / 1000:.0f} s",
                 f"released {len(got)}/{SPARK_JOBS} once (due +{first_s}..+{last_s} s), none early; "
                 + (f"the {len(on_time)} due after its start: lateness median {on_time[len(on_time) // 2]} ms, "
                    f"max {on_time[-1]} ms" if on_time else "all were due before it started")])
    note = (f"{seeded} bucket snapshot(s) seeded; verify report: {work / 'verify-report' / 'summary.txt'}; "
            f"the picture: {picture}" + ("" if picture.is_file() else " (not written)"))
    return SceneResult("offline pipeline: export-backlog -> spark seed -> spark verify -> writer",
                       ["step", "took", "said"], rows, ok and picture.is_file(), note)


def _snapshot_count(store: Any) -> int:
    return len(store.list_snapshots())


SCENES: List[Callable[[DemoBroker, Path, Path], SceneResult]] = [scene_example, scene_delayed_delivery,
                                                                 scene_delay_level]

_MIB = 2**20


def start_pulsar(data_dir: Path, console: Console) -> PulsarStandalone:
    """Start a real Apache Pulsar standalone with its data in `data_dir`; say what it does first.

    The release is resolved with Maven on a machine's first run (about 260 MB from Maven
    Central, once), which takes minutes: the console says so before it starts.
    """
    java_executable()  # a missing or old Java is reported before anything is downloaded
    version = pinned_version()
    home = cache_root() / f"pulsar-{version}"
    if not (home / "classpath.txt").is_file():
        console.print(f"resolving Apache Pulsar {version} with Maven into {home}: first run on this machine, "
                      "about 260 MB from Maven Central, once; later runs start from the cache", soft_wrap=True)
    with console.status(f"resolving Apache Pulsar {version} ..."):
        resolve(version, progress=False)
    # A kept --data-dir starts again on the ports it ran on (PulsarStandalone keeps them there).
    pulsar = PulsarStandalone(data_dir=data_dir, version=version)
    with console.status(f"starting Apache Pulsar {version} standalone on 127.0.0.1 ..."):
        pulsar.start()
    console.print(f"[bold]Apache Pulsar {version}[/bold] standalone (pid {pulsar.pid}, data in {data_dir})\n"
                  f"  broker {pulsar.service_url}   admin {pulsar.admin_url}\n"
                  f"  bookie HTTP {pulsar.bookie_http_url}   table service (function state) {pulsar.state_storage_url}\n"
                  f"  started in {pulsar.startup_seconds:.1f} s, RSS {pulsar.rss_bytes() / _MIB:.0f} MiB", soft_wrap=True)
    return pulsar


@dataclass
class StopSignals:
    """Ctrl-C and SIGTERM while the demo runs, remembered until the demo has stopped.

    The handlers raise as usual (KeyboardInterrupt, SystemExit), but pulsar-client turns an
    exception raised by a signal handler during one of its blocking calls into
    `pulsar.Interrupted`, an ordinary Exception that a best-effort close may swallow. So the
    signal is also kept, and `check()` between scenes raises it again.
    """

    received: List[int] = field(default_factory=list)
    _previous: Dict[int, Any] = field(default_factory=dict, repr=False)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: Optional[FrameType]) -> None:
        self.received.append(signum)
        log.info("event=demo_signal_received signal=%d", signum)
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def check(self) -> None:
        """Raise again for a signal received so far (one a pulsar-client call swallowed)."""
        if self.received:
            self._raise(self.received[0])


def run_scenes(broker: DemoBroker, data_dir: Path, console: Console, stop: Optional[StopSignals] = None,
               spark: bool = False) -> bool:
    """Run every scene on `broker` (with `spark`, the offline pipeline's too); print a table per
    scene; True if all passed."""
    configs = find_config_dir()
    ok = True
    for scene in SCENES + ([scene_spark] if spark else []):
        if stop is not None:
            stop.check()
        with console.status(f"running {scene.__name__} ..."):
            result = scene(broker, data_dir, configs)
        table = Table(title=f"{result.title} — {'OK' if result.ok else 'FAILED'}")
        for col in result.columns:
            table.add_column(col)
        for row in result.rows:
            table.add_row(*row)
        console.print(table)
        if result.note:
            console.print(result.note)
        ok = ok and result.ok
    return ok


def run_demo(data_dir: Optional[Path] = None, console: Optional[Console] = None, pulsar: bool = False,
             spark: bool = False) -> bool:
    """Run every scene on one embedded broker, or with `pulsar` on a real Apache Pulsar standalone.

    The broker is stopped however the run ends (a failed scene, Ctrl-C, SIGTERM): the standalone's
    JVM is stopped and waited for before this returns or raises. True if every scene passed.
    """
    console = console or Console()
    find_config_dir()  # fail before any broker starts
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="pulsar-lifecycle-demo-")
        data_dir = Path(tmp.name)
    try:
        with StopSignals() as stop:
            if pulsar:
                standalone = start_pulsar(data_dir / "pulsar", console)
                pid = standalone.pid
                try:
                    ok = run_scenes(standalone, data_dir, console, stop, spark)
                    console.print(f"Apache Pulsar RSS after the scenes: {standalone.rss_bytes() / _MIB:.0f} MiB")
                finally:
                    with console.status("stopping Apache Pulsar ..."):
                        standalone.stop()
                    console.print(f"Apache Pulsar stopped (pid {pid} has exited)")
            else:
                with EmbeddedBroker(data_dir=data_dir / "broker") as broker:
                    console.print(f"[bold]embedded broker[/bold] {broker.service_url} (data in {data_dir})",
                                  soft_wrap=True)
                    ok = run_scenes(broker, data_dir, console, stop, spark)
            stop.check()
    finally:
        if tmp is not None:
            tmp.cleanup()
    console.print("[bold green]all scenes OK[/bold green]" if ok else "[bold red]some scenes FAILED[/bold red]")
    return ok


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, callback=absolute_path,
              help="Keep broker data and state here (default: a temporary directory).")
@click.option("--pulsar", "real_pulsar", is_flag=True, default=False,
              help="Run on a real Apache Pulsar standalone on 127.0.0.1 (Java 17+; the first run resolves "
                   "the release with Maven from Maven Central into ~/.cache/pulsar-lifecycle).")
@click.option("--spark", "spark", is_flag=True, default=False,
              help="Also show the offline pipeline: export a backlog, seed a fresh writer's snapshots with PySpark, "
                   "verify them (buckets.png) and release from the seeded store (extra `spark`, Java 17+).")
def demo(data_dir: Optional[str], real_pulsar: bool, spark: bool) -> None:
    """Run the whole system on the embedded broker (or real Pulsar) and show what every function does."""
    # pulsar-client logs an ERROR for every empty topic the dedup recovery probes; expected here.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("pulsar.client").setLevel(logging.CRITICAL)
    if not run_demo(Path(data_dir) if data_dir else None, pulsar=real_pulsar, spark=spark):
        raise SystemExit(1)
