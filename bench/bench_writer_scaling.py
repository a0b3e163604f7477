"""BucketSnapshotWriter scale-out: aggregate index+release rate with 1, 2 and 4 instances.

One embedded pulsar-lite broker. The scheduling topic has 4 partitions (addressed by name,
`<topic>-partition-<k>`); per run and per instance count k, fresh topics:
1. the 4 partitions are pre-loaded with N batched messages in total (N/4 each) whose deliver-at
   times are spread over the first second of loading, so all are due when the writers start;
2. k writer instances start, each as its own `pulsar_lifecycle.cli localrun` process (one process
   per instance, as a Pulsar worker runs them): `--instance-id-offset i --num-instances k`, the
   shipped partitioned config (function-configs/alternatives/bucket-snapshot-writer-partitioned.yaml) with this
   run's topics and one snapshotDir all of them share. Instance i owns the partitions k' with
   k' % k == i. (Each process subscribes the tick topic under its own subscription: pulsar-lite
   refuses a second connection's consumer on a subscription another connection holds.)
3. the benchmark's consumer on the output topic records arrivals; the aggregate rate is
   (N - 1) / (last arrival - first arrival), without process start-up.
Two baseline rows run the unpartitioned writer (one instance, one scheduling topic) on the same
N: with the shipped config (the scheduling topic also a function input with a receiver queue of
1, which starts a fresh deployment) and tick-only (the tick topic the only input, as the
partitioned config has it; docs/benchmarks.md shows that input costs the shipped writer ~3.5x). Ratios are printed against the 1-instance partitioned run of the same script run.
Every run also checks exactly once (each payload once) and never early (released-at >= deliver-at).

    python bench/bench_writer_scaling.py [--messages 100000] [--payload-bytes 100] [--runs 1]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pulsar
import yaml

import _writer_common as wc
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP

PARTITIONS = 4
INSTANCES = (1, 2, 4)
LOAD_WINDOW_MS = 1000
PARTITIONED_CONFIG = wc.ROOT / "function-configs" / "alternatives" / "bucket-snapshot-writer-partitioned.yaml"


def preload(client: pulsar.Client, topics: List[str], n: int, payload_bytes: int) -> None:
    """N due messages spread round-robin over `topics` (payload i names message i)."""
    producers = [wc.batching_producer(client, t) for t in topics]
    base = wc.now_ms()
    for i in range(n):
        at = base + (i * LOAD_WINDOW_MS) // n
        producers[i % len(producers)].send_async(wc.payload_of(i, payload_bytes), None,
                                                 properties={DELIVER_AT_PROP: str(at)})
    for p in producers:
        p.flush()
        p.close()
    time.sleep(max(0.0, (base + LOAD_WINDOW_MS - wc.now_ms()) / 1000.0))


def partitioned_config(workdir: Path, topics: wc.Topics) -> Path:
    """The shipped partitioned writer config with this run's topics and a shared snapshotDir."""
    cfg = yaml.safe_load(PARTITIONED_CONFIG.read_text())
    name = "bench-scale-" + topics.out.rsplit("-", 1)[-1]
    cfg["inputSpecs"] = {topics.ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    cfg.update(output=topics.out, name=name)
    cfg["userConfig"].update(schedulingTopic=topics.sched, tickTopic=topics.ticks, tickTimeMillis=200,
                             schedulingTopicPartitions=PARTITIONS, snapshotDir=str(workdir / "snapshots"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_instance(config: Path, url: str, workdir: Path, instance: int, count: int) -> subprocess.Popen:
    """One writer instance in its own localrun process (stderr: workdir/instance-<i>.log)."""
    with open(workdir / f"instance-{instance}.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING", "localrun",
             "--function-config-file", str(config), "--broker-service-url", url, "--data-dir", str(workdir / "data"),
             "--parallelism", "1", "--instance-id-offset", str(instance), "--num-instances", str(count),
             "--subs-name", f"bench-ticks-{instance}"],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=workdir)


def one(label: str, client: pulsar.Client, url: str, workdir: Path, n: int, payload_bytes: int,
        instances: int, timeout_s: float) -> float:
    """Pre-load, start the writers, collect N releases; returns the aggregate sustained rate (msg/s)."""
    topics = wc.topics_for(label.replace(' ', '-'))
    workdir.mkdir(parents=True, exist_ok=True)
    consumer = wc.output_consumer(client, topics.out)
    if instances <= 0:  # the unpartitioned writer: 0 = shipped config, -1 = tick topic the only input
        preload(client, [topics.sched], n, payload_bytes)
        config = wc.write_writer_config(workdir, topics, tickMode="runner")
        if instances < 0:
            cfg = yaml.safe_load(config.read_text())
            del cfg["inputSpecs"][topics.sched]
            config.write_text(yaml.safe_dump(cfg))
        procs = [wc.start_localrun(config, url, workdir)]
        logs = [workdir / "localrun.log"]
    else:
        preload(client, [f"{topics.sched}-partition-{k}" for k in range(PARTITIONS)], n, payload_bytes)
        config = partitioned_config(workdir, topics)
        procs = [start_instance(config, url, workdir, i, instances) for i in range(instances)]
        logs = [workdir / f"instance-{i}.log" for i in range(instances)]
    t_launch = time.time() * 1000.0
    try:
        arrivals, dups, early = collect(consumer, n, timeout_s)
        cpu = sum(wc.cpu_seconds(p.pid) for p in procs)
    finally:
        rcs = [wc.stop_process(p) for p in procs]
        consumer.close()
    if len(arrivals) != n:
        tails = "\n".join(wc.log_tail(log, 1000) for log in logs)
        raise RuntimeError(f"{label}: {len(arrivals)}/{n} released within {timeout_s:.0f}s (rc={rcs}): {tails}")
    first, last = min(arrivals.values()), max(arrivals.values())
    rate = (n - 1) / ((last - first) / 1000.0)
    # Per partition (payload i was sent to partition i % 4): the sum of the partitions' own rates is
    # the aggregate while they all run, without the instances' staggered starts.
    per_part = []
    for k in range(PARTITIONS):
        times = [t for i, t in arrivals.items() if i % PARTITIONS == k]
        per_part.append((len(times) - 1) / max(1e-3, (max(times) - min(times)) / 1000.0))
    print(f"  {label:16s}: {rate:8,.0f} msg/s aggregate first->last ({(last - first) / 1000:5.1f} s; first output "
          f"{(first - t_launch) / 1000:.1f} s after launch); sum of partition rates {sum(per_part):8,.0f} msg/s; "
          f"writer CPU {cpu * 1e6 / n:3.0f} us/msg incl. start-up; duplicates {dups}; early {early}; "
          f"exit codes {rcs}", flush=True)
    if dups or early:
        raise RuntimeError(f"{label}: {dups} duplicates, {early} early releases")
    return rate


def collect(consumer: pulsar.Consumer, expect: int, timeout_s: float) -> Tuple[Dict[int, float], int, int]:
    """(payload index -> first arrival ms, duplicates, early releases) until `expect` distinct payloads
    arrived (then 1 s more for late copies) or timeout."""
    arrivals: Dict[int, float] = {}
    dups = early = 0
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        now = time.time() * 1000.0
        i = wc.index_of(m.data())
        props = m.properties()
        if int(props.get(RELEASED_AT_PROP, "0")) < int(props.get(DELIVER_AT_PROP, "0")):
            early += 1
        if i in arrivals:
            dups += 1
        else:
            arrivals[i] = now
        consumer.acknowledge(m)
        if quiet_until is None and len(arrivals) >= expect:
            quiet_until = time.monotonic() + 1.0
    return arrivals, dups, early


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=240.0, help="Longest wait for one run's releases (s).")
    args = ap.parse_args()
    if args.messages < PARTITIONS or args.runs < 1 or args.payload_bytes < 10:
        ap.error(f"--messages >= {PARTITIONS}, --runs >= 1 and --payload-bytes >= 10 are required")
    labels = {0: "unpartitioned x1", -1: "unpart. tick-only"} | {k: f"partitioned x{k}" for k in INSTANCES}
    rates: Dict[int, List[float]] = {k: [] for k in labels}
    with tempfile.TemporaryDirectory(prefix="bench-writer-scale-") as tmp, \
            EmbeddedBroker(data_dir=Path(tmp) / "broker") as broker:
        url = broker.service_url
        client = quiet_client(url)
        try:
            for run in range(args.runs):
                print(f"run {run}: {args.messages:,} x {args.payload_bytes} B over {PARTITIONS} partitions", flush=True)
                for k, label in labels.items():
                    rates[k].append(one(label, client, url, Path(tmp) / f"run{run}" / f"x{k}", args.messages,
                                        args.payload_bytes, k, args.timeout))
                base = rates[1][-1]
                print("  ratios vs partitioned x1: " + "  ".join(
                    f"{labels[k]} {rates[k][-1] / base:.2f}" for k in labels), flush=True)
        finally:
            client.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median over {args.runs} run(s): " + ", ".join(f"{labels[k]} {med[k]:,.0f} msg/s" for k in labels))
    print("ratio vs partitioned x1: " + ", ".join(f"{labels[k]} {med[k] / med[1]:.2f}" for k in labels))


if __name__ == "__main__":
    main()
