"""The runs: one standalone per BrokerConf of the plan, started, its tasks run --runs times, stopped.

On each standalone: a warm-up pass of every contender of the ALTERNATING parts at a small size (its
figures are dropped), then run 1..N, the ONCE parts (memory, recovery: they carry state from one task
to the next and restart the broker) in run 1 only, in plan order, the others in plan order in odd runs
and reversed in even ones. A run of a contender that fails (BenchFailure) is counted as aborted and
the others go on; the benchmark exits non-zero at the end when one did.
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pulsar

import _writer_common as wc
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from vs_pulsar.common import BenchFailure, Ctx
from vs_pulsar.dedup import dedup
from vs_pulsar.lateness import lateness
from vs_pulsar.memory import memory_control, memory_native, memory_writer
from vs_pulsar.plans import ALTERNATING, PUBLISH, BrokerConf, payload_of_label, plan
from vs_pulsar.recovery import recovery_native, recovery_writer
from vs_pulsar.saturated import saturated_native, saturated_pipe, saturated_writer

OURS = ("writer", "batched-pipe", PUBLISH)  # contenders of saturated/lateness that run on several standalones


# -- driver -----------------------------------------------------------------------------------------------
def run_task(ctx: Ctx, part: str, who: str) -> Dict[str, Any]:
    if part == "saturated":
        base, payload = payload_of_label(who)
        saved = ctx.args
        ctx.args = copy.copy(saved)
        ctx.args.payload_bytes = payload
        try:
            return saturated_pipe(ctx) if base == "batched-pipe" else (
                saturated_writer(ctx) if base == "writer" else saturated_native(ctx, who))
        finally:
            ctx.args = saved
    if part == "lateness":
        return lateness(ctx, who)
    if part == "dedup":
        return dedup(ctx, who)
    if part == "memory":
        if who == "control":
            return memory_control(ctx)
        return memory_writer(ctx, who) if who.startswith("writer") else memory_native(ctx, who)
    return recovery_writer(ctx) if who == "writer" else recovery_native(ctx, who)


def result_key(conf: BrokerConf, part: str, who: str) -> str:
    """Where a task's figures go in results[part]: our saturated/lateness contenders run on several
    standalones and carry the standalone's tracker ("writer, 100 B [bucket]"); the rest their label."""
    if part in ("saturated", "lateness") and payload_of_label(who)[0] in OURS:
        return f"{who} [{conf.short}]"
    return who


def warm_args(args: argparse.Namespace) -> argparse.Namespace:
    """The warm-up pass's sizes: every code path once on this JVM, small."""
    w = copy.copy(args)
    w.saturated = min(args.saturated, 5000)
    w.saturated_lead_s = min(args.saturated_lead_s, 8.0) if args.saturated_lead_s else 8.0
    w.seconds = min(args.seconds, 3.0)
    w.lateness_skip_s = 0.0
    w.dedup_messages = min(args.dedup_messages, 6000)
    return w


def aggregate(rec: Dict[str, Any]) -> Dict[str, Any]:
    """The median of every numeric field over the runs that completed, its min-max in "spread",
    the runs themselves ("run_results"), attempts and aborted runs; other fields from the middle run."""
    runs: List[Dict[str, Any]] = rec["runs"]
    out: Dict[str, Any] = {}
    if runs:
        out.update(runs[len(runs) // 2])
        spread: Dict[str, List[float]] = {}
        for k in runs[0]:
            vals = [r.get(k) for r in runs]
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
                nums = [float(x) for x in vals if x is not None]
                out[k] = statistics.median(nums)
                spread[k] = [min(nums), max(nums)]
        out["spread"] = spread
    out.update(run_results=runs, attempts=rec["attempts"], aborted=len(rec["aborted"]), aborted_reasons=rec["aborted"],
               ok_runs=len(runs))
    return out


def run_all(args: argparse.Namespace, parts: List[str]) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """Every task of the plan that `parts`, --brokers and --skip select, --runs times:
    (results[part][key] as aggregate() makes it, the failures of our contenders)."""
    tallies: Dict[str, Dict[str, Dict[str, Any]]] = {}
    failures: List[str] = []
    payloads = [int(p) for p in str(args.payloads).split(",") if p.strip()]
    ticks = [int(x) for x in str(args.ticks).split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-vs-pulsar-") as tmp:
        for conf in plan(args.smoke, payloads, ticks):
            skip = {tuple(x.split(":", 1)) for x in args.skip.split(";") if ":" in x}
            tasks = [(p, w) for p, w in conf.tasks if p in parts and (p, w) not in skip]
            wanted = [b.strip() for b in args.brokers.split(";") if b.strip()]  # labels hold commas
            if not tasks or (wanted and not any(b in conf.label for b in wanted)):
                continue
            broker = PulsarStandalone(tracker=conf.tracker, tick_millis=conf.tick_ms, deduplication=conf.dedup,
                                      config=conf.broker_config(), profile=conf.profile)
            t0 = time.monotonic()
            broker.start()
            print(f"broker {conf.label} ({conf.profile} profile): Apache Pulsar "
                  f"{broker.release.version if broker.release else '?'} started in {time.monotonic() - t0:.1f} s "
                  f"({broker.service_url}); load average {os.getloadavg()[0]:.2f}", flush=True)
            ctx = Ctx(args, broker, quiet_client(broker.service_url), Path(tmp) / re.sub(r"[^a-z0-9]+", "-", conf.label))
            try:
                alternating = [t for t in tasks if t[0] in ALTERNATING]
                once = [t for t in tasks if t[0] not in ALTERNATING]
                if args.warmup and alternating:
                    ctx.args = warm_args(args)
                    print(f"  warm-up pass ({len(alternating)} contenders, figures dropped)", flush=True)
                    for part, who in alternating:
                        try:
                            run_task(ctx, part, who)
                        except BenchFailure as exc:
                            print(f"  warm-up {part} {who}: {exc}", flush=True)
                    ctx.args = args
                for r in range(args.runs):
                    order = (once if r == 0 else []) + (alternating if r % 2 == 0 else alternating[::-1])
                    print(f"  run {r + 1} of {args.runs}; load average {os.getloadavg()[0]:.2f}", flush=True)
                    for part, who in order:
                        key = result_key(conf, part, who)
                        rec = tallies.setdefault(part, {}).setdefault(key, {"runs": [], "attempts": 0, "aborted": []})
                        rec["attempts"] += 1
                        try:
                            res = run_task(ctx, part, who)
                        except BenchFailure as exc:
                            rec["aborted"].append(str(exc)[:500])
                            failures.append(f"{part} {key} run {r + 1}: {exc}")
                            print(f"  ABORTED {part} {key} run {r + 1}: {exc}", flush=True)
                            continue
                        res["run"], res["load_average"] = r + 1, round(os.getloadavg()[0], 2)
                        rec["runs"].append(res)
            finally:
                # what a part left for a later one (memory -> recovery): its processes and consumers
                for handle in ctx.handles.values():
                    for item in handle if isinstance(handle, (tuple, list)) else (handle,):
                        if isinstance(item, subprocess.Popen):
                            wc.stop_process(item)
                        elif isinstance(item, pulsar.Consumer):
                            item.close()
                ctx.client.close()
                broker.stop()
    return {part: {k: aggregate(rec) for k, rec in recs.items()} for part, recs in tallies.items()}, failures
