"""Shared pieces of the BucketSnapshotWriter benchmarks: subprocesses, load, collection, stats.

The two benchmarks run everything against one embedded pulsar-lite broker started by the bench:
- the writer: `python -m pulsar_lifecycle.cli localrun --function-config-file X --broker-service-url URL`
  in its own process, like a deployed function;
- the baseline pipe: this file run as `pipe`, also in its own process: the runtime's client
  settings (make_client), a Shared consumer with a message listener and a batching producer with
  the runtime's output settings; each message is acked once its publish is confirmed.
The batched pipe (this file run as `batched-pipe`) is bench/_pipe.py, the batched baseline every
pipe comparison shares: `batch_receive` (up to 500 messages, 5 ms to fill, the writer's ingest
defaults), sends without per-message callbacks, one completion callback per batch and the batch's
acks in it. Run as `journaled-pipe` it is bench/_pipe.py's journaled pipe: the same, plus a durable
append of each batch (positions, deliver-at, payloads) to `journal` in its working directory before
the batch is sent with sequence and origin ids: the floor of any writer durable before it acks. As
`native-pipe` and `journaled-native-pipe` the two receive and send through pulsar-client's native
objects, as the writer does (`--native`).
A further reference is an identity function (`Identity` below) run through the same localrun
runtime: it shows what the runtime's one-message-at-a-time model costs before the writer does
any work of its own.
The paced producer of the lateness benchmark is this file run as `paced` (its own process, so its
Python work does not share a GIL with the consumer that timestamps arrivals); with `--native` it
also sets Pulsar's own deliver-at on each message (the broker's delayed delivery, for
bench_vs_pulsar.py).

    python bench/_writer_common.py pipe --service-url URL --input T --output T --subscription S
    python bench/_writer_common.py batched-pipe --service-url URL --input T --output T --subscription S
    python bench/_writer_common.py journaled-pipe --service-url URL --input T --output T --subscription S
    python bench/_writer_common.py native-pipe|journaled-native-pipe --service-url URL --input T --output T --subscription S
    python bench/_writer_common.py paced --service-url URL --topic T --rate R --seconds S --start-ms T0 --lead-ms L [--native]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pulsar
import yaml

import _pipe
from pulsar_lifecycle.runtime.broker import free_port  # noqa: F401 - re-exported for the benchmarks
from pulsar_lifecycle.runtime.client import ClientSettings, make_client, quiet_client
from pulsar_lifecycle.scheduler.config import check_writer_inputs
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

ROOT = Path(__file__).resolve().parents[1]
WRITER_CONFIG = ROOT / "function-configs" / "bucket-snapshot-writer.yaml"
PROCESS_START_TIMEOUT_S = 60.0
PACED_BATCHING_DELAY_MS = 5  # the paced and loading producers' batchingMaxPublishDelay


def byte_compile_package() -> str:
    """Byte-compile pulsar_lifecycle and functions/ as pip does when it installs the wheel, so a
    writer start measured here reads bytecode as an installed one does. An editable install has
    none, and with PYTHONDONTWRITEBYTECODE set (as on this machine and in many container images)
    every start compiles the ~200 modules again: about 0.1 s more per start. Returns a line
    saying what was compiled."""
    import compileall

    import pulsar_lifecycle

    dirs = [Path(pulsar_lifecycle.__file__).resolve().parent, ROOT / "functions"]
    for d in dirs:
        if not compileall.compile_dir(str(d), quiet=1):
            raise RuntimeError(f"byte-compiling {d} failed")
    return "byte-compiled " + ", ".join(str(d) for d in dirs) + " (as an installed wheel is)"


def now_ms() -> int:
    """Wall clock in ms (deliver-at and released-at are wall-clock instants)."""
    return int(time.time() * 1000)


def payload_of(i: int, size: int) -> bytes:
    """A `size`-byte payload that starts with the message's index (so duplicates can be counted)."""
    head = b"%010d" % i
    return head + b"." * max(0, size - len(head))


def index_of(payload: bytes) -> int:
    """The index payload_of() put in front."""
    return int(payload[:10])


# -- processes under test ----------------------------------------------------------------------------
@dataclass
class Topics:
    """The topics of one run; unique names so runs never see each other's messages."""

    sched: str
    ticks: str
    out: str


def topics_for(tag: str) -> Topics:
    """Fresh topic names for one run."""
    unique = f"{tag}-{os.getpid()}-{time.time_ns() % 10**12}"
    return Topics(f"persistent://public/default/bsched-{unique}", f"persistent://public/default/bticks-{unique}",
                  f"persistent://public/default/bout-{unique}")


def write_writer_config(workdir: Path, topics: Topics, intake: str = "direct", **user: object) -> Path:
    """The shipped writer config with this run's topics, name and snapshot dir.

    intake "direct" is the shipped config (schedulingTopic, consumed in batches by the writer; the
    scheduling topic is also an input with a receiver queue of 1, which starts the writer on its first
    message); "runtime" makes the scheduling topic an ordinary function input instead.
    """
    cfg = yaml.safe_load(WRITER_CONFIG.read_text())
    name = "bench-writer-" + topics.out.rsplit("-", 2)[-2] + "-" + topics.out.rsplit("-", 1)[-1]
    cfg["inputSpecs"] = {topics.ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"},
                         topics.sched: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    cfg.update(output=topics.out, name=name, subName=name)
    # One subscription for the scheduling topic's two consumers (the direct one and the runtime's),
    # as `validate` requires: with subName set, schedulingSubscription must name it too, or both
    # subscriptions get every message and the writer indexes each one twice.
    user = {"schedulingSubscription": name, **user}
    cfg["userConfig"].update(tickTopic=topics.ticks, snapshotDir=str(workdir / "snapshots"),
                             schedulingTopic=topics.sched, **user)
    if intake == "runtime":
        del cfg["userConfig"]["schedulingTopic"]
        cfg["inputSpecs"][topics.sched] = {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe",
                                           "receiverQueueSize": 1000}
    problems = check_writer_inputs(cfg)  # what `validate` says about the intake's inputs
    if problems:
        raise ValueError(f"bench writer config: {problems}")
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Identity:
    """The reference function: returns its input (ATLEAST_ONCE, acked after the publish)."""

    def process(self, input: bytes, context: object) -> bytes:  # noqa: A002 - Pulsar's parameter name
        return input


def write_identity_config(workdir: Path, topics: Topics) -> Path:
    """Function config of `Identity` reading the scheduling topic and writing the output topic."""
    cfg = {
        "tenant": "public", "namespace": "default", "name": "bench-identity", "className": "_writer_common.Identity",
        "inputSpecs": {topics.sched: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1000}},
        "output": topics.out, "outputSerdeClassName": "pulsar_lifecycle.serde.BytesSerDe",
        "processingGuarantees": "ATLEAST_ONCE", "subName": "bench-identity", "subscriptionPosition": "Earliest",
        "parallelism": 1,
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "identity.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_localrun(config: Path, service_url: str, workdir: Path, metrics_port: Optional[int] = None) -> subprocess.Popen:
    """`pulsar_lifecycle.cli localrun` of `config` in its own process (stderr to workdir/localrun.log).

    This directory is put on PYTHONPATH so `_writer_common.Identity` can be loaded.
    """
    extra = ["--metrics-port-start", str(metrics_port)] if metrics_port is not None else []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with open(workdir / "localrun.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING", "localrun",
             "--function-config-file", str(config), "--broker-service-url", service_url,
             "--data-dir", str(workdir / "data"), *extra],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=workdir, env=env,
        )


def start_pipe(service_url: str, topics: Topics, workdir: Path, kind: str = "pipe") -> subprocess.Popen:
    """A baseline pipe (this file's `pipe`, `batched-pipe`, `journaled-pipe`, `native-pipe` or
    `journaled-native-pipe` command) in its own process
    (log: <kind>.log; the journaled pipe's journal: <workdir>/journal)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / f"{kind}.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), kind, "--service-url", service_url,
             "--input", topics.sched, "--output", topics.out, "--subscription", "bench-pipe"],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=workdir,
        )


def start_paced(service_url: str, topic: str, rate: int, seconds: float, start_ms: int, lead_ms: int,
                payload_bytes: int, workdir: Path, native: bool = False,
                batching_delay_ms: int = PACED_BATCHING_DELAY_MS) -> subprocess.Popen:
    """The paced producer (this file's `paced` command) in its own process; lead_ms=0 stamps send time.

    native=True also sets Pulsar's deliver-at on each message (the broker's delayed delivery)."""
    with open(workdir / "paced.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "paced", "--service-url", service_url, "--topic", topic,
             "--rate", str(rate), "--seconds", str(seconds), "--start-ms", str(start_ms), "--lead-ms", str(lead_ms),
             "--payload-bytes", str(payload_bytes), "--batching-delay-ms", str(batching_delay_ms),
             *(["--native"] if native else [])],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=workdir,
        )


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGINT (localrun and pipe both stop cleanly on it), then SIGKILL after `timeout`; by pid only."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return int(proc.returncode)


def cpu_seconds(pid: int) -> float:
    """user+system CPU seconds a process has used so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def received_count(metrics_port: int) -> int:
    """Scheduling messages the writer has made durable and acked (its
    pulsar_lifecycle_scheduler_received_total, recorded every metricsIntervalSeconds); -1 if unreadable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as resp:
            text = resp.read().decode("utf-8", "replace")
    except OSError:
        return -1
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("pulsar_lifecycle_scheduler_received_total{")))


def log_tail(path: Path, chars: int = 2000) -> str:
    """The end of a subprocess log, for error messages."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# -- load and collection -----------------------------------------------------------------------------
def batching_producer(client: pulsar.Client, topic: str,
                      batching_delay_ms: int = PACED_BATCHING_DELAY_MS) -> pulsar.Producer:
    """Scheduling producers must batch: pulsar-lite dispatches unbatched messages ~100x slower."""
    return client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=batching_delay_ms,
                                  batching_max_messages=1000, max_pending_messages=5000, block_if_queue_full=True)


@dataclass
class Received:
    """What the checking consumer saw, one entry per received message (parallel lists)."""

    arrival_ms: List[float] = field(default_factory=list)
    deliver_at: List[int] = field(default_factory=list)
    released_at: List[int] = field(default_factory=list)
    seen: Dict[int, int] = field(default_factory=dict)  # payload index -> times received

    @property
    def unique(self) -> int:
        return len(self.seen)

    @property
    def duplicates(self) -> int:
        return sum(c - 1 for c in self.seen.values())


def output_consumer(client: pulsar.Client, topic: str) -> pulsar.Consumer:
    """The benchmark's own consumer of the output topic (subscribed before any output exists)."""
    return client.subscribe(topic, "bench-check", consumer_type=pulsar.ConsumerType.Shared,
                            initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)


def collect(consumer: pulsar.Consumer, expect: int, timeout_s: float, quiet_s: float = 0.0,
            alive: Optional[subprocess.Popen] = None) -> Received:
    """Receive until `expect` distinct payloads arrived (then `quiet_s` more for late copies) or timeout.

    The arrival time is taken right after receive() returns: the consumer keeps up easily (pulsar-lite
    dispatches ~200k msg/s to a Python consumer), so it is the dispatch time within about a ms.
    Stops early when `alive` (the process under test) has exited.
    """
    got = Received()
    deadline = time.monotonic() + timeout_s
    quiet_until: Optional[float] = None
    while time.monotonic() < deadline:
        if quiet_until is not None and time.monotonic() >= quiet_until:
            break
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            if alive is not None and alive.poll() is not None:
                break
            continue
        arrival = time.time() * 1000.0
        props = m.properties()
        got.arrival_ms.append(arrival)
        got.deliver_at.append(int(props.get(DELIVER_AT_PROP, "0")))
        got.released_at.append(int(props.get(RELEASED_AT_PROP, "0")))
        i = index_of(m.data())
        got.seen[i] = got.seen.get(i, 0) + 1
        consumer.acknowledge(m)
        if quiet_until is None and len(got.seen) >= expect:
            quiet_until = time.monotonic() + quiet_s
    return got


def warm_up(client: pulsar.Client, topics: Topics, consumer: pulsar.Consumer, proc: subprocess.Popen,
            log: Path) -> float:
    """Send one due message and wait for it on the output: the process is subscribed and built.

    (The writer builds its scheduler - recovery, dedup publisher - on the first message.) Returns
    how long it took, in seconds.
    """
    t0 = time.monotonic()
    prod = client.create_producer(topics.sched, batching_enabled=False)
    prod.send(payload_of(10**9 - 1, 20), properties={DELIVER_AT_PROP: str(now_ms())})
    prod.close()
    while time.monotonic() - t0 < PROCESS_START_TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"process under test exited rc={proc.returncode}: {log_tail(log)}")
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(m)
        return time.monotonic() - t0
    raise RuntimeError(f"no warm-up release within {PROCESS_START_TIMEOUT_S:.0f}s: {log_tail(log)}")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    k = max(0, min(len(ordered) - 1, int(round(q / 100.0 * len(ordered) + 0.5)) - 1))
    return float(ordered[k])


# -- the helper processes ----------------------------------------------------------------------------
def _pipe_start(service_url: str, output_topic: str) -> Tuple[threading.Event, pulsar.Client, pulsar.Producer]:
    """What both pipes start with: a stop event set by SIGINT/SIGTERM, a client with the runtime's
    settings and a producer with the runtime's output producer settings (runtime/instance.py,
    dedup/publisher.py)."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = make_client(ClientSettings(service_url))
    producer = client.create_producer(output_topic, block_if_queue_full=True, batching_enabled=True,
                                      batching_max_publish_delay_ms=10, send_timeout_millis=0,
                                      compression_type=pulsar.CompressionType.LZ4)
    return stop, client, producer


def run_pipe(service_url: str, input_topic: str, output_topic: str, subscription: str, max_seconds: float) -> None:
    """Consume -> produce, acking after the publish is confirmed; until SIGINT/SIGTERM or max_seconds."""
    stop, client, producer = _pipe_start(service_url, output_topic)

    def listener(consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
        props = dict(msg.properties())
        props[RELEASED_AT_PROP] = str(now_ms())

        def done(res: pulsar.Result, _mid: object) -> None:
            if res == pulsar.Result.Ok:
                consumer.acknowledge(msg)
            else:
                consumer.negative_acknowledge(msg)

        producer.send_async(msg.data(), done, properties=props)

    consumer = client.subscribe(input_topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest, message_listener=listener,
                                receiver_queue_size=1000)
    stop.wait(max_seconds)
    consumer.pause_message_listener()
    producer.flush()
    consumer.close()
    producer.close()
    client.close()


# This file's commands that run bench/_pipe.py: the batched pipe and its floors.
PIPE_FLOORS = ("journaled-pipe", "native-pipe", "journaled-native-pipe")
BATCHED_PIPES = ("batched-pipe", *PIPE_FLOORS)


def run_batched_pipe(service_url: str, input_topic: str, output_topic: str, subscription: str,
                     max_seconds: float, journal: Optional[Path] = None, native: bool = False) -> None:
    """The shared batched pipe (bench/_pipe.py) on one input topic, until SIGINT/SIGTERM or max_seconds;
    with `journal`, the journaled pipe; with `native`, through the native client objects."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _pipe.run_batched_pipe(service_url, [input_topic], output_topic, subscription, stop, max_seconds,
                           journal=journal, native=native)


def run_paced(service_url: str, topic: str, rate: int, seconds: float, start_ms: int, lead_ms: int,
              payload_bytes: int, native: bool = False, batching_delay_ms: int = PACED_BATCHING_DELAY_MS) -> None:
    """Send rate*seconds messages; message i is due at start_ms + i/rate s and sent lead_ms before that.

    With lead_ms == 0 (the pipe's baseline) the deliver-at property is the actual send time, so the
    consumer's arrival - deliver-at is the pipe's end-to-end latency. native=True also hands the
    deliver-at to the broker (pulsar-client's deliver_at: the broker's tracker holds the message;
    the client sends such messages unbatched, each its own entry, as Pulsar requires).
    """
    client = quiet_client(service_url)
    producer = batching_producer(client, topic, batching_delay_ms)
    n = int(rate * seconds)
    step = 1000.0 / rate
    hard_deadline = time.monotonic() + seconds + lead_ms / 1000.0 + max(0.0, (start_ms - now_ms()) / 1000.0) + 60
    behind_max = 0.0
    i = 0
    while i < n and time.monotonic() < hard_deadline:
        now = time.time() * 1000.0
        while i < n and start_ms + i * step - lead_ms <= now:
            at = int(start_ms + i * step) if lead_ms > 0 else now_ms()
            if native:
                producer.send_async(payload_of(i, payload_bytes), None, properties={DELIVER_AT_PROP: str(at)},
                                    deliver_at=at)
            else:
                producer.send_async(payload_of(i, payload_bytes), None, properties={DELIVER_AT_PROP: str(at)})
            behind_max = max(behind_max, now - (start_ms + i * step - lead_ms))
            i += 1
        time.sleep(0.002)
    producer.flush()
    print(f"paced: sent {i}/{n} messages, at most {behind_max:.0f} ms behind schedule", file=sys.stderr, flush=True)
    producer.close()
    client.close()


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for kind in ("pipe",) + BATCHED_PIPES:
        p = sub.add_parser(kind)
        p.add_argument("--service-url", required=True)
        p.add_argument("--input", required=True)
        p.add_argument("--output", required=True)
        p.add_argument("--subscription", required=True)
        p.add_argument("--max-seconds", type=float, default=900.0)
    q = sub.add_parser("paced")
    q.add_argument("--service-url", required=True)
    q.add_argument("--topic", required=True)
    q.add_argument("--rate", type=int, required=True)
    q.add_argument("--seconds", type=float, required=True)
    q.add_argument("--start-ms", type=int, required=True)
    q.add_argument("--lead-ms", type=int, required=True)
    q.add_argument("--payload-bytes", type=int, default=100)
    q.add_argument("--native", action="store_true", help="Also set Pulsar's deliver-at (broker delayed delivery).")
    q.add_argument("--batching-delay-ms", type=int, default=PACED_BATCHING_DELAY_MS,
                   help="The producer's batchingMaxPublishDelay.")
    args = ap.parse_args(argv)
    if args.cmd == "pipe":
        run_pipe(args.service_url, args.input, args.output, args.subscription, args.max_seconds)
    elif args.cmd in BATCHED_PIPES:
        run_batched_pipe(args.service_url, args.input, args.output, args.subscription, args.max_seconds,
                         journal=Path("journal").resolve() if args.cmd.startswith("journaled") else None,
                         native=args.cmd.endswith("native-pipe"))
    else:
        run_paced(args.service_url, args.topic, args.rate, args.seconds, args.start_ms, args.lead_ms,
                  args.payload_bytes, args.native, args.batching_delay_ms)


if __name__ == "__main__":
    main()
