"""Side by side with Pulsar's own delayed delivery and de-duplication, on real Apache Pulsar (issue 22).

Every contender runs against a real Apache Pulsar 4.0.0 standalone on loopback
(runtime/pulsar_standalone.py), one standalone per broker configuration, each started, used and
stopped in turn. The same message set for every contender: payload i is `_writer_common.payload_of(i,
100)` (100 bytes that name the message, so the checking consumer counts each one) with the
deliver-at in the `__pl_deliver_at__` property; the broker's contenders get the same instant as
pulsar-client's `deliver_at` (the client sends such messages unbatched: one entry each, as Pulsar
requires). The contenders:
- writer: BucketSnapshotWriter, the shipped config (function-configs/bucket-snapshot-writer.yaml,
  direct intake) with this run's topics, `pulsar_lifecycle.cli localrun --broker-service-url` in its
  own process (bench/_writer_common.py);
- inmemory / bucket: the broker's `deliverAt` with InMemoryDelayedDeliveryTrackerFactory or
  BucketDelayedDeliveryTrackerFactory (PIP-195, default settings; ledgers roll every 50,000 entries
  without the default 10-minute wait, BROKER_CONFIG, so buckets seal), at `delayedDeliveryTickTimeMillis`
  1000 (the default) and, for lateness, 100; non-strict (`isDelayedDeliveryDeliverAtTimeStrict`
  false, the default: a message may be delivered up to one tick early);
- batched-pipe: bench/_writer_common.py `batched-pipe`, a consume->produce pipe with no delay
  (batch_receive, one callback per batch), the throughput reference on the same broker.
The checking consumer (this process, Shared, receiver queue 5000) stamps each arrival.

Measurements (each prints its figures and ratios; `--parts` picks some):
1. saturated: N messages all due at one instant a few seconds after the load ends (the writer has
   indexed them, the broker has stored them, by then); delivered msg/s at the consumer, sustained
   (first -> last arrival) and from the due instant (N / (last arrival - due)); the pipe's rate from
   its launch. Early arrivals (before the due instant) are counted.
2. lateness: a paced producer (own process) at R msg/s, deliver-at 3 s after each send; p50 / p99
   / max of arrival - deliver-at and the early arrivals, for the writer and each tracker at tick
   1000 and 100 ms.
3. memory: M messages due in 1-24 h (none due during the run). Writer: RSS growth of its process
   (before the load vs after the writer has made all M durable and acked, 5 s settled; and the
   peak). Trackers: the broker's heap after a full GC (`jcmd <pid> GC.run`, `GC.heap_info`) before
   and after all M are tracked (subscription msgDelayed), the tracker's own direct-memory figure
   (`pulsar_delayed_message_index_size_bytes`: the in-memory tracker's priority queue is off-heap),
   the JVM's direct memory (it includes the entry cache) and its RSS.
4. recovery: with those M pending, D more messages due at once are sent while nothing consumes
   them (writer stopped / the broker's consumer closed), then the writer is restarted (SIGINT,
   start), or the broker (SIGTERM, start on the same data). Time from the restart to the first
   arrival of a due message: for the writer from its process launch, for the broker from its
   launch and from its health check passing (a standalone also restarts its bookie and ZooKeeper,
   which a broker restart in a cluster would not).
5. dedup: a producer process sends ids 1..K (bursts of 1000, one callback per burst, checkpointing
   the highest confirmed id every 5000, as a source commits its offsets) and is SIGKILLed once half
   has arrived (or been confirmed); a second process resumes from the checkpoint, so ids the topic
   already has are offered again. Our DedupPublisher (publish_many; broker de-duplication off)
   against a producer with a producer name and explicit sequence ids on a broker with
   `brokerDeduplicationEnabled=true`: batched and resuming past `Producer.last_sequence_id()` (what
   the broker says it has: Pulsar's pattern), unbatched and resuming from the checkpoint (the broker
   drops each id it has), and batched resuming from the checkpoint. pulsar-client (C++) sends a
   batch with its first id only, and the broker keys a batch on that id: ids of a batch that
   straddles the broker's last id come out twice or are dropped; both are reported as findings,
   not failures of the run. msg/s = K / (first launch -> the resumed producer has every send
   confirmed); the consumer's rate is printed beside it; our duplicates must be 0.

    flock /tmp/pl-heavy.lock .venv/bin/python bench/bench_vs_pulsar.py             # issue sizes: 200k, 1M
    .venv/bin/python bench/bench_vs_pulsar.py --saturated 50000 --pending 200000    # smaller
    .venv/bin/python bench/bench_vs_pulsar.py --parts lateness,dedup
    .venv/bin/python bench/bench_vs_pulsar.py --smoke    # CI: tiny sizes, one standalone (bucket, 100 ms, dedup)

Exits non-zero when a message of ours (writer, pipe, DedupPublisher) is missing, duplicated or
early, or a broker contender's message is missing; the broker's early or duplicate deliveries are
findings and only printed. `--json FILE` writes every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pulsar

import _writer_common as wc
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_release import java_executable
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

NS = "persistent://public/default"
SUB = "bench-check"  # wc.output_consumer's subscription
HOUR_MS = 3_600_000
MB = 1024 * 1024
PARTS = ("saturated", "lateness", "dedup", "memory", "recovery")
# Ledgers roll over every 50,000 entries (managedLedgerMaxEntriesPerLedger, the default) without
# waiting the default 10 minutes first: the bucket tracker seals a bucket only when a message of a
# newer ledger arrives, so a topic younger than 10 minutes keeps every index in its mutable bucket
# (a plain in-memory queue). A topic that has run for a while rolls its ledgers anyway.
BROKER_CONFIG = {"managedLedgerMinLedgerRolloverTimeMinutes": "0"}
PRODUCER_START_MS = 1500  # the paced producer's process start-up margin
DEDUP_PRODUCER = "bench-dedup"
DEDUP_BURST = 1000
DEDUP_CHECKPOINT_EVERY = 5000


class BenchFailure(RuntimeError):
    """A contender of ours lost, duplicated or released early a message, or a run did not complete."""


# -- broker plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerConf:
    """One standalone configuration and what runs on it: (part, contender) in order."""

    label: str
    tracker: str
    tick_ms: int
    dedup: bool
    tasks: Tuple[Tuple[str, str], ...]


def plan(smoke: bool) -> List[BrokerConf]:
    """The standalones in order. On each, the tracker's memory is read first, on a broker that has
    run nothing else yet (an earlier part's leftovers on the heap blur a reading after a full GC),
    and its recovery restarts it before the other parts run."""
    if smoke:  # one standalone for everything: the code paths, not the figures
        return [BrokerConf("bucket, tick 100 ms, dedup on", "bucket", 100, True, (
            ("memory", "bucket"), ("recovery", "bucket"),
            ("saturated", "batched-pipe"), ("saturated", "writer"), ("saturated", "bucket"),
            ("lateness", "writer"), ("lateness", "bucket, tick 100 ms"),
            ("dedup", "DedupPublisher"), ("dedup", "broker dedup"),
            ("memory", "writer"), ("recovery", "writer")))]
    return [
        BrokerConf("inmemory, tick 1 s", "inmemory", 1000, False, (
            ("memory", "inmemory"), ("recovery", "inmemory"),
            ("saturated", "batched-pipe"), ("saturated", "writer"), ("saturated", "inmemory"),
            ("lateness", "writer"), ("lateness", "inmemory, tick 1 s"),
            ("dedup", "DedupPublisher"),
            ("memory", "writer"), ("recovery", "writer"))),
        BrokerConf("inmemory, tick 100 ms", "inmemory", 100, False, (("lateness", "inmemory, tick 100 ms"),)),
        BrokerConf("bucket, tick 1 s", "bucket", 1000, False, (
            ("memory", "bucket"), ("recovery", "bucket"), ("saturated", "bucket"), ("lateness", "bucket, tick 1 s"))),
        BrokerConf("bucket, tick 100 ms", "bucket", 100, False, (("lateness", "bucket, tick 100 ms"),)),
        BrokerConf("inmemory, tick 1 s, dedup on", "inmemory", 1000, True, (
            ("dedup", "broker dedup"), ("dedup", "broker dedup, unbatched"),
            ("dedup", "broker dedup, batched, from checkpoint"))),
    ]


@dataclass
class Ctx:
    """What the parts of one broker share."""

    args: argparse.Namespace
    broker: PulsarStandalone
    client: pulsar.Client
    workdir: Path
    handles: Dict[str, Any] = field(default_factory=dict)  # memory -> recovery hand-over

    @property
    def url(self) -> str:
        return self.broker.service_url


# -- helpers -------------------------------------------------------------------------------------------
def fresh_topic(tag: str) -> str:
    return f"{NS}/vsp-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def load(client: pulsar.Client, topic: str, n: int, payload_bytes: int, at_of: Callable[[int], int],
         native: bool, first: int = 0, every: Optional[Callable[[], None]] = None) -> float:
    """Send messages first..first+n-1 (payload_of(i), deliver-at property at_of(i); with `native` also
    pulsar-client's deliver_at); returns the seconds until all are confirmed."""
    producer = wc.batching_producer(client, topic)
    failed: List[object] = []

    def cb(res: pulsar.Result, _mid: object) -> None:
        if res != pulsar.Result.Ok:
            failed.append(res)

    t0 = time.perf_counter()
    for i in range(first, first + n):
        at = at_of(i)
        if native:
            producer.send_async(wc.payload_of(i, payload_bytes), cb, properties={DELIVER_AT_PROP: str(at)},
                                deliver_at=at)
        else:
            producer.send_async(wc.payload_of(i, payload_bytes), cb, properties={DELIVER_AT_PROP: str(at)})
        if every is not None and i % 10_000 == 0:
            every()
    producer.flush()
    seconds = time.perf_counter() - t0
    producer.close()
    if failed:
        raise BenchFailure(f"{len(failed)} of {n} sends to {topic} failed: {failed[:3]}")
    return seconds


def spread_24h(base_ms: int) -> Callable[[int], int]:
    """Deliver-at of message i: within 1 h .. 24 h after base_ms (a cheap deterministic hash of i)."""
    return lambda i: base_ms + HOUR_MS + (i * 2_654_435_761) % (23 * HOUR_MS)


def admin_json(broker: PulsarStandalone, path: str) -> Any:
    with urllib.request.urlopen(broker.admin_url + path, timeout=30) as resp:
        return json.loads(resp.read())


def sub_stats(broker: PulsarStandalone, topic: str) -> Dict[str, Any]:
    stats = admin_json(broker, "/admin/v2/persistent/" + topic[len("persistent://"):] + "/stats")
    return dict(stats.get("subscriptions", {}).get(SUB, {}))


def wait_until(count: Callable[[], int], target: int, until_mono: float, poll_s: float = 0.5) -> Tuple[int, float]:
    """Poll count() until it reaches target or until_mono; (last count, seconds waited)."""
    t0 = time.monotonic()
    c = -1
    while True:
        try:
            c = count()
        except (OSError, ValueError, KeyError):
            c = -1
        if c >= target or time.monotonic() >= until_mono:
            return c, time.monotonic() - t0
        time.sleep(poll_s)


def rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss:
    """Samples a process's RSS every 0.25 s in a thread; `.peak` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, rss_of(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, rss_of(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


def jcmd() -> str:
    """jcmd of the JDK that runs Pulsar (next to its `java`), else the one on PATH."""
    beside = Path(os.path.realpath(java_executable())).parent / "jcmd"
    found = str(beside) if beside.is_file() else shutil.which("jcmd")
    if not found:
        raise BenchFailure("jcmd not found (a JDK's bin/jcmd reads the broker's heap): install openjdk-17-jdk-headless")
    return found


def metric_sum(text: str, name: str, **labels: str) -> Optional[float]:
    """Sum of the samples of `name` whose labels include `labels` (None when there is none)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if any(f'{k}="{v}"' not in head for k, v in labels.items()):
            continue
        if "subscription" not in labels and 'subscription="' in head:
            continue  # topic-level samples only, unless a subscription was asked for
        total += float(value)
        seen = True
    return total if seen else None


def jvm_memory(broker: PulsarStandalone, topic: str) -> Dict[str, float]:
    """The broker JVM after a full GC: heap used, direct memory used, the tracker's own index bytes
    for `topic` (what the tracker reports: its priority queues), bucket counts, RSS."""
    pid = str(broker.pid)
    tool = jcmd()
    subprocess.run([tool, pid, "GC.run"], check=True, capture_output=True, timeout=300)
    info = subprocess.run([tool, pid, "GC.heap_info"], check=True, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"heap\s+total (\d+)K, used (\d+)K", info)
    if not m:
        raise BenchFailure(f"unexpected GC.heap_info output: {info[:300]}")
    with urllib.request.urlopen(broker.admin_url + "/metrics/", timeout=60) as resp:
        text = resp.read().decode("utf-8", "replace")
    out: Dict[str, float] = {"heap_used": int(m.group(2)) * 1024.0, "heap_total": int(m.group(1)) * 1024.0,
                             "rss": float(broker.rss_bytes())}
    out["direct_used"] = metric_sum(text, "jvm_memory_direct_bytes_used") or 0.0
    out["index_bytes"] = metric_sum(text, "pulsar_delayed_message_index_size_bytes", topic=topic,
                                    subscription=SUB) or 0.0
    for key, name in (("buckets", "pulsar_delayed_message_index_bucket_total"),
                      ("loaded", "pulsar_delayed_message_index_loaded"),
                      ("snapshot_bytes", "pulsar_delayed_message_index_bucket_snapshot_size_bytes")):
        v = metric_sum(text, name, topic=topic)
        if v is not None:
            out[key] = v
    return out


def stats_of(values: Sequence[float]) -> Dict[str, float]:
    return {"p50": wc.percentile(values, 50), "p99": wc.percentile(values, 99), "max": max(values),
            "min": min(values), "early": float(sum(1 for v in values if v < 0))}


def require(label: str, got: wc.Received, n: int, ours: bool, early: int = 0) -> None:
    """All n arrived; for our contenders also no duplicate and nothing early."""
    if got.unique != n:
        raise BenchFailure(f"{label}: {got.unique:,} of {n:,} arrived")
    if ours and (got.duplicates or early):
        raise BenchFailure(f"{label}: {got.duplicates} duplicates, {early} before their deliver-at")
    if got.duplicates or early:
        print(f"    FINDING {label}: {got.duplicates} duplicate deliveries, {early} early", flush=True)


def start_writer(ctx: Ctx, tag: str) -> Tuple[wc.Topics, Path, int, subprocess.Popen, pulsar.Consumer]:
    """The shipped writer config on fresh topics, in its own localrun process, warmed up (one
    message through); its metrics (received_total) on the returned port, every second."""
    topics = wc.topics_for(tag)
    wd = ctx.workdir / tag
    port = wc.free_port()
    config = wc.write_writer_config(wd, topics, metricsIntervalSeconds=1)
    consumer = wc.output_consumer(ctx.client, topics.out)
    proc = wc.start_localrun(config, ctx.url, wd, port)
    try:
        wc.warm_up(ctx.client, topics, consumer, proc, wd / "localrun.log")
    except BaseException:
        wc.stop_process(proc)
        consumer.close()
        raise
    return topics, wd, port, proc, consumer


def start_profile(args: argparse.Namespace, pid: int, name: str) -> Optional[subprocess.Popen]:
    """With --profile-writer DIR: py-spy sampling `pid` (all threads, --nonblocking: the process is
    never paused) into DIR/<name>.txt as collapsed stacks, until stop_profile."""
    if not args.profile_writer:
        return None
    out = Path(args.profile_writer)
    out.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "-p", str(pid), "--nonblocking", "--threads", "--format", "raw",
                             "-r", "50", "-o", str(out / f"{name}.txt")],
                            stdout=subprocess.DEVNULL, stderr=open(out / f"{name}.log", "ab"))


def stop_profile(spy: Optional[subprocess.Popen]) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(timeout=10)


# -- 1. saturated delivery -----------------------------------------------------------------------------
def saturated_lead_ms(args: argparse.Namespace, n: int) -> int:
    """How far ahead the due instant is: the load and the broker's reading of it into its tracker
    (~2,500 msg/s assumed on a contended 2-core machine: the broker's contenders send unbatched)
    plus a margin. Each run prints how many were indexed / tracked by then."""
    return int(args.saturated_lead_s * 1000) if args.saturated_lead_s else 10_000 + (n * 2) // 5


def summarize_rates(label: str, got: wc.Received, n: int, due_ms: Optional[float], t0_ms: float,
                    extra: Dict[str, Any]) -> Dict[str, Any]:
    first, last = min(got.arrival_ms), max(got.arrival_ms)
    res = {"n": n, "sustained": (n - 1) / max(1e-3, (last - first) / 1000.0),
           "from_due": n / max(1e-3, (last - (due_ms if due_ms is not None else t0_ms)) / 1000.0),
           "first_after_due_ms": first - (due_ms if due_ms is not None else t0_ms),
           "drain_s": (last - (due_ms if due_ms is not None else t0_ms)) / 1000.0,
           "early": sum(1 for a, d in zip(got.arrival_ms, got.deliver_at) if a < d),
           "duplicates": got.duplicates, **extra}
    ref = "due" if due_ms is not None else "launch"
    print(f"  saturated {label:14s}: {res['sustained']:9,.0f} msg/s sustained (first->last), {res['from_due']:9,.0f} "
          f"msg/s from {ref} (drained {res['drain_s']:.1f} s after {ref}; first {res['first_after_due_ms']:.0f} ms); "
          f"early {res['early']}, duplicates {got.duplicates}; "
          + ", ".join(f"{k} {v}" for k, v in extra.items()), flush=True)
    return res


def saturated_pipe(ctx: Ctx) -> Dict[str, Any]:
    n, a = ctx.args.saturated, ctx.args
    topics = wc.topics_for("sat-pipe")
    wd = ctx.workdir / "sat-pipe"
    wd.mkdir(parents=True, exist_ok=True)
    consumer = wc.output_consumer(ctx.client, topics.out)
    now = wc.now_ms()
    load_s = load(ctx.client, topics.sched, n, a.payload_bytes, lambda i: now, native=False)
    t_launch = time.time() * 1000.0
    proc = wc.start_pipe(ctx.url, topics, wd, "batched-pipe")
    try:
        got = wc.collect(consumer, n, a.timeout + n / 1000.0, quiet_s=1.0, alive=proc)
    finally:
        rc = wc.stop_process(proc)
        consumer.close()
    require("batched-pipe", got, n, ours=True)
    return summarize_rates("batched-pipe", got, n, None, t_launch,
                           {"load_s": round(load_s, 1), "exit_code": rc})


def saturated_writer(ctx: Ctx) -> Dict[str, Any]:
    n, a = ctx.args.saturated, ctx.args
    topics, wd, port, proc, consumer = start_writer(ctx, "sat-writer")
    try:
        due = wc.now_ms() + saturated_lead_ms(a, n)
        load_s = load(ctx.client, topics.sched, n, a.payload_bytes, lambda i: due, native=False)
        # received_total counts the warm-up message too
        indexed, _ = wait_until(lambda: wc.received_count(port) - 1, n, time.monotonic() + (due - wc.now_ms()) / 1000)
        spy = start_profile(a, proc.pid, "saturated-writer")
        cpu0 = wc.cpu_seconds(proc.pid)
        try:
            got = wc.collect(consumer, n, (due - wc.now_ms()) / 1000.0 + a.timeout + n / 1000.0, quiet_s=1.0,
                             alive=proc)
        finally:
            stop_profile(spy)
        cpu = wc.cpu_seconds(proc.pid) - cpu0  # from before the due instant to the last arrival + 1 s
    finally:
        rc = wc.stop_process(proc)
        consumer.close()
    early = sum(1 for t in got.arrival_ms if t < due)
    require("writer", got, n, ours=True, early=early)
    drain_s = max(1e-3, (max(got.arrival_ms) - min(got.arrival_ms)) / 1000.0)
    return summarize_rates("writer", got, n, due, due, {"load_s": round(load_s, 1), "indexed_by_due": indexed,
                                                       "cpu_us_per_msg": round(cpu * 1e6 / n),
                                                       "cpu_share_of_drain": round(cpu / drain_s, 2),
                                                       "exit_code": rc})


def saturated_native(ctx: Ctx, label: str) -> Dict[str, Any]:
    n, a = ctx.args.saturated, ctx.args
    topic = fresh_topic("sat-" + ctx.broker.tracker)
    consumer = wc.output_consumer(ctx.client, topic)
    try:
        due = wc.now_ms() + saturated_lead_ms(a, n)
        load_s = load(ctx.client, topic, n, a.payload_bytes, lambda i: due, native=True)
        tracked, _ = wait_until(lambda: int(sub_stats(ctx.broker, topic).get("msgDelayed", -1)), n,
                                time.monotonic() + (due - wc.now_ms()) / 1000)
        got = wc.collect(consumer, n, (due - wc.now_ms()) / 1000.0 + a.timeout + n / 1000.0, quiet_s=1.0)
    finally:
        consumer.close()
    require(label, got, n, ours=False, early=sum(1 for t in got.arrival_ms if t < due))
    return summarize_rates(label, got, n, due, due, {"load_s": round(load_s, 1), "tracked_by_due": tracked})


# -- 2. lateness -----------------------------------------------------------------------------------------
def lateness(ctx: Ctx, label: str) -> Dict[str, Any]:
    a = ctx.args
    n = int(a.rate * a.seconds)
    wd = ctx.workdir / ("late-" + re.sub(r"[^a-z0-9]+", "-", label))
    wd.mkdir(parents=True, exist_ok=True)
    proc: Optional[subprocess.Popen] = None
    if label == "writer":
        topics, wd, _port, proc, consumer = start_writer(ctx, "late-writer")
        topic = topics.sched
    else:
        topic = fresh_topic("late-" + ctx.broker.tracker)
        consumer = wc.output_consumer(ctx.client, topic)
    paced = None
    try:
        start_ms = wc.now_ms() + PRODUCER_START_MS + a.lead_ms
        paced = wc.start_paced(ctx.url, topic, a.rate, a.seconds, start_ms, a.lead_ms, a.payload_bytes, wd,
                               native=proc is None)
        got = wc.collect(consumer, n, (start_ms - wc.now_ms()) / 1000.0 + a.seconds + a.timeout, quiet_s=2.0,
                         alive=proc)
        paced_rc = paced.wait(timeout=60)
    finally:
        if paced is not None and paced.poll() is None:
            paced.kill()
            paced.wait(timeout=10)
        rc = wc.stop_process(proc) if proc is not None else 0
        consumer.close()
    if paced_rc != 0:
        raise BenchFailure(f"lateness {label}: paced producer rc={paced_rc}: {wc.log_tail(wd / 'paced.log')}")
    late = [t - d for t, d in zip(got.arrival_ms, got.deliver_at)]
    st = stats_of(late)
    require(f"lateness {label}", got, n, ours=proc is not None, early=int(st["early"]))
    paced_line = wc.log_tail(wd / "paced.log", 200).strip().splitlines()[-1:]
    res = {"n": n, **st, "duplicates": got.duplicates, "exit_code": rc, "paced": paced_line[0] if paced_line else ""}
    print(f"  lateness {label:20s}: arrival - deliver-at ms p50 {st['p50']:8.1f}  p99 {st['p99']:8.1f}  max "
          f"{st['max']:8.1f}  min {st['min']:8.1f}; early {int(st['early']):,} of {n:,}; duplicates {got.duplicates} "
          f"({res['paced']})", flush=True)
    return res


# -- 3. memory and 4. recovery ---------------------------------------------------------------------------
def memory_writer(ctx: Ctx) -> Dict[str, Any]:
    m, a = ctx.args.pending, ctx.args
    topics, wd, port, proc, consumer = start_writer(ctx, "mem-writer")
    try:
        time.sleep(2.0)
        rss0 = rss_of(proc.pid)
        peak = PeakRss(proc.pid)
        t0 = time.monotonic()
        load_s = load(ctx.client, topics.sched, m, a.payload_bytes, spread_24h(wc.now_ms()), native=False)
        indexed, _ = wait_until(lambda: wc.received_count(port) - 1, m, time.monotonic() + a.timeout + m / 500)
        intake_s = time.monotonic() - t0
        if indexed < m:
            raise BenchFailure(f"memory writer: {indexed:,} of {m:,} indexed: {wc.log_tail(wd / 'localrun.log')}")
        time.sleep(a.settle_s)
        rss1 = rss_of(proc.pid)
        peak_rss = peak.stop()
        disk = sum(f.stat().st_size for d in (wd / "snapshots", wd / "data") if d.is_dir()
                   for f in d.rglob("*") if f.is_file())
    except BaseException:
        wc.stop_process(proc)
        consumer.close()
        raise
    ctx.handles["writer"] = (topics, wd, proc, consumer)
    res = {"pending": m, "rss_before": rss0, "rss_after": rss1, "growth": rss1 - rss0, "peak_growth": peak_rss - rss0,
           "load_s": round(load_s, 1), "intake_s": round(intake_s, 1), "disk_bytes": disk}
    print(f"  memory writer: RSS {rss0 / MB:.1f} -> {rss1 / MB:.1f} MB, growth {res['growth'] / MB:.1f} MB (peak "
          f"+{res['peak_growth'] / MB:.1f} MB) with {m:,} pending; all durable and acked {intake_s:.1f} s after the "
          f"load began (load {load_s:.1f} s); {disk / MB:.0f} MB of snapshots and state on disk", flush=True)
    return res


def recovery_writer(ctx: Ctx) -> Dict[str, Any]:
    m, d, a = ctx.args.pending, ctx.args.due, ctx.args
    topics, wd, proc, consumer = ctx.handles.pop("writer")
    try:
        rc_stop = wc.stop_process(proc)
        # D due messages while the writer is down, behind the M pending ones
        now = wc.now_ms()
        load(ctx.client, topics.sched, d, a.payload_bytes, lambda i: now, native=False, first=m)
        t0 = time.time() * 1000.0
        proc = wc.start_localrun(wd / "writer.yaml", ctx.url, wd)
        res = first_due(consumer, m, d, t0, a.timeout + m / 2000, alive=proc, log=wd / "localrun.log")
    finally:
        rc = wc.stop_process(proc)
        consumer.close()
    if res["early_pending"] or res["due_arrived"] != d:
        raise BenchFailure(f"recovery writer: {res}")
    res.update(exit_codes=[rc_stop, rc])
    print(f"  recovery writer: first due message {res['first_s']:.2f} s after the process launch, all {d} due "
          f"{res['all_s']:.2f} s; {m:,} pending, none early", flush=True)
    return res


def first_due(consumer: pulsar.Consumer, m: int, d: int, t0_ms: float, timeout_s: float,
              alive: Optional[subprocess.Popen] = None, log: Optional[Path] = None) -> Dict[str, Any]:
    """Receive until all D due messages (ids m..m+d-1) arrived: seconds from t0 to the first and the
    last of them; pending ids (< m) arriving are early."""
    first = last = None
    due_seen: Dict[int, int] = {}
    early_pending = 0
    deadline = time.monotonic() + timeout_s
    while len(due_seen) < d and time.monotonic() < deadline:
        try:
            msg = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            if alive is not None and alive.poll() is not None:
                raise BenchFailure(f"process exited rc={alive.returncode}: {wc.log_tail(log) if log else ''}") from None
            continue
        now = time.time() * 1000.0
        i = wc.index_of(msg.data())
        consumer.acknowledge(msg)
        if i < m:
            early_pending += 1
            continue
        if i >= m + d:
            continue  # a warm-up message
        due_seen[i] = due_seen.get(i, 0) + 1
        first = now if first is None else first
        last = now
    if first is None or last is None:
        raise BenchFailure(f"no due message arrived within {timeout_s:.0f} s")
    return {"first_s": (first - t0_ms) / 1000.0, "all_s": (last - t0_ms) / 1000.0, "due_arrived": len(due_seen),
            "duplicates": sum(c - 1 for c in due_seen.values()), "early_pending": early_pending}


def memory_native(ctx: Ctx, label: str) -> Dict[str, Any]:
    m, a = ctx.args.pending, ctx.args
    topic = fresh_topic("mem-" + ctx.broker.tracker)
    consumer = wc.output_consumer(ctx.client, topic)
    try:
        # one message through first: topic, subscription, dispatcher and tracker exist in the baseline
        now = wc.now_ms()
        load(ctx.client, topic, 1, a.payload_bytes, lambda i: now, native=True, first=10**9 - 1)
        consumer.acknowledge(consumer.receive(timeout_millis=60_000))
        before = jvm_memory(ctx.broker, topic)
        t0 = time.monotonic()
        load_s = load(ctx.client, topic, m, a.payload_bytes, spread_24h(wc.now_ms()), native=True)
        tracked, _ = wait_until(lambda: int(sub_stats(ctx.broker, topic).get("msgDelayed", -1)), m,
                                time.monotonic() + a.timeout + m / 500)
        track_s = time.monotonic() - t0
        if tracked < m:
            raise BenchFailure(f"memory {label}: {tracked:,} of {m:,} tracked (subscription msgDelayed)")
        time.sleep(a.settle_s)
        after = jvm_memory(ctx.broker, topic)
    except BaseException:
        consumer.close()
        raise
    ctx.handles[label] = (topic, consumer)
    res = {"pending": m, "before": before, "after": after, "load_s": round(load_s, 1), "track_s": round(track_s, 1),
           **{f"{k}_growth": after[k] - before.get(k, 0.0) for k in ("heap_used", "direct_used", "index_bytes", "rss")}}
    res["tracker_growth"] = res["heap_used_growth"] + res["index_bytes_growth"]
    print(f"  memory {label}: heap after full GC +{res['heap_used_growth'] / MB:.1f} MB, tracker's index (direct) "
          f"+{res['index_bytes_growth'] / MB:.1f} MB, sum +{res['tracker_growth'] / MB:.1f} MB; JVM direct "
          f"+{res['direct_used_growth'] / MB:.1f} MB (entry cache included), RSS +{res['rss_growth'] / MB:.1f} MB; "
          f"{m:,} tracked {track_s:.1f} s after the load began (load {load_s:.1f} s); "
          + ", ".join(f"{k} {after[k]:,.0f}" for k in ("buckets", "loaded", "snapshot_bytes") if k in after),
          flush=True)
    return res


def recovery_native(ctx: Ctx, label: str) -> Dict[str, Any]:
    m, d, a = ctx.args.pending, ctx.args.due, ctx.args
    topic, consumer = ctx.handles.pop(label)
    consumer.close()
    now = wc.now_ms()
    load(ctx.client, topic, d, a.payload_bytes, lambda i: now, native=True, first=m)
    ctx.client.close()
    ctx.broker.stop(remove_data=False)
    t_launch = time.time() * 1000.0
    ctx.broker.start()
    t_ready = time.time() * 1000.0
    ctx.client = quiet_client(ctx.url)
    consumer = wc.output_consumer(ctx.client, topic)
    try:
        res = first_due(consumer, m, d, t_launch, a.timeout + m / 2000)
    finally:
        consumer.close()
    if res["due_arrived"] != d:
        raise BenchFailure(f"recovery {label}: {res}")
    res["ready_s"] = (t_ready - t_launch) / 1000.0
    res["first_from_ready_s"] = res["first_s"] - res["ready_s"]
    print(f"  recovery {label}: broker healthy {res['ready_s']:.1f} s after its launch; first due message "
          f"{res['first_s']:.2f} s after the launch = {res['first_from_ready_s']:.2f} s after healthy; all {d} due "
          f"{res['all_s']:.2f} s; pending delivered early {res['early_pending']}, duplicates {res['duplicates']}",
          flush=True)
    if res["early_pending"] or res["duplicates"]:
        print(f"    FINDING recovery {label}: {res['early_pending']} pending early, {res['duplicates']} duplicates",
              flush=True)
    return res


# -- 5. de-duplication -------------------------------------------------------------------------------------
# The contenders of part 5: (child kind, batched, resume point) per label.
DEDUP_CONTENDERS = {
    "DedupPublisher": ("ours", True, "checkpoint"),
    # Pulsar's own pattern: the new producer asks the broker for the last id it has
    # (Producer.last_sequence_id) and skips ids up to it; batched like ours.
    "broker dedup": ("broker", True, "last-sequence-id"),
    # The broker drops every id it already has: unbatched, the application resends from its checkpoint.
    "broker dedup, unbatched": ("broker", False, "checkpoint"),
    # Batched and resent from the checkpoint: a batch whose first id the broker has is dropped whole,
    # ids above the broker's last in that batch too (a finding, not a failure of the benchmark).
    "broker dedup, batched, from checkpoint": ("broker", True, "checkpoint"),
}


def dedup_child(args: argparse.Namespace) -> None:
    """Child: send ids resume..n to the topic (bursts of DEDUP_BURST), checkpoint the highest
    confirmed id every DEDUP_CHECKPOINT_EVERY (as a source commits its offsets); `ours` through
    DedupPublisher, else a named producer with explicit sequence ids (the broker de-duplicates).
    resume: the checkpoint + 1, or with `last-sequence-id` past the broker's last id too."""
    ckpt = Path(args.checkpoint)
    start = (int(ckpt.read_text()) if ckpt.is_file() else 0) + 1
    client = quiet_client(args.service_url)
    payload_bytes = args.payload_bytes
    confirmed = [start - 1]
    written = [start - 1]

    def checkpoint(value: int, force: bool = False) -> None:
        if force or value - written[0] >= DEDUP_CHECKPOINT_EVERY:
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(str(value))
            os.replace(tmp, ckpt)
            written[0] = value

    t0 = time.monotonic()
    if args.kind == "ours":
        from pulsar_lifecycle.dedup import DedupPublisher, Outcome, OutMessage
        from pulsar_lifecycle.state.directory import DirectoryStateStore

        pub = DedupPublisher(client, DEDUP_PRODUCER, DirectoryStateStore(Path(args.state_dir), "public", "default",
                                                                         "bench"))
        highest = pub.open(args.topic)
        dropped = 0
        for s in range(start, args.n + 1, DEDUP_BURST):
            ids = range(s, min(args.n, s + DEDUP_BURST - 1) + 1)
            outcomes = pub.publish_many(args.topic, [OutMessage(wc.payload_of(i, payload_bytes), i) for i in ids])
            dropped += sum(1 for o in outcomes if o is Outcome.DUPLICATE)
            checkpoint(pub.persisted_seq(args.topic))
        pub.flush(300)
        checkpoint(pub.persisted_seq(args.topic), force=True)
        pub.close()
        note = f"recovered highest={highest} dropped_by_publisher={dropped}"
    else:
        producer = None
        for _ in range(60):  # the killed predecessor's connection may still hold the name for a moment
            try:
                producer = client.create_producer(
                    args.topic, producer_name=DEDUP_PRODUCER, block_if_queue_full=True,
                    batching_enabled=not args.unbatched, batching_max_publish_delay_ms=10, send_timeout_millis=0,
                    compression_type=pulsar.CompressionType.LZ4, max_pending_messages=1000)
                break
            except pulsar.ProducerBusy:
                time.sleep(0.5)
        if producer is None:
            raise SystemExit("broker dedup: producer name still busy after 30 s")
        highest = producer.last_sequence_id()
        if args.resume == "last-sequence-id":
            start = max(start, highest + 1)
            confirmed[0] = start - 1
        lock = threading.Lock()

        def done_up_to(last: int) -> Callable[[pulsar.Result, object], None]:
            def done(res: pulsar.Result, _mid: object) -> None:
                if res == pulsar.Result.Ok:
                    with lock:
                        confirmed[0] = max(confirmed[0], last)
            return done

        for s in range(start, args.n + 1, DEDUP_BURST):
            last = min(args.n, s + DEDUP_BURST - 1)
            for i in range(s, last + 1):
                producer.send_async(wc.payload_of(i, payload_bytes), done_up_to(last) if i == last else None,
                                    sequence_id=i)
            checkpoint(confirmed[0])
        producer.flush()
        checkpoint(confirmed[0], force=True)
        producer.close()
        note = f"broker last_sequence_id={highest}"
    client.close()
    print(f"dedup-child {args.kind}: resumed from {start}, sent up to {args.n} in {time.monotonic() - t0:.1f} s; "
          f"{note}; finished_ms={time.time() * 1000:.0f}", flush=True)


def id_ranges(ids: Sequence[int], most: int = 5) -> str:
    """`a-b, c, ...`: the first `most` runs of consecutive ids."""
    runs: List[Tuple[int, int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs[:most])
    return text + (f" (+{len(runs) - most} more runs)" if len(runs) > most else "")


def dedup(ctx: Ctx, label: str) -> Dict[str, Any]:
    k, a = ctx.args.dedup_messages, ctx.args
    kind, batched, resume = DEDUP_CONTENDERS[label]
    tag = re.sub(r"[^a-z0-9]+", "-", label.lower())
    wd = ctx.workdir / f"dedup-{tag}"
    wd.mkdir(parents=True, exist_ok=True)
    topic = fresh_topic(f"dedup-{kind}")
    consumer = wc.output_consumer(ctx.client, topic)
    ck = wd / "checkpoint"
    cmd = [sys.executable, str(Path(__file__).resolve()), "dedup-child", "--kind", kind, "--service-url", ctx.url,
           "--topic", topic, "--state-dir", str(wd / "state"), "--checkpoint", str(ck), "--n", str(k),
           "--payload-bytes", str(a.payload_bytes), "--resume", resume, *([] if batched else ["--unbatched"])]

    def launch() -> subprocess.Popen:
        with open(wd / "child.log", "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def checkpointed() -> int:
        try:
            return int(ck.read_text())
        except (OSError, ValueError):
            return 0

    seen: Dict[int, int] = {}
    first = last = None
    t0 = time.time() * 1000.0
    proc = launch()
    killed_at: Optional[Dict[str, Any]] = None
    deadline = time.monotonic() + a.timeout + k / 500
    quiet_until: Optional[float] = None
    try:
        while time.monotonic() < deadline:
            # SIGKILL mid-run: once half has arrived or the child has confirmed half
            if killed_at is None and (len(seen) >= k // 2 or checkpointed() >= k // 2):
                running = proc.poll() is None
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                killed_at = {"unique": len(seen), "highest": max(seen, default=0), "t_ms": time.time() * 1000.0,
                             "checkpoint": checkpointed(), "child_was_running": running}
                proc = launch()
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                rc_now = proc.poll()
                if killed_at is not None and rc_now == 0:
                    # the resumed child confirmed everything: what is still missing is not coming
                    if len(seen) >= k:
                        break
                    quiet_until = quiet_until or time.monotonic() + 5.0
                    if time.monotonic() >= quiet_until:
                        break
                elif rc_now not in (None, 0):
                    raise BenchFailure(
                        f"dedup {label}: child rc={rc_now}: {wc.log_tail(wd / 'child.log')}") from None
                continue
            quiet_until = None
            now = time.time() * 1000.0
            i = wc.index_of(msg.data())
            consumer.acknowledge(msg)
            seen[i] = seen.get(i, 0) + 1
            first = now if first is None else first
            last = now
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        consumer.close()
    dups = sum(c - 1 for c in seen.values())
    missing = [i for i in range(1, k + 1) if i not in seen]
    children = [ln for ln in wc.log_tail(wd / "child.log", 4000).splitlines() if ln.startswith("dedup-child")]
    # when the resumed child had every send confirmed (it prints that instant as it ends)
    ends = re.findall(r"finished_ms=(\d+)", children[-1]) if children else []
    done_ms = float(ends[0]) if ends else None
    naive = resume == "checkpoint" and kind == "broker" and batched
    if killed_at is None or first is None or last is None or rc != 0 or done_ms is None or (missing and not naive):
        raise BenchFailure(f"dedup {label}: {len(seen):,} of {k:,} arrived (missing {id_ranges(missing)}), "
                           f"killed_at={killed_at}, rc={rc}: {wc.log_tail(wd / 'child.log')}")
    offered_again = max(0, killed_at["highest"] - killed_at["checkpoint"])
    res = {"n": k, "rate": k / max(1e-3, (done_ms - t0) / 1000.0),
           "arrival_rate": len(seen) / max(1e-3, (last - t0) / 1000.0), "duplicates": dups,
           "missing": len(missing), "missing_ids": id_ranges(missing),
           "first_phase_rate": killed_at["unique"] / max(1e-3, (killed_at["t_ms"] - first) / 1000.0),
           "killed_after": killed_at["unique"], "child_was_running": killed_at["child_was_running"],
           "checkpoint": killed_at["checkpoint"], "offered_again_at_least": offered_again, "children": children}
    print(f"  dedup {label:38s}: {res['rate']:8,.0f} msg/s over {k:,} ids incl. the SIGKILL and restart (first "
          f"launch -> the resumed producer has all confirmed; at the consumer {res['arrival_rate']:,.0f} msg/s, "
          f"{res['first_phase_rate']:,.0f} msg/s before the kill); killed after {killed_at['unique']:,} arrived "
          f"(child {'running' if killed_at['child_was_running'] else 'already done'}), checkpoint "
          f"{killed_at['checkpoint']:,} (>= {offered_again:,} ids offered again); duplicates {dups}, missing "
          f"{len(missing)}; " + " / ".join(c.split(": ", 1)[1] for c in children), flush=True)
    if dups:
        if kind == "ours":
            raise BenchFailure(f"dedup {label}: {dups} duplicates")
        print(f"    FINDING dedup {label}: {dups} duplicates", flush=True)
    if missing:
        print(f"    FINDING dedup {label}: {len(missing):,} ids never arrived: {id_ranges(missing)}", flush=True)
    return res


# -- driver -----------------------------------------------------------------------------------------------
def run_task(ctx: Ctx, part: str, who: str) -> Dict[str, Any]:
    if part == "saturated":
        return saturated_pipe(ctx) if who == "batched-pipe" else (
            saturated_writer(ctx) if who == "writer" else saturated_native(ctx, who))
    if part == "lateness":
        return lateness(ctx, who)
    if part == "dedup":
        return dedup(ctx, who)
    if part == "memory":
        return memory_writer(ctx) if who == "writer" else memory_native(ctx, who)
    return recovery_writer(ctx) if who == "writer" else recovery_native(ctx, who)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def get(results: Dict[str, Dict[str, Any]], part: str, who: str, key: str) -> Optional[float]:
    v = results.get(part, {}).get(who, {}).get(key)
    return float(v) if v is not None else None


def summary(results: Dict[str, Dict[str, Any]], smoke: bool) -> None:
    bucket = "bucket"
    print("\nsummary (ratios: writer / the other):")
    sat = results.get("saturated", {})
    if sat:
        for who in sat:
            if who != "writer":
                print(f"  saturated msg/s writer/{who}: sustained "
                      f"{ratio(get(results, 'saturated', 'writer', 'sustained'), get(results, 'saturated', who, 'sustained'))}"
                      f", from due {ratio(get(results, 'saturated', 'writer', 'from_due'), get(results, 'saturated', who, 'from_due'))}")
        w, b = get(results, "saturated", "writer", "sustained"), get(results, "saturated", bucket, "sustained")
        if w is not None and b:
            print(f"  target writer >= 0.8x bucket (sustained): {w / b:.2f} -> {'met' if w >= 0.8 * b else 'NOT met'}")
    late = results.get("lateness", {})
    if late:
        w = late.get("writer")
        for who, r in late.items():
            if who != "writer" and w:
                print(f"  lateness p99 writer/{who}: {ratio(w['p99'], r['p99'])} ({w['p99']:.1f} vs {r['p99']:.1f} ms); "
                      f"early writer {int(w['early'])}, {who} {int(r['early'])}")
        default_tick = [r for who, r in late.items() if who != "writer" and (who.endswith("1 s") or smoke)]
        if w and default_tick:
            best = min(r["p99"] for r in default_tick)
            ok = w["p99"] <= best and w["early"] == 0
            print(f"  target writer p99 <= best tracker's at its default tick ({best:.1f} ms), 0 early: "
                  f"{w['p99']:.1f} ms, {int(w['early'])} early -> {'met' if ok else 'NOT met'}")
    mem = results.get("memory", {})
    if mem.get("writer"):
        for who, r in mem.items():
            if who != "writer":
                print(f"  memory growth writer RSS / {who} (heap after GC + index): "
                      f"{ratio(mem['writer']['growth'], r['tracker_growth'])} ({mem['writer']['growth'] / MB:.1f} vs "
                      f"{r['tracker_growth'] / MB:.1f} MB)")
        if mem.get(bucket):
            ok = mem["writer"]["growth"] <= mem[bucket]["tracker_growth"]
            print(f"  target writer RSS growth <= bucket heap growth: {'met' if ok else 'NOT met'}")
    rec = results.get("recovery", {})
    if rec.get("writer"):
        for who, r in rec.items():
            if who != "writer":
                print(f"  recovery first due writer (from launch) / {who}: from launch "
                      f"{ratio(rec['writer']['first_s'], r['first_s'])}, from healthy "
                      f"{ratio(rec['writer']['first_s'], r['first_from_ready_s'])} ({rec['writer']['first_s']:.2f} s vs "
                      f"{r['first_s']:.2f} / {r['first_from_ready_s']:.2f} s)")
        if rec.get(bucket):
            ok = rec["writer"]["first_s"] <= rec[bucket]["first_from_ready_s"]
            print(f"  target writer first delivery <= bucket's (from healthy): {'met' if ok else 'NOT met'}")
    dd = results.get("dedup", {})
    ours = dd.get("DedupPublisher")
    for who, r in dd.items():
        if ours and who != "DedupPublisher":
            print(f"  dedup msg/s DedupPublisher/{who}: {ratio(ours['rate'], r['rate'])} ({ours['rate']:,.0f} vs "
                  f"{r['rate']:,.0f}); duplicates {ours['duplicates']} / {r['duplicates']}, missing "
                  f"{ours['missing']} / {r['missing']}")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    ch = sub.add_parser("dedup-child")
    ch.add_argument("--kind", choices=("ours", "broker"), required=True)
    for name in ("--service-url", "--topic", "--state-dir", "--checkpoint"):
        ch.add_argument(name, required=True)
    ch.add_argument("--n", type=int, required=True)
    ch.add_argument("--payload-bytes", type=int, default=100)
    ch.add_argument("--resume", choices=("checkpoint", "last-sequence-id"), default="checkpoint")
    ch.add_argument("--unbatched", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="Tiny sizes on one standalone: the CI smoke run.")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--brokers", default="",
                    help="only the standalones whose label contains one of these comma-separated strings "
                         "(labels: " + "; ".join(c.label for c in plan(False)) + ")")
    ap.add_argument("--saturated", type=int, default=200_000, help="messages due at one instant (1)")
    ap.add_argument("--saturated-lead-s", type=float, default=0.0,
                    help="due instant after the load starts (0: 10 s + N at 2,500 msg/s)")
    ap.add_argument("--rate", type=int, default=5000, help="paced msg/s (2)")
    ap.add_argument("--seconds", type=float, default=20.0, help="paced duration (2)")
    ap.add_argument("--lead-ms", type=int, default=3000, help="deliver-at after send (2)")
    ap.add_argument("--pending", type=int, default=1_000_000, help="messages pending 1-24 h (3, 4)")
    ap.add_argument("--due", type=int, default=100, help="due messages sent before a restart (4)")
    ap.add_argument("--dedup-messages", type=int, default=200_000, help="ids per dedup run (5)")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--settle-s", type=float, default=5.0, help="wait before a memory reading (3)")
    ap.add_argument("--timeout", type=float, default=120.0, help="slack added to every wait (s)")
    ap.add_argument("--skip", default="",
                    help="';'-separated part:contender pairs to leave out, e.g. 'memory:inmemory;saturated:writer'")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    ap.add_argument("--profile-writer", default=None,
                    help="py-spy (on PATH or beside python) samples the writer during the saturated release into "
                         "this directory (collapsed stacks, 50 Hz, --nonblocking)")
    args = ap.parse_args(argv)
    if args.cmd == "dedup-child":
        dedup_child(args)
        return
    if args.smoke:
        args.saturated, args.rate, args.seconds, args.lead_ms = 2000, 500, 2.0, 1000
        args.pending, args.due, args.dedup_messages, args.settle_s = 5000, 20, 6000, 1.0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown --parts {sorted(unknown)}; choose from {','.join(PARTS)}")
    if "recovery" in parts and "memory" not in parts:
        parts.append("memory")  # recovery starts from memory's pending messages
    results: Dict[str, Dict[str, Any]] = {}
    started = time.time()
    print(f"bench_vs_pulsar: saturated {args.saturated:,}, paced {args.rate:,}/s x {args.seconds:g} s (lead "
          f"{args.lead_ms} ms), pending {args.pending:,} (+{args.due} due), dedup {args.dedup_messages:,}, "
          f"{args.payload_bytes} B; parts {','.join(parts)}; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-vs-pulsar-") as tmp:
        for conf in plan(args.smoke):
            skip = {tuple(x.split(":", 1)) for x in args.skip.split(";") if ":" in x}
            tasks = [(p, w) for p, w in conf.tasks if p in parts and (p, w) not in skip]
            wanted = [b.strip() for b in args.brokers.split(",") if b.strip()]
            if not tasks or (wanted and not any(b in conf.label for b in wanted)):
                continue
            broker = PulsarStandalone(tracker=conf.tracker, tick_millis=conf.tick_ms, deduplication=conf.dedup,
                                      config=dict(BROKER_CONFIG))
            t0 = time.monotonic()
            broker.start()
            print(f"broker {conf.label}: Apache Pulsar {broker.release.version if broker.release else '?'} started in "
                  f"{time.monotonic() - t0:.1f} s ({broker.service_url}); load average {os.getloadavg()[0]:.2f}",
                  flush=True)
            ctx = Ctx(args, broker, quiet_client(broker.service_url), Path(tmp) / re.sub(r"[^a-z0-9]+", "-", conf.label))
            try:
                for part, who in tasks:
                    results.setdefault(part, {})[who] = run_task(ctx, part, who)
            finally:
                for handle in ctx.handles.values():
                    if isinstance(handle[-1], pulsar.Consumer):
                        handle[-1].close()
                    if len(handle) == 4:
                        wc.stop_process(handle[2])
                ctx.client.close()
                broker.stop()
    summary(results, args.smoke)
    print(f"done in {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2, default=str))


if __name__ == "__main__":
    try:
        main()
    except BenchFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
