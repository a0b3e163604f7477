"""Part 4: time from a restart to the first due message."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pulsar

import _writer_common as wc
from pulsar_lifecycle.runtime.client import quiet_client
from vs_pulsar.common import (
    BenchFailure,
    Ctx,
    load,
)


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


