"""BucketSnapshotWriter release lateness at a paced rate vs the latency of a consume->produce pipe.

One embedded pulsar-lite broker; each process under test runs in its own process:
- writer: BucketSnapshotWriter through `pulsar_lifecycle.cli localrun`. A paced producer (its own
  process) sends message i at deliver-at - lead, with deliver-at = T0 + i/rate: intake and release
  both run at `rate` per second. Lateness = (arrival at the benchmark's consumer, or the writer's
  __pl_released_at__) - __pl_deliver_at__. Never negative is a correctness requirement.
- pipe (the baseline): the plain consume->produce pipe of bench/_writer_common.py at the same rate;
  each message's deliver-at is its send time, so the same formula gives the pipe's end-to-end
  latency (producer -> broker -> pipe -> broker -> consumer), the floor any broker round trip adds.
- writer, pre-indexed (the release path alone): all messages are sent at once, deliver-at again
  T0 + i/rate, with T0 far enough ahead that the writer has indexed them all before T0 (checked
  on its metrics endpoint: pulsar_lifecycle_scheduler_received_total); then only releases run at `rate`.
Both processes are warmed up (one message through) before the load starts. A run with a message
missing, duplicated or early exits non-zero.
The ratio line is writer p99 lateness (arrival, paced intake) / pipe p99 latency (arrival); the
target is p99 <= 250 ms and no negative lateness.

    python bench/bench_writer_lateness.py [--rate 5000] [--seconds 20] [--lead-ms 3000]
        [--preindexed-seconds 10] [--preindexed-lead-s 45]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

import _writer_common as wc
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client

PRODUCER_START_MS = 1500  # margin for the paced producer's process start-up


@dataclass
class Lateness:
    """Distribution of one lateness measure, in ms."""

    p50: float
    p99: float
    max: float
    negative: int

    @staticmethod
    def of(values: Sequence[float]) -> "Lateness":
        return Lateness(wc.percentile(values, 50), wc.percentile(values, 99), max(values),
                        sum(1 for v in values if v < 0))

    def line(self) -> str:
        return f"p50 {self.p50:7.1f}  p99 {self.p99:7.1f}  max {self.max:7.1f}  negative {self.negative}"


def wait_indexed(metrics_port: int, expect: int, until_ms: int) -> str:
    """Poll the writer's intake counter until `expect` messages are durable and acked, or until_ms."""
    count = -1
    while wc.now_ms() < until_ms:
        count = wc.received_count(metrics_port)
        if count >= expect:
            return f"all taken in {(until_ms - wc.now_ms()) / 1000:.1f} s before the first deliver-at"
        time.sleep(0.2)
    return f"NOT all taken before the first deliver-at ({count}/{expect}): intake-bound, not release-only"


def one(label: str, client, url: str, workdir: Path, rate: int, seconds: float, lead_ms: int,
        payload_bytes: int, preindex: bool = False) -> List[Lateness]:
    """Warm up, run the paced load, collect; returns [arrival lateness, released-at lateness]."""
    topics = wc.topics_for(label)
    workdir.mkdir(parents=True, exist_ok=True)
    consumer = wc.output_consumer(client, topics.out)
    metrics_port = wc.free_port() if preindex else None
    if label.startswith("writer"):
        proc = wc.start_localrun(wc.write_writer_config(workdir, topics, metricsIntervalSeconds=1), url, workdir, metrics_port)
        log = workdir / "localrun.log"
    else:
        proc, log = wc.start_pipe(url, topics, workdir), workdir / "pipe.log"
    paced = None
    n = int(rate * seconds)
    note = ""
    try:
        warm = wc.warm_up(client, topics, consumer, proc, log)
        start_ms = wc.now_ms() + PRODUCER_START_MS + lead_ms
        # Pre-indexed: a lead longer than the whole schedule sends everything at once.
        send_lead = lead_ms + int(seconds * 1000) if preindex else lead_ms
        paced = wc.start_paced(url, topics.sched, rate, seconds, start_ms, send_lead, payload_bytes, workdir)
        if metrics_port is not None:
            note = "; " + wait_indexed(metrics_port, n + 1, start_ms)  # + the warm-up message
        timeout = (start_ms - wc.now_ms()) / 1000.0 + seconds + 60.0
        got = wc.collect(consumer, n, timeout, quiet_s=2.0, alive=proc)
        paced_rc = paced.wait(timeout=30)
    finally:
        if paced is not None and paced.poll() is None:
            paced.kill()
            paced.wait(timeout=10)
        rc = wc.stop_process(proc)
        consumer.close()
    if paced_rc != 0:
        raise RuntimeError(f"{label}: paced producer rc={paced_rc}: {wc.log_tail(workdir / 'paced.log')}")
    if got.unique != n:
        raise RuntimeError(f"{label}: {got.unique}/{n} arrived (rc={rc}): {wc.log_tail(log)}")
    arrival = Lateness.of([a - d for a, d in zip(got.arrival_ms, got.deliver_at)])
    released = Lateness.of([float(r - d) for r, d in zip(got.released_at, got.deliver_at)])
    what = "latency" if label == "pipe" else "lateness"
    print(f"  {label} ({n:,} msgs, warm-up {warm:.1f} s, duplicates {got.duplicates}; "
          f"{wc.log_tail(workdir / 'paced.log', 200).strip()}{note})", flush=True)
    print(f"    arrival - deliver-at {what} ms:     {arrival.line()}", flush=True)
    print(f"    released-at - deliver-at {what} ms: {released.line()}", flush=True)
    if got.duplicates or arrival.negative or released.negative:
        raise RuntimeError(f"{label}: {got.duplicates} duplicates, {arrival.negative} arrivals and "
                           f"{released.negative} releases before their deliver-at")
    return [arrival, released]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=5000, help="Releases (and scheduling messages) per second.")
    ap.add_argument("--seconds", type=float, default=20.0, help="Span of the deliver-at times.")
    ap.add_argument("--lead-ms", type=int, default=3000, help="How far ahead of its deliver-at each message is sent.")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--preindexed-seconds", type=float, default=10.0,
                    help="Span of the pre-indexed run's deliver-at times (0 = skip that run).")
    ap.add_argument("--preindexed-lead-s", type=float, default=45.0,
                    help="First deliver-at of the pre-indexed run, after its messages are sent (s).")
    args = ap.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.lead_ms <= 0 or args.payload_bytes < 10:
        ap.error("--rate, --seconds and --lead-ms must be > 0 and --payload-bytes >= 10")
    with tempfile.TemporaryDirectory(prefix="bench-writer-late-") as tmp, \
            EmbeddedBroker(data_dir=Path(tmp) / "broker") as broker:
        client = quiet_client(broker.service_url)
        try:
            print(f"{args.rate:,} msg/s for {args.seconds:g} s, {args.payload_bytes} B, writer lead {args.lead_ms} ms",
                  flush=True)
            pipe = one("pipe", client, broker.service_url, Path(tmp) / "pipe", args.rate, args.seconds, 0,
                       args.payload_bytes)
            ours = one("writer", client, broker.service_url, Path(tmp) / "writer", args.rate, args.seconds,
                       args.lead_ms, args.payload_bytes)
            pre = None
            if args.preindexed_seconds > 0:
                pre = one("writer, pre-indexed", client, broker.service_url, Path(tmp) / "writer-pre", args.rate,
                    args.preindexed_seconds, int(args.preindexed_lead_s * 1000), args.payload_bytes, preindex=True)
        finally:
            client.close()
    ok = ours[0].p99 <= 250 and ours[0].negative == 0 and ours[1].negative == 0
    print(f"writer (paced intake + release) lateness p99 {ours[0].p99:.1f} ms (arrival), {ours[1].p99:.1f} ms (released-at); "
          f"negative {ours[0].negative + ours[1].negative}; target p99 <= 250 ms, never negative: "
          f"{'met' if ok else 'NOT met'}")
    if pre is not None:
        print(f"writer pre-indexed (releases only) lateness p99 {pre[0].p99:.1f} ms (arrival), {pre[1].p99:.1f} ms "
              f"(released-at); negative {pre[0].negative + pre[1].negative}")
    print(f"ratio writer p99 lateness / pipe p99 latency (arrival): {ours[0].p99 / max(pipe[0].p99, 0.001):.2f} "
          f"({ours[0].p99:.1f} ms / {pipe[0].p99:.1f} ms)")


if __name__ == "__main__":
    main()
