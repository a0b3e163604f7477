"""Delay-level topics (issue 11, item 10). Three measurements, each printing a ratio:

  index    (a) simulated clock: a 30-day workload with DAY units; peak number of entries the
               near-term index holds without parking (every message indexed at publish) and with
               parking (indexed from its forward time); target >= 10x fewer.
  forward  (b) the syncer's forward rate vs the shared batched consume->produce pipe
               (bench/_pipe.py, the writer benchmarks' baseline too) on the same broker and the same
               partitions; target >= 0.8.
  rss      (c) the syncer's RSS with 10k vs 1M parked messages (a child process per size);
               target: within 10 MB.

    python bench/bench_delay_level.py index [--messages-per-day 20000] [--days 60]
    python bench/bench_delay_level.py forward [--messages 100000] [--partitions 10] [--runs 3]
    python bench/bench_delay_level.py forward-cost [--messages 10000]   (diagnosis of (b): CPU per message)
    python bench/bench_delay_level.py rss [--sizes 10000,1000000]
"""
from __future__ import annotations

import argparse
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pulsar

import _pipe
from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy, forward_at
from pulsar_lifecycle.delaylevel.config import SyncerConfig, parse_syncer_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import partition_topic
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.pulsar_io import native_consumer
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.state.directory import DirectoryStateStore
from pulsar_lifecycle.timing import DelayedProducer

NS = "persistent://public/default"
DAY_MS = 86_400_000


# -- (a) near-term index entries, simulated clock ----------------------------------------------

def peak(enters: List[int], leaves: List[int]) -> int:
    """Most entries held at once, from enter and leave times (a leave at t precedes an enter at t)."""
    enters.sort()
    leaves.sort()
    cur = best = j = 0
    for t in enters:
        while j < len(leaves) and leaves[j] <= t:
            cur -= 1
            j += 1
        cur += 1
        best = max(best, cur)
    return best


def bench_index(per_day: int, days: int, lookahead_ms: int, seed: int) -> None:
    strategy = DelayLevelTopicPartitionStrategy(30 * 86400, PartitionBy.DAY)
    rng = random.Random(seed)
    n = per_day * days
    leaves: List[int] = []
    enters_without: List[int] = []
    enters_with: List[int] = []
    t0 = time.perf_counter()
    for i in range(n):
        pub = i * DAY_MS // per_day + rng.randrange(DAY_MS // per_day)  # steady arrivals
        delay = rng.randint(0, strategy.max_delay_ms)  # uniform over the 30-day horizon
        at = pub + delay
        leaves.append(at)
        enters_without.append(pub)
        k = strategy.partition_for(delay)
        enters_with.append(pub if k is None else max(pub, forward_at(pub, k, strategy.unit_ms, at, lookahead_ms)))
    a, b = peak(enters_without, list(leaves)), peak(enters_with, leaves)
    print(f"(a) {n:,} messages over {days} days ({per_day:,}/day), delays uniform in [0, 30 d], DAY units, "
          f"lookahead {lookahead_ms} ms; simulated in {time.perf_counter() - t0:.1f} s")
    print(f"    peak near-term index entries: without parking {a:,}; with parking {b:,}; ratio {a / b:.1f}x fewer "
          f"(target >= 10x)")


# -- shared: park messages ---------------------------------------------------------------------

def park(client: pulsar.Client, business: str, sched: str, strategy: DelayLevelTopicPartitionStrategy,
         n: int, delays_ms: List[int], payload: bytes) -> None:
    prod = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched),
                              delay_level_topic=business + "-delay-level", strategy=strategy,
                              max_pending_messages=5000)
    failed = []
    for i in range(n):
        prod.send_async(payload, lambda res, _m: res == pulsar.Result.Ok or failed.append(1),
                        delay_ms=delays_ms[i % len(delays_ms)])
    prod.flush()
    prod.close()
    assert not failed, f"{len(failed)} parked sends failed"


def syncer_config(business: str, sched: str, unit_s: int, max_s: int, **extra: object):
    return parse_syncer_config({"delayLevelTopic": business + "-delay-level", "schedulingTopic": sched,
                                "partitionBy": "SECONDS", "unitSeconds": unit_s,
                                "messageMaximumDelayTimeSeconds": max_s, "lookaheadMillis": 0,
                                "metricsIntervalSeconds": 3600, **extra})


# -- (b) forward rate vs a batched pipe --------------------------------------------------------

def pipe(url: str, topics: List[str], out: str, per_topic: int) -> float:
    """Baseline: the shared batched pipe (bench/_pipe.py) over every partition, in this process."""
    n = per_topic * len(topics)
    t0 = time.perf_counter()
    done = _pipe.run_batched_pipe(url, topics, out, "pipe", threading.Event(), stop_after=n)
    if done < n:
        raise SystemExit(f"pipe: {done} of {n} forwarded")
    return done / (time.perf_counter() - t0)


def syncer_rate(client: pulsar.Client, business: str, sched: str, n: int, state: Path, unit_s: int,
                partitions: int, batch: int, pipeline_depth: int = 0, snapshot_interval: int = 1000,
                concurrency: Optional[int] = None) -> float:
    # The same receiver queue (1000) and batch size as the pipe.
    extra = {} if concurrency is None else {"forwardConcurrency": concurrency}  # None: the shipped default
    cfg = syncer_config(business, sched, unit_s, unit_s * (partitions + 1), forwardBatchSize=batch,
                        receiverQueueSize=1000, forwardPipelineDepth=pipeline_depth,
                        dedupSnapshotInterval=snapshot_interval, **extra)
    service = DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="bench-syncer",
                                      state=DirectoryStateStore(state, "public", "default", "bench"),
                                      record_metric=lambda _n, _v: None)
    service.start()
    t0 = time.perf_counter()
    last, last_change = -1, time.monotonic()
    while True:
        forwarded = sum(f.stats.forwarded + f.stats.duplicates for f in service.forwarders)
        if forwarded >= n:
            break
        if forwarded != last:
            last, last_change = forwarded, time.monotonic()
        elif time.monotonic() - last_change > 60:  # report a stall instead of hiding it
            state = [(f.k, f.stats.forwarded, len(f._held), f.alive) for f in service.forwarders]  # noqa: SLF001
            print(f"    STALL: {forwarded} of {n} forwarded, no progress for 60 s; (partition, forwarded, held, "
                  f"alive): {state}; healthy={service.healthy} failure={service.failure_reason!r}")
            break
        time.sleep(0.01)
    dt = time.perf_counter() - t0
    service.stop()
    if forwarded < n:
        raise SystemExit(1)
    return n / dt


def bench_forward(n: int, partitions: int, runs: int, batch: int, pipeline_depth: int = 0,
                  snapshot_interval: int = 1000, concurrency: Optional[int] = None) -> None:
    unit_s = 1
    strategy = DelayLevelTopicPartitionStrategy(unit_s * (partitions + 1), PartitionBy.SECONDS, unit_seconds=unit_s)
    # Delays that put n/partitions messages in each partition; all due a few seconds later.
    delays = [(k + 1) * 1000 + 100 for k in range(partitions)]
    rates: Dict[str, List[float]] = {"pipe": [], "syncer": []}
    payload = b"x" * 100
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(data_dir=Path(d) / "broker", log_level="warn") as broker:
        client = quiet_client(broker.service_url)
        for run in range(runs):
            for kind in ("pipe", "syncer"):
                business, sched = f"{NS}/bfw-{kind}-{run}", f"{NS}/bfw-{kind}-{run}-sched"
                park(client, business, sched, strategy, n, delays, payload)
                time.sleep(partitions + 1)  # everything due (forward time = base + (k+1) units)
                if kind == "pipe":
                    topics = [partition_topic(business + "-delay-level", k) for k in range(partitions)]
                    rates[kind].append(pipe(broker.service_url, topics, sched, n // partitions))
                else:
                    rates[kind].append(syncer_rate(client, business, sched, n, Path(d) / f"state-{run}", unit_s,
                                                   partitions, batch, pipeline_depth, snapshot_interval,
                                                   concurrency))
                print(f"    run {run + 1} {kind}: {rates[kind][-1]:,.0f} msg/s")
        client.close()
    p, s = statistics.median(rates["pipe"]), statistics.median(rates["syncer"])
    print(f"(b) {n:,} parked messages in {partitions} partitions, batch {batch}, {runs} runs (medians): "
          f"pipe {p:,.0f} msg/s, syncer {s:,.0f} msg/s; ratio syncer/pipe {s / p:.2f} (target >= 0.8)")


def bench_forward_cost(n: int) -> None:
    """Diagnosis of (b): CPU per message (one thread, time.thread_time) of the pipe's loop body
    and of the forwarder's steps, on the same n received parked messages. The 2-core bench is
    bound by the client's GIL, so these per-message costs are what the ratio follows. Uses the
    forwarder's internal steps (a diagnosis, not an API)."""
    # Inside: the forwarder's internals are only needed by this diagnosis.
    from pulsar_lifecycle.dedup.publisher import DedupPublisher
    from pulsar_lifecycle.delaylevel.forwarder import ForwardPolicy, PartitionForwarder, position_of

    strategy = DelayLevelTopicPartitionStrategy(3, PartitionBy.SECONDS, unit_seconds=1)
    clock = time.thread_time
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(data_dir=Path(d) / "broker", log_level="warn") as broker:
        client = quiet_client(broker.service_url)
        business, sched = f"{NS}/bfc", f"{NS}/bfc-sched"
        park(client, business, sched, strategy, n, [1100], b"x" * 100)
        topic = partition_topic(business + "-delay-level", 0)

        def subscribe(sub: str) -> pulsar.Consumer:
            return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1000)

        consumer = subscribe("pipe")
        msgs = [consumer.receive(timeout_millis=10_000) for _ in range(n)]
        producer = client.create_producer(f"{NS}/bfc-pipe-out", batching_enabled=True, batching_max_publish_delay_ms=10,
                                          block_if_queue_full=True, max_pending_messages=1000,
                                          compression_type=pulsar.CompressionType.LZ4)
        t0 = clock()
        for i in range(0, n, 500):
            for m in msgs[i:i + 500]:
                producer.send_async(m.data(), None, properties=m.properties(), partition_key=m.partition_key() or None)
            producer.flush()
        t1 = clock()
        for m in msgs:
            consumer.acknowledge(m)
        t2 = clock()
        pipe_us = [1e6 * (t1 - t0) / n, 1e6 * (t2 - t1) / n]

        consumer = subscribe("syncer")
        publisher = DedupPublisher(client, "bfc-p0", DirectoryStateStore(Path(d) / "state", "public", "default", "b"))
        publisher.open(sched)
        policy = ForwardPolicy(unit_ms=1000, lookahead_ms=0, batch_size=500, near_term_topic=sched,
                               dead_letter_topic=sched + "-DLQ", target_exists=None, wait_for_room=lambda _e: None,
                               clock=lambda: int(time.time() * 1000), receiver_queue_size=1000, pipeline_depth=1)
        fw = PartitionForwarder(0, topic, consumer, publisher, policy, threading.Event(),
                                resubscribe=lambda _q: consumer, probe=lambda _after: None)
        # Received as the forwarder receives (it may skip pulsar.Message's Python wrapper).
        msgs = [native_consumer.receive(consumer, 10_000) for _ in range(n)]
        fw._take(msgs[0])  # noqa: SLF001 - the first message opens the order gate (a Reader would)
        for m in fw._gate.resolve(position_of(msgs[0].message_id(), with_size=True)):  # noqa: SLF001
            fw._hold(m)  # noqa: SLF001
        t0 = clock()
        for m in msgs[1:]:
            fw._take(m)  # noqa: SLF001
        t1 = clock()
        held = list(fw._held)  # noqa: SLF001
        assert len(held) == n, f"{len(held)} of {n} held"
        outs = [fw._out_message(h, h.seq)[1] for h in held]  # noqa: SLF001
        t2 = clock()
        for i in range(0, n, 500):
            fw._publish(sched, outs[i:i + 500])  # noqa: SLF001 - as the forwarder publishes
        t3 = clock()
        publisher.flush()
        for h in held:
            consumer.acknowledge(h.msg)
        t4 = clock()
        publisher.close()
        client.close()
    us = [1e6 * x / n for x in (t1 - t0, t2 - t1, t3 - t2, t4 - t3)]
    print(f"(b, diagnosis) CPU per message, one thread, {n:,} messages: pipe: read+send {pipe_us[0]:.1f} us, "
          f"ack {pipe_us[1]:.1f} us, total {sum(pipe_us):.1f} us; syncer: take/hold {us[0]:.1f} us, build the forward "
          f"{us[1]:.1f} us, publish_many {us[2]:.1f} us, confirm+ack {us[3]:.1f} us, total {sum(us):.1f} us")


# -- (c) RSS vs parked count -------------------------------------------------------------------

def rss_kb(pid: str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def rss_child(url: str, business: str, sched: str, state: str, settle_s: float, queue: int) -> None:
    """Child: run the syncer over the parked partitions (nothing due) and print its RSS."""
    client = quiet_client(url)
    cfg = syncer_config(business, sched, 60, 60 * 30, receiverQueueSize=queue)
    service = DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="rss-syncer",
                                      state=DirectoryStateStore(Path(state), "public", "default", "bench"),
                                      record_metric=lambda _n, _v: None)
    service.start()
    time.sleep(settle_s)
    heads = sum(1 for f in service.forwarders if f.stats.next_forward_at)
    print(f"RSS_KB {rss_kb()} HEADS {heads}", flush=True)
    service.stop()
    client.close()


def bench_rss(sizes: List[int], settle_s: float, queue: int) -> None:
    strategy = DelayLevelTopicPartitionStrategy(60 * 30, PartitionBy.SECONDS, unit_seconds=60)
    delays = [(k + 1) * 60_000 + 30_000 for k in range(29)]  # spread over 29 partitions, none due soon
    out: Dict[int, int] = {}
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(data_dir=Path(d) / "broker", log_level="warn") as broker:
        client = quiet_client(broker.service_url)
        for n in sizes:
            business, sched = f"{NS}/brss-{n}", f"{NS}/brss-{n}-sched"
            t0 = time.perf_counter()
            park(client, business, sched, strategy, n, delays, b"x" * 100)
            print(f"    parked {n:,} in {time.perf_counter() - t0:.1f} s")
            res = subprocess.run([sys.executable, __file__, "rss-child", broker.service_url, business, sched,
                                  str(Path(d) / f"state-{n}"), str(settle_s), str(queue)],
                                 capture_output=True, text=True,
                                 timeout=600)
            line = [x for x in res.stdout.splitlines() if x.startswith("RSS_KB")]
            assert line, res.stderr[-2000:]
            out[n] = int(line[0].split()[1])
            print(f"    syncer over {n:,} parked: RSS {out[n] / 1024:.1f} MB ({line[0]})")
        client.close()
    lo, hi = min(sizes), max(sizes)
    print(f"(c) receiver queue {queue}: syncer RSS: {lo:,} parked {out[lo] / 1024:.1f} MB, {hi:,} parked {out[hi] / 1024:.1f} MB; "
          f"difference {(out[hi] - out[lo]) / 1024:.1f} MB (target: within 10 MB)")


def main() -> None:
    # pulsar-client logs an ERROR for every empty topic a dedup recovery probes; expected here.
    logging.getLogger("pulsar.client").setLevel(logging.CRITICAL)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("index")
    a.add_argument("--messages-per-day", type=int, default=20_000)
    a.add_argument("--days", type=int, default=60)
    a.add_argument("--lookahead-ms", type=int, default=60_000)
    a.add_argument("--seed", type=int, default=1)
    b = sub.add_parser("forward")
    b.add_argument("--messages", type=int, default=100_000)
    b.add_argument("--partitions", type=int, default=10)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--batch", type=int, default=500)
    b.add_argument("--pipeline-depth", type=int, default=1,
                   help="the syncer's forwardPipelineDepth (0: send, confirm, ack)")
    b.add_argument("--snapshot-interval", type=int, default=1000,
                   help="the syncer's dedupSnapshotInterval (forwards per snapshot and its two fsyncs)")
    b.add_argument("--forward-concurrency", type=int, default=None,
                   help="the syncer's forwardConcurrency (partitions forwarding at once; default: the shipped one)")
    bc = sub.add_parser("forward-cost")
    bc.add_argument("--messages", type=int, default=10_000)
    c = sub.add_parser("rss")
    c.add_argument("--sizes", default="10000,1000000")
    c.add_argument("--settle-seconds", type=float, default=5.0)
    c.add_argument("--receiver-queue", type=int, default=200)
    ch = sub.add_parser("rss-child")
    for name in ("url", "business", "sched", "state", "settle", "queue"):
        ch.add_argument(name)
    args = ap.parse_args()
    if args.cmd == "index":
        bench_index(args.messages_per_day, args.days, args.lookahead_ms, args.seed)
    elif args.cmd == "forward":
        concurrency = args.forward_concurrency or SyncerConfig.__dataclass_fields__["forward_concurrency"].default
        print(f"    forwardPipelineDepth {args.pipeline_depth}, dedupSnapshotInterval {args.snapshot_interval}, "
              f"forwardConcurrency {concurrency}")
        bench_forward(args.messages, args.partitions, args.runs, args.batch, args.pipeline_depth, args.snapshot_interval,
                      args.forward_concurrency)
    elif args.cmd == "forward-cost":
        bench_forward_cost(args.messages)
    elif args.cmd == "rss":
        bench_rss([int(x) for x in args.sizes.split(",")], args.settle_seconds, args.receiver_queue)
    else:
        rss_child(args.url, args.business, args.sched, args.state, float(args.settle), int(args.queue))


if __name__ == "__main__":
    main()
