"""BucketSnapshotWriter sustained index+release rate vs a plain consume->produce pipe.

One embedded pulsar-lite broker. Per run and per process under test, each in its own process:
- pipe: the baseline, a plain consume->produce pipe with the runtime's client settings
  (bench/_writer_common.py `pipe`): a message listener, a callback per send, ack in the callback;
- batched-pipe: the second baseline, the same pipe written the writer's way
  (bench/_writer_common.py `batched-pipe`): batch_receive, sends without per-message callbacks, one
  callback per batch, the batch's acks after it;
- journaled-pipe: the batched pipe plus a durable append of each batch (positions, deliver-at,
  payloads; write + fsync) before it is sent with sequence and origin ids (bench/_pipe.py
  `--journal`): the floor of any writer that is durable before it acks and de-duplicates its
  output, without an index, release order or commit;
- native-pipe, journaled-native-pipe: the batched and the journaled pipe receiving and sending
  through pulsar-client's native objects, as the writer does (bench/_pipe.py `--native`): the
  journaled one is the writer's floor with the writer's own client calls;
- identity: a function returning its input, through `pulsar_lifecycle.cli localrun` (ATLEAST_ONCE):
  what the runtime's one-message-at-a-time model costs before the writer does any work;
- writer: BucketSnapshotWriter through `pulsar_lifecycle.cli localrun`, shipped config with this
  run's topics and a temporary snapshotDir.
Steps:
1. a fresh scheduling topic is pre-loaded with N batched messages of B bytes whose deliver-at
   times are spread over the first second of loading, so all are due by the time the process
   starts: every message is indexed (made durable in the bucket journal, then acked) and released
   (published through the dedup publisher) during the run;
2. the process is started and the benchmark's consumer on the output topic records arrivals;
3. rate = (N - 1) / (last arrival - first arrival): the sustained rate, without process start-up
   (imports, subscribe, the writer's recovery on its first message), measured the same way for
   every process; the start-up (launch -> first output) is printed beside it, and so is the rate
   from launch, N / (last arrival - launch), which counts each process's start-up against it.

The ratio line is writer/pipe of the sustained rates (the figure of every earlier table; the
target: >= 0.70); writer/batched-pipe, each pipe / batched-pipe (the floors: what durability and
ids alone cost), writer/journaled-native-pipe (the writer against its floor) and writer/identity
are printed too, and writer/pipe of the rates from launch on a line of its own. Each process's exit code is printed (0: it stopped
cleanly on SIGINT). A run with a message missing, duplicated or early exits non-zero.

    python bench/bench_writer_throughput.py [--messages 100000] [--payload-bytes 100] [--runs 2]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pulsar

import _writer_common as wc
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

LOAD_WINDOW_MS = 1000  # deliver-at spread; all due before the process under test starts


def preload(client: pulsar.Client, topic: str, n: int, payload_bytes: int) -> float:
    """N due messages on `topic`; returns the produce rate (msg/s)."""
    producer = wc.batching_producer(client, topic)
    base = wc.now_ms()
    t0 = time.perf_counter()
    for i in range(n):
        at = base + (i * LOAD_WINDOW_MS) // n
        producer.send_async(wc.payload_of(i, payload_bytes), None, properties={DELIVER_AT_PROP: str(at)})
    producer.flush()
    dt = time.perf_counter() - t0
    producer.close()
    # Due before the process starts: the run measures indexing + release, never waiting for time.
    time.sleep(max(0.0, (base + LOAD_WINDOW_MS - wc.now_ms()) / 1000.0))
    return n / dt


def one(label: str, client: pulsar.Client, workdir: Path, n: int, payload_bytes: int,
        timeout_s: float, launch: Callable[[wc.Topics, Path], Tuple[subprocess.Popen, Path]]) -> Tuple[float, float]:
    """Pre-load, start the process, collect N releases; returns (sustained rate, rate from launch) in msg/s."""
    topics = wc.topics_for(label)
    workdir.mkdir(parents=True, exist_ok=True)
    consumer = wc.output_consumer(client, topics.out)
    produce_rate = preload(client, topics.sched, n, payload_bytes)
    t_launch = time.time() * 1000.0
    proc, log = launch(topics, workdir)
    try:
        got = wc.collect(consumer, n, timeout_s, quiet_s=1.0, alive=proc)
        cpu = wc.cpu_seconds(proc.pid)
    finally:
        rc = wc.stop_process(proc)
        consumer.close()
    if got.unique != n:
        raise RuntimeError(f"{label}: {got.unique}/{n} released within {timeout_s:.0f}s (rc={rc}): {wc.log_tail(log)}")
    first, last = min(got.arrival_ms), max(got.arrival_ms)
    rate = (n - 1) / ((last - first) / 1000.0)
    from_launch = n / ((last - t_launch) / 1000.0)
    early = sum(1 for a, d in zip(got.arrival_ms, got.deliver_at) if a < d)
    print(f"  {label:21s}: {rate:8,.0f} msg/s sustained ({(last - first) / 1000:5.1f} s first->last; first output "
          f"{(first - t_launch) / 1000:.2f} s after launch; {from_launch:,.0f} msg/s from launch; process CPU "
          f"{cpu * 1e6 / n:3.0f} us/msg incl. start-up; pre-load {produce_rate:,.0f} msg/s; duplicates "
          f"{got.duplicates}; early {early}; exit code {rc})", flush=True)
    if got.duplicates or early:
        raise RuntimeError(f"{label}: {got.duplicates} duplicates, {early} released before their deliver-at")
    return rate, from_launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240.0, help="Longest wait for one run's releases (s).")
    args = ap.parse_args()
    if args.messages < 2 or args.runs < 1 or args.payload_bytes < 10:
        ap.error("--messages >= 2, --runs >= 1 and --payload-bytes >= 10 are required")
    rates: Dict[str, List[float]] = {k: [] for k in ("pipe", *wc.BATCHED_PIPES, "identity", "writer")}
    launched: Dict[str, List[float]] = {k: [] for k in rates}  # rates from launch
    with tempfile.TemporaryDirectory(prefix="bench-writer-tp-") as tmp, \
            EmbeddedBroker(data_dir=Path(tmp) / "broker") as broker:
        url = broker.service_url
        launchers: Dict[str, Callable[[wc.Topics, Path], Tuple[subprocess.Popen, Path]]] = {
            **{kind: (lambda t, wd, kind=kind: (wc.start_pipe(url, t, wd, kind), wd / f"{kind}.log"))
               for kind in ("pipe", *wc.BATCHED_PIPES)},
            "identity": lambda t, wd: (wc.start_localrun(wc.write_identity_config(wd, t), url, wd), wd / "localrun.log"),
            "writer": lambda t, wd: (wc.start_localrun(wc.write_writer_config(wd, t), url, wd), wd / "localrun.log"),
        }
        client = quiet_client(url)
        try:
            for run in range(args.runs):
                print(f"run {run}: {args.messages:,} x {args.payload_bytes} B", flush=True)
                for label, launch in launchers.items():
                    rate, from_launch = one(label, client, Path(tmp) / f"run{run}" / label, args.messages,
                                            args.payload_bytes, args.timeout, launch)
                    rates[label].append(rate)
                    launched[label].append(from_launch)
                last = {k: v[-1] for k, v in rates.items()}
                print(f"  writer/pipe {last['writer'] / last['pipe']:.2f}  "
                      f"writer/batched-pipe {last['writer'] / last['batched-pipe']:.2f}  "
                      f"writer/journaled-native-pipe {last['writer'] / last['journaled-native-pipe']:.2f}  "
                      + "  ".join(f"{k}/batched-pipe {last[k] / last['batched-pipe']:.2f}"
                                  for k in wc.PIPE_FLOORS) + "  "
                      f"batched-pipe/pipe {last['batched-pipe'] / last['pipe']:.2f}  "
                      f"identity/pipe {last['identity'] / last['pipe']:.2f}  "
                      f"writer/identity {last['writer'] / last['identity']:.2f}", flush=True)
        finally:
            client.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median over {args.runs} run(s): pipe {med['pipe']:,.0f} msg/s, batched pipe "
          f"{med['batched-pipe']:,.0f} msg/s, identity function "
          f"{med['identity']:,.0f} msg/s, writer {med['writer']:,.0f} msg/s")
    print(f"writer/identity (runtime's own cost removed): {med['writer'] / med['identity']:.2f}")
    print(f"ratio writer/pipe: {med['writer'] / med['pipe']:.2f} (target >= 0.70)")
    print(f"ratio writer/batched-pipe: {med['writer'] / med['batched-pipe']:.2f}")
    for k in wc.PIPE_FLOORS:
        print(f"{k} {med[k]:,.0f} msg/s: {k}/batched-pipe {med[k] / med['batched-pipe']:.2f}")
    print(f"ratio writer/journaled-native-pipe (the writer against its floor): "
          f"{med['writer'] / med['journaled-native-pipe']:.2f}")
    med_l = {k: statistics.median(v) for k, v in launched.items()}
    print(f"from launch (start-up counted): pipe {med_l['pipe']:,.0f} msg/s, writer {med_l['writer']:,.0f} msg/s, "
          f"ratio writer/pipe {med_l['writer'] / med_l['pipe']:.2f}")


if __name__ == "__main__":
    main()
