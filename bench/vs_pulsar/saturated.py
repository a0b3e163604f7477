"""Part 1: N messages due at one instant; delivered msg/s at the consumer."""
from __future__ import annotations

import argparse
import time
from typing import Any, Dict, Optional

import _writer_common as wc
from vs_pulsar.common import (
    Ctx,
    fresh_dir,
    fresh_topic,
    load,
    require,
    start_profile,
    start_writer,
    stop_profile,
    sub_stats,
    wait_until,
)


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
    wd = fresh_dir(ctx.workdir, "sat-pipe")
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


