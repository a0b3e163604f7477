"""Side by side with Pulsar's own delayed delivery and de-duplication, on real Apache Pulsar (issue 22).

Every contender runs against a real Apache Pulsar 4.0.0 standalone on loopback
(runtime/pulsar_standalone.py), one standalone per broker configuration (vs_pulsar/plans.py), each
started, used and stopped in turn, with Pulsar's own JVM settings (pulsar_env.sh: 2 GB heap, 4 GB
direct memory, ZGC) and standalone.conf's cache defaults (the "defaults" profile; --smoke uses the small
one). On each standalone every contender of parts 1, 2 and 5 runs once at a small size first (a warm-up
pass, figures dropped), then --runs times (default 3), in plan order in odd runs and reversed in even
ones; figures are the median with min-max, and a run that fails is counted as aborted (attempts and
aborted runs are printed and in --json) while the others go on. The same message set for every contender: payload i is `_writer_common.payload_of(i,
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
  1000 (the default) and, for lateness, 100 and 10 (a namespace's delayed-delivery policy); non-strict
  (`isDelayedDeliveryDeliverAtTimeStrict` false, the default: a message may be delivered up to one
  tick early) and strict ("inmemory strict", "bucket strict"); "... tuned": plans.TUNED
  (`dispatcherMaxReadBatchSize` 500, `cacheEvictionByMarkDeletedPosition` with a 10-minute eviction
  threshold, 50,000 indexes per bucket snapshot segment);
- batched-pipe: bench/_writer_common.py `batched-pipe`, a consume->produce pipe with no delay
  (batch_receive, one callback per batch), the throughput reference on the same broker.
The checking consumer (this process, Shared, receiver queue 5000) stamps each arrival.

Measurements (each prints its figures and ratios; `--parts` picks some):
1. saturated: N messages all due at one instant a few seconds after the load ends (the writer has
   indexed them, the broker has stored them, by then); delivered msg/s at the consumer, sustained
   (first -> last arrival) and from the due instant (N / (last arrival - due)); the pipe's rate from
   its launch. Early arrivals (before the due instant) are counted. Payloads of --payloads bytes
   (100 and 1,024); our contenders run on each tracker's standalone and are compared run by run.
2. lateness: a paced producer (own process) at R msg/s, deliver-at 3 s after each send; p50 / p99
   / max of arrival - deliver-at of the messages due after the first --lateness-skip-s (10) s, for
   everyone, and the early arrivals among them and in all, for the writer and each tracker, strict
   and non-strict, at ticks --ticks (1000, 100, 10 ms).
3. memory: M messages due in 1-24 h (none due during the run). Writer: RSS growth of its process
   (before the load vs after the writer has made all M durable and acked, 5 s settled; and the
   peak). Trackers: the broker's heap after a full GC (`jcmd <pid> GC.run`, `GC.heap_info`) before
   and after all M are tracked (subscription msgDelayed), the tracker's own direct-memory figure
   (`pulsar_delayed_message_index_size_bytes`: the in-memory tracker's priority queue is off-heap),
   the JVM's direct memory (it includes the entry cache) and its RSS.
4. recovery: with those M pending, D more messages due at once are sent while nothing consumes
   them (writer stopped / the tracker's consumer closed), then the writer is restarted (SIGINT or
   SIGKILL, start) or the tracker's topic unloaded (`topics unload`: admin REST PUT .../unload; the
   tracker is rebuilt when the topic loads again). Time to the first arrival of a due message: for
   the writer from its process launch, for the tracker from the unload request. Then the running
   writer's own topics are unloaded the same way: its scheduling topic (D due messages sent once
   the request is answered: its consumer has to come back for them) and its target (D messages
   indexed before, due at the request: its producer has to come back to release them); time from
   the unload request to the first of them.
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

    flock /tmp/pl-heavy.lock .venv/bin/python bench/bench_vs_pulsar.py             # every table at issue sizes: 200k, 1M
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
import sys
import time
from pathlib import Path
from typing import List, Optional

from vs_pulsar.common import PARTS, BenchFailure
from vs_pulsar.dedup import dedup_child
from vs_pulsar.driver import run_all
from vs_pulsar.plans import plan
from vs_pulsar.report import attempts_line, summary


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
                    help="only the standalones whose label contains one of these ';'-separated strings "
                         "(labels: " + "; ".join(c.label for c in plan(False)) + ")")
    ap.add_argument("--runs", type=int, default=3,
                    help="runs of every contender per standalone (medians with min-max; alternating order)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no warm-up pass of every contender on each standalone before its runs")
    ap.add_argument("--payloads", default="100,1024", help="payload sizes in bytes of part 1 (comma-separated)")
    ap.add_argument("--ticks", default="1000,100,10", help="tracker ticks in ms of part 2 (comma-separated)")
    ap.add_argument("--lateness-skip-s", type=float, default=10.0,
                    help="seconds at the start of the paced schedule left out of every contender's lateness (2)")
    ap.add_argument("--saturated", type=int, default=200_000, help="messages due at one instant (1)")
    ap.add_argument("--saturated-lead-s", type=float, default=0.0,
                    help="due instant after the load starts (0: 10 s + N at 2,500 msg/s)")
    ap.add_argument("--rate", type=int, default=5000, help="paced msg/s (2)")
    ap.add_argument("--seconds", type=float, default=20.0, help="paced duration (2)")
    ap.add_argument("--lead-ms", type=int, default=3000, help="deliver-at after send (2)")
    ap.add_argument("--pending", type=int, default=1_000_000, help="messages pending 1-24 h (3, 4)")
    ap.add_argument("--due", type=int, default=100, help="due messages sent before a restart (4)")
    ap.add_argument("--restarts", type=int, default=5, help="restarts of each kind per contender (4)")
    ap.add_argument("--dedup-messages", type=int, default=200_000, help="ids per dedup run (5)")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--settle-s", type=float, default=5.0, help="wait before a memory reading (3)")
    ap.add_argument("--timeout", type=float, default=120.0, help="slack added to every wait (s)")
    ap.add_argument("--skip", default="",
                    help="';'-separated part:contender pairs to leave out, e.g. 'memory:inmemory;saturated:writer'")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    ap.add_argument("--profile-writer", default=None,
                    help="py-spy (on PATH or beside python) samples the writer during the saturated release and "
                         "the paced lateness run into this directory (collapsed stacks, 50 Hz, --nonblocking)")
    args = ap.parse_args(argv)
    if args.cmd == "dedup-child":
        dedup_child(args)
        return
    if args.smoke:
        args.saturated, args.rate, args.seconds, args.lead_ms = 2000, 500, 2.0, 1000
        args.pending, args.due, args.dedup_messages, args.settle_s = 5000, 20, 6000, 1.0
        args.restarts = 1
        args.runs, args.warmup, args.payloads, args.lateness_skip_s = 1, False, "100", 0.0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown --parts {sorted(unknown)}; choose from {','.join(PARTS)}")
    if "recovery" in parts and "memory" not in parts:
        parts.append("memory")  # recovery starts from memory's pending messages
    started = time.time()
    print(f"bench_vs_pulsar: saturated {args.saturated:,}, paced {args.rate:,}/s x {args.seconds:g} s (lead "
          f"{args.lead_ms} ms), pending {args.pending:,} (+{args.due} due), dedup {args.dedup_messages:,}, "
          f"{args.payload_bytes} B (part 1: {args.payloads} B); runs {args.runs}{', warm-up' if args.warmup else ''}; "
          f"parts {','.join(parts)}; load average {os.getloadavg()[0]:.2f}", flush=True)
    results, failures = run_all(args, parts)
    summary(results, args.smoke)
    print(f"done in {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f}; {attempts_line(results)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "failures": failures},
                                              indent=2, default=str))
    ours = [f for f in failures if any(w in f for w in ("writer", "batched-pipe", "DedupPublisher"))]
    if ours:
        raise BenchFailure(f"{len(ours)} run(s) of ours failed: " + " | ".join(ours))


if __name__ == "__main__":
    try:
        main()
    except BenchFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
