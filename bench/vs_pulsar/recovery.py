"""Part 4: time from a restart, or a `topics unload`, to the first due message."""
from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pulsar

import _writer_common as wc
from vs_pulsar.common import (
    BenchFailure,
    Ctx,
    load,
    ratio,
)


def spread(values: Sequence[float]) -> Dict[str, float]:
    """median, min, max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(sp: Dict[str, float], unit: str = " s") -> str:
    return f"{sp['median']:.2f}{unit} ({sp['min']:.2f}-{sp['max']:.2f})"


def send_due(ctx: Ctx, topic: str, lo: int, d: int, native: bool, at_ms: Optional[int] = None) -> None:
    """D messages (ids lo..lo+d-1) due at `at_ms` (default: now)."""
    at = wc.now_ms() if at_ms is None else at_ms
    load(ctx.client, topic, d, ctx.args.payload_bytes, lambda i: at, native=native, first=lo)


# The writer's topics a `topics unload` moves, as the trackers' topic moves (recovery_native).
UNLOADS = ("scheduling", "target")
UNLOAD_LEAD_MS = 2000  # a target unload's D messages are sent this long before they are due
KILL_TARGET_S = 0.5  # writer SIGKILL -> first due message
# The restarted writer's start, from its INFO log: the first line, then these events in order.
PHASES = ("localrun_started", "bucket_index_location", "scheduler_recovered", "scheduling_consumer_subscribed")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def start_localrun_info(ctx: Ctx, wd: Path) -> subprocess.Popen:
    """wc.start_localrun with the log at INFO (the start's phases, start_phases): the restarted writer."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(wc.__file__).resolve().parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with open(wd / "localrun.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "INFO", "localrun",
             "--function-config-file", str(wd / "writer.yaml"), "--broker-service-url", ctx.url,
             "--data-dir", str(wd / "data")],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=wd, env=env)


def start_phases(log: Path, offset: int, t0_ms: float) -> Dict[str, float]:
    """Seconds from t0 (the launch) to the first log line written after `offset` ("up") and to each
    event of PHASES the log has (ms resolution; the log's local time)."""
    out: Dict[str, float] = {}
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    for line in text.splitlines():
        m = LOG_TIME.match(line)
        if m is None:
            continue
        at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) * 1000 + int(m.group(2))
        out.setdefault("up", (at - t0_ms) / 1000.0)
        for ev in PHASES:
            if f"event={ev} " in line or line.endswith(f"event={ev}"):
                out.setdefault(ev, (at - t0_ms) / 1000.0)
    return out


def recovery_writer(ctx: Ctx) -> Dict[str, Any]:
    """Writer instance restarts on a warm broker, `--restarts` of each kind, alternating: SIGINT (the
    runtime stops the instance) and SIGKILL (the instance's process dies). Before each, D due
    messages are sent while the writer is down, behind the M pending ones; the time is from the new
    process's launch to the first of them at the consumer. Then, the writer running, `--restarts`
    unloads of each of its topics (writer_unload): the scheduling topic and the target."""
    m, d, a = ctx.args.pending, ctx.args.due, ctx.args
    topics, wd, proc, consumer = ctx.handles.pop("writer")
    print(f"  recovery writer: {wc.byte_compile_package()}", flush=True)
    runs: List[Dict[str, Any]] = []
    lo = m
    try:
        for r in range(2 * a.restarts):
            how = "SIGINT" if r % 2 == 0 else "SIGKILL"
            if how == "SIGINT":
                rc_stop = wc.stop_process(proc)
            else:
                proc.kill()
                rc_stop = proc.wait(timeout=30)
            send_due(ctx, topics.sched, lo, d, native=False)
            offset = (wd / "localrun.log").stat().st_size
            t0 = time.time() * 1000.0
            proc = start_localrun_info(ctx, wd)
            res = first_due(consumer, lo, d, t0, a.timeout + m / 2000, pending_below=m, alive=proc,
                            log=wd / "localrun.log")
            res.update(how=how, exit_code_before=rc_stop)
            res["phases"] = start_phases(wd / "localrun.log", offset, t0)
            if res["early_pending"] or res["due_arrived"] != d or res["duplicates"] or res["repeated"]:
                raise BenchFailure(f"recovery writer ({how}): {res}")
            print(f"  recovery writer {how} {r // 2 + 1}: first due message {res['first_s']:.2f} s after the process "
                  f"launch, all {d} due {res['all_s']:.2f} s; {m:,} pending, none early; after the launch: "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in res["phases"].items()), flush=True)
            runs.append(res)
            lo += d
        for r in range(len(UNLOADS) * a.restarts):
            res, consumer = writer_unload(ctx, topics, consumer, UNLOADS[r % len(UNLOADS)], lo, proc,
                                          wd / "localrun.log")
            print(f"  recovery writer unload of the {res['how']} topic {r // len(UNLOADS) + 1}: answered "
                  f"{res['ready_s']:.2f} s after the request; first due message {res['first_s']:.2f} s after it, all "
                  f"{d} due {res['all_s']:.2f} s" + (f" (the {d} sent {res['sent_s']:.2f} s after it)"
                                                    if "sent_s" in res else ""), flush=True)
            runs.append(res)
            lo += d
    finally:
        rc = wc.stop_process(proc)
        with contextlib.suppress(pulsar.PulsarException):  # closed already when a target unload failed
            consumer.close()
    out: Dict[str, Any] = {"runs": runs, "exit_code": rc}
    for how in ("SIGINT", "SIGKILL", *UNLOADS):
        out[how.lower()] = spread([x["first_s"] for x in runs if x["how"] == how])
    out["first_s"] = out["sigint"]["median"]
    for how in ("SIGINT", "SIGKILL"):
        got = [x["phases"] for x in runs if x["how"] == how]
        out[f"phases_{how.lower()}"] = {k: statistics.median(p[k] for p in got if k in p)
                                        for k in ("up", *PHASES) if any(k in p for p in got)}
    print(f"  recovery writer: first due message after the launch, median (min-max) of {a.restarts}: SIGINT "
          f"{fmt_spread(out['sigint'])}, SIGKILL {fmt_spread(out['sigkill'])}; after the unload request: scheduling "
          f"topic {fmt_spread(out['scheduling'])}, target {fmt_spread(out['target'])}", flush=True)
    print("  recovery writer SIGKILL start, medians after the launch: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in out["phases_sigkill"].items()), flush=True)
    return out


def writer_unload(ctx: Ctx, topics: wc.Topics, consumer: pulsar.Consumer, which: str, lo: int,
                  proc: subprocess.Popen, log: Path) -> Tuple[Dict[str, Any], pulsar.Consumer]:
    """`topics unload` of one of the running writer's topics, and the time from the request to the
    first of D due messages that have to pass that topic after it (ids lo..lo+d-1, due at the request):

    - "scheduling": D due messages are sent once the request is answered (a fresh producer: it
      loads the topic again); the writer's consumer of the topic has to come back for them;
    - "target": D messages due at the request were indexed before it; the writer's producer of the
      target (the output) has to come back to release them. The checking consumer is closed before
      and subscribes again once the request is answered, as recovery_native's does.

    Returns (figures, the checking consumer to go on with)."""
    m, d, a = ctx.args.pending, ctx.args.due, ctx.args
    res: Dict[str, Any] = {}
    if which == "target":
        due_ms = wc.now_ms() + UNLOAD_LEAD_MS
        send_due(ctx, topics.sched, lo, d, native=False, at_ms=due_ms)
        consumer.close()
        time.sleep(max(0.0, due_ms / 1000.0 - time.time()))
    t0 = time.time() * 1000.0
    unload_topic(ctx, topics.sched if which == "scheduling" else topics.out)
    res["ready_s"] = (time.time() * 1000.0 - t0) / 1000.0
    if which == "scheduling":
        send_due(ctx, topics.sched, lo, d, native=False, at_ms=int(t0))
        res["sent_s"] = (time.time() * 1000.0 - t0) / 1000.0
    else:
        consumer = wc.output_consumer(ctx.client, topics.out)
    res.update(first_due(consumer, lo, d, t0, a.timeout + m / 2000, pending_below=m, alive=proc, log=log))
    res["how"] = which
    if res["first_s"] < 0 or res["early_pending"] or res["due_arrived"] != d or res["duplicates"] or res["repeated"]:
        raise BenchFailure(f"recovery writer (unload of the {which} topic): {res}")
    return res, consumer


def first_due(consumer: pulsar.Consumer, lo: int, d: int, t0_ms: float, timeout_s: float,
              pending_below: Optional[int] = None, alive: Optional[subprocess.Popen] = None,
              log: Optional[Path] = None) -> Dict[str, Any]:
    """Receive until all D due messages (ids lo..lo+d-1) arrived: seconds from t0 to the first and the
    last of them. Pending ids (< pending_below, default lo) arriving are early; ids between
    pending_below and lo (an earlier round's due messages) arriving again are repeated."""
    pending_below = lo if pending_below is None else pending_below
    first = last = None
    due_seen: Dict[int, int] = {}
    early_pending = repeated = 0
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
        if i < pending_below:
            early_pending += 1
            continue
        if i < lo:
            repeated += 1
            continue
        if i >= lo + d:
            continue  # a warm-up message
        due_seen[i] = due_seen.get(i, 0) + 1
        first = now if first is None else first
        last = now
    if first is None or last is None:
        raise BenchFailure(f"no due message arrived within {timeout_s:.0f} s")
    return {"first_s": (first - t0_ms) / 1000.0, "all_s": (last - t0_ms) / 1000.0, "due_arrived": len(due_seen),
            "duplicates": sum(c - 1 for c in due_seen.values()), "early_pending": early_pending, "repeated": repeated}


def unload_topic(ctx: Ctx, topic: str) -> None:
    """`pulsar-admin topics unload`: the admin REST call it makes."""
    path = "/admin/v2/persistent/" + topic[len("persistent://"):] + "/unload"
    req = urllib.request.Request(ctx.broker.admin_url + path, method="PUT")
    with urllib.request.urlopen(req, timeout=max(60.0, ctx.args.timeout)) as resp:
        resp.read()


def recovery_native(ctx: Ctx, label: str) -> Dict[str, Any]:
    """The tracker's topic unloaded `--restarts` times on the warm broker (`topics unload`: what a
    topic moving between brokers costs; the tracker is rebuilt when the topic loads again, on the
    next subscribe). Before each, D due messages are sent while no consumer is connected; the time
    is from the unload request to the first of them.

    The broker's crash is not measured: a SIGKILLed standalone came back with the topic empty (the
    managed ledger's metadata lived in its in-process ZooKeeper: 200,000 pending and 100 due gone),
    and a cluster's broker crash differs anyway (the topic loads on another broker as after an
    unload, once the dead broker's metadata session expires: metadataStoreSessionTimeoutMillis)."""
    m, d, a = ctx.args.pending, ctx.args.due, ctx.args
    topic, first_consumer = ctx.handles.pop(label)
    consumer: Optional[pulsar.Consumer] = first_consumer
    runs: List[Dict[str, Any]] = []
    try:
        for r in range(a.restarts):
            if consumer is not None:
                consumer.close()
                consumer = None
            lo = m + r * d
            send_due(ctx, topic, lo, d, native=True)
            t0 = time.time() * 1000.0
            unload_topic(ctx, topic)
            t_ready = time.time() * 1000.0
            consumer = wc.output_consumer(ctx.client, topic)
            res = first_due(consumer, lo, d, t0, a.timeout + m / 2000, pending_below=m)
            if res["due_arrived"] != d:
                raise BenchFailure(f"recovery {label} (unload): {res}")
            res.update(how="unload", ready_s=(t_ready - t0) / 1000.0)
            res["first_from_ready_s"] = res["first_s"] - res["ready_s"]
            print(f"  recovery {label} unload {r + 1}: answered {res['ready_s']:.2f} s after the request; first due "
                  f"message {res['first_s']:.2f} s after it, all {d} due {res['all_s']:.2f} s; pending early "
                  f"{res['early_pending']}, duplicates {res['duplicates']}, earlier due again {res['repeated']}",
                  flush=True)
            if res["early_pending"] or res["duplicates"] or res["repeated"]:
                print(f"    FINDING recovery {label} (unload): {res['early_pending']} pending early, "
                      f"{res['duplicates']} duplicates, {res['repeated']} earlier due again", flush=True)
            runs.append(res)
    finally:
        if consumer is not None:
            consumer.close()
    out: Dict[str, Any] = {"runs": runs, "unload": spread([x["first_s"] for x in runs])}
    out["first_s"] = out["unload"]["median"]
    out["first_from_ready_s"] = statistics.median(x["first_from_ready_s"] for x in runs)
    print(f"  recovery {label}: first due message after the unload request, median (min-max) of {a.restarts}: "
          f"{fmt_spread(out['unload'])}", flush=True)
    return out


def summary_recovery(results: Dict[str, Dict[str, Any]]) -> None:
    """The summary's restart lines: writer instance restarts and unloads of its topics against the
    trackers' topic unloads, and the targets."""
    bucket = "bucket"
    rec = results.get("recovery", {})
    w_rec = rec.get("writer")
    if w_rec:
        for who, r in rec.items():
            if who == "writer":
                continue
            print(f"  recovery first due, medians: writer SIGINT / {who} unload "
                  f"{ratio(w_rec['sigint']['median'], r['unload']['median'])}, writer SIGKILL / {who} unload "
                  f"{ratio(w_rec['sigkill']['median'], r['unload']['median'])} ({w_rec['sigint']['median']:.2f} / "
                  f"{w_rec['sigkill']['median']:.2f} vs {r['unload']['median']:.2f} s)")
            for which in UNLOADS:
                if which in w_rec:
                    print(f"  recovery first due after a topic unload, medians: writer's {which} topic / {who}'s "
                          f"{ratio(w_rec[which]['median'], r['unload']['median'])} ({w_rec[which]['median']:.2f} vs "
                          f"{r['unload']['median']:.2f} s)")
        ok = w_rec["sigkill"]["median"] <= KILL_TARGET_S
        print(f"  target writer SIGKILL -> first due <= {KILL_TARGET_S} s (median): {w_rec['sigkill']['median']:.2f} s "
              f"-> {'met' if ok else 'NOT met'}")
        if rec.get(bucket) and "scheduling" in w_rec:
            ok = w_rec["scheduling"]["median"] <= rec[bucket]["unload"]["median"]
            print(f"  target writer scheduling-topic unload <= bucket topic unload (first due, medians): "
                  f"{'met' if ok else 'NOT met'}")
