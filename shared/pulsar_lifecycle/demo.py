"""`pulsar-lifecycle demo`: the whole system on the embedded broker, end to end.

Starts one pulsar-lite, runs every shipped function with its function-config YAML through the
local run mode, feeds each one and shows what comes out. Exit status 0 only if every scene
saw what it expected.
"""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

import click
import pulsar
from rich.console import Console
from rich.table import Table

from .config.function_config import load_function_config, spec_from_config
from .runtime.broker import EmbeddedBroker
from .runtime.client import quiet_client, receive_messages
from .runtime.localrun import LocalRunner, LocalRunOptions

log = logging.getLogger(__name__)


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


def start_function(config: Path, broker: EmbeddedBroker, data_dir: Path, **overrides) -> LocalRunner:
    """Run one function config on `broker` via the local run mode."""
    spec = spec_from_config(load_function_config(config), overrides or None)
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=data_dir / spec.name,
                           nack_redelivery_delay_ms=1000)
    return LocalRunner(spec, opts).start()


def receive_n(client: pulsar.Client, topic: str, n: int, timeout: float) -> List[pulsar.Message]:
    """Up to `n` messages from `topic` within `timeout` seconds (Shared, Earliest)."""
    return receive_messages(client, topic, "demo-reader", n, timeout)


def scene_example(broker: EmbeddedBroker, data_dir: Path, configs: Path) -> SceneResult:
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


def scene_delayed_delivery(broker: EmbeddedBroker, data_dir: Path, configs: Path) -> SceneResult:
    """BucketSnapshotWriter + LedgerDeletionWorker: messages leave on time, exhausted snapshots
    are deleted through two-phase deletion."""
    from .bucket.storage_dir import DirectorySnapshotStorage
    from .scheduler.service import RELEASED_AT_PROP
    from .timing import DelayedProducer, now_ms

    snap_dir = data_dir / "bucket-snapshots"
    wcfg = load_function_config(configs / "bucket-snapshot-writer.yaml")
    sched = wcfg["userConfig"]["schedulingTopic"]
    writer = start_function(configs / "bucket-snapshot-writer.yaml", broker, data_dir, userConfig=dict(
        wcfg["userConfig"], snapshotDir=str(snap_dir), snapshotDeletion="two-phase",
        snapshotDeletionSendDelaySeconds=1, maxUnackedPerBucket=4, tickTimeMillis=200))
    dcfg = load_function_config(configs / "ledger-deletion-worker.yaml")
    # No admin REST or bookies here: the worker only serves the scheduler's snapshot requests.
    duser = {k: v for k, v in dcfg["userConfig"].items() if k not in ("pulsarAdminUrl", "bookieHttpUrls")}
    worker = start_function(configs / "ledger-deletion-worker.yaml", broker, data_dir, parallelism=1, userConfig=dict(
        duser, schedulingTopic=sched, reconsumeLaterSeconds=1,
        bucketSnapshotHooks="pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks",
        bucketSnapshotDir=str(snap_dir)))
    client = quiet_client(broker.service_url)
    producer = DelayedProducer(client, scheduling_topic=sched)
    store = DirectorySnapshotStorage(snap_dir)
    # The writer builds its service (recovery, publisher) on its first tick; start after that.
    ready = time.monotonic() + 15
    while time.monotonic() < ready and getattr(writer.functions()[0], "service", None) is None:
        time.sleep(0.05)
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


def _wait_started(runner: LocalRunner, timeout: float = 15.0) -> None:
    """Wait until the runner's function built its service (on its first tick)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and getattr(runner.functions()[0], "service", None) is None:
        time.sleep(0.05)


def scene_delay_level(broker: EmbeddedBroker, data_dir: Path, configs: Path) -> SceneResult:
    """DelayLevelProducer -> delay-level partitions -> DelayLevelSyncer -> BucketSnapshotWriter:
    parked messages are forwarded a lookahead before their deliver-at and released on time."""
    from .delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
    from .delaylevel.producer import DelayLevelProducer
    from .delaylevel.rule import ORIGIN_PARTITION_PROP
    from .scheduler.service import RELEASED_AT_PROP
    from .timing import DelayedProducer, now_ms

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
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched), strategy=strategy)
    delays = {"in-1s": 1000, "in-4.5s": 4500, "in-8s": 8000, "in-13s": 13000}
    sent, forwarded, released = {}, {}, {}
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


def _snapshot_count(store: Any) -> int:
    return len(store.list_snapshots())


SCENES: List[Callable[[EmbeddedBroker, Path, Path], SceneResult]] = [scene_example, scene_delayed_delivery,
                                                                   scene_delay_level]


def run_demo(data_dir: Optional[Path] = None, console: Optional[Console] = None) -> bool:
    """Run every scene on one embedded broker; print a table per scene; True if all passed."""
    console = console or Console()
    configs = find_config_dir()
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="pulsar-lifecycle-demo-")
        data_dir = Path(tmp.name)
    ok = True
    with EmbeddedBroker(data_dir=data_dir / "broker") as broker:
        console.print(f"[bold]embedded broker[/bold] {broker.service_url} (data in {data_dir})")
        for scene in SCENES:
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
    if tmp is not None:
        tmp.cleanup()
    console.print("[bold green]all scenes OK[/bold green]" if ok else "[bold red]some scenes FAILED[/bold red]")
    return ok


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Keep broker data and state here (default: a temporary directory).")
def demo(data_dir: Optional[str]) -> None:
    """Run the whole system on the embedded broker and show what every function does."""
    # pulsar-client logs an ERROR for every empty topic the dedup recovery probes; expected here.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("pulsar.client").setLevel(logging.CRITICAL)
    if not run_demo(Path(data_dir) if data_dir else None):
        raise SystemExit(1)
