"""Part 3: memory with M messages pending 1-24 h: the writer's RSS, the broker JVM's heap and direct memory."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import _writer_common as wc
from pulsar_lifecycle.runtime.pulsar_release import java_executable
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from vs_pulsar.common import (
    MB,
    SUB,
    BenchFailure,
    Ctx,
    fresh_topic,
    load,
    ratio,
    spread_24h,
    start_writer,
    sub_stats,
    wait_until,
)


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


_UNIT = {"K": 1024.0, "M": 1024.0 ** 2, "G": 1024.0 ** 3}


def heap_of(info: str) -> Tuple[float, float]:
    """(used, total) bytes of the heap out of `jcmd GC.heap_info`: G1's "garbage-first heap total
    262144K, used 1234K" or ZGC's (Pulsar's own JVM settings) "ZHeap used 236M, capacity 2048M"."""
    m = re.search(r"heap\s+total (\d+)([KMG]), used (\d+)([KMG])", info)
    if m:
        return int(m.group(3)) * _UNIT[m.group(4)], int(m.group(1)) * _UNIT[m.group(2)]
    m = re.search(r"ZHeap\s+used (\d+)([KMG]), capacity (\d+)([KMG])", info)
    if m:
        return int(m.group(1)) * _UNIT[m.group(2)], int(m.group(3)) * _UNIT[m.group(4)]
    raise BenchFailure(f"unexpected GC.heap_info output: {info[:300]}")


def jvm_memory(broker: PulsarStandalone, topic: str) -> Dict[str, float]:
    """The broker JVM after a full GC: heap used, direct memory used, the tracker's own index bytes
    for `topic` (what the tracker reports: its priority queues), bucket counts, RSS."""
    pid = str(broker.pid)
    tool = jcmd()
    subprocess.run([tool, pid, "GC.run"], check=True, capture_output=True, timeout=300)
    info = subprocess.run([tool, pid, "GC.heap_info"], check=True, capture_output=True, text=True, timeout=120).stdout
    used, total = heap_of(info)
    with urllib.request.urlopen(broker.admin_url + "/metrics/", timeout=60) as resp:
        text = resp.read().decode("utf-8", "replace")
    out: Dict[str, float] = {"heap_used": used, "heap_total": total,
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


# What Pulsar's trackers are made of: their own classes, then what a control run without deliver-at
# does not grow (the arrays, bitmaps and maps they hold).
TRACKER_PACKAGE = "org.apache.pulsar.broker.delayed."
# ... and what the Bucket tracker holds per ledger besides its index: a RoaringBitmap of the positions
TRACKER_HELD = (TRACKER_PACKAGE, "org.roaringbitmap.")
_HISTOGRAM_LINE = re.compile(r"^\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)")


def class_histogram(broker: PulsarStandalone) -> Dict[str, Tuple[int, int]]:
    """`jcmd <pid> GC.class_histogram` (a full GC first, live objects only): class -> (instances, shallow bytes)."""
    out = subprocess.run([jcmd(), str(broker.pid), "GC.class_histogram"], check=True, capture_output=True,
                         text=True, timeout=300).stdout
    hist: Dict[str, Tuple[int, int]] = {}
    for line in out.splitlines():
        m = _HISTOGRAM_LINE.match(line)
        if m:
            n, b = hist.get(m.group(3), (0, 0))
            hist[m.group(3)] = (n + int(m.group(1)), b + int(m.group(2)))
    if not hist:
        raise BenchFailure(f"unexpected GC.class_histogram output: {out[:300]}")
    return hist


def histogram_growth(before: Dict[str, Tuple[int, int]], after: Dict[str, Tuple[int, int]]) -> Dict[str, Tuple[int, int]]:
    """class -> (instances, bytes) added between two histograms."""
    return {c: (after.get(c, (0, 0))[0] - before.get(c, (0, 0))[0], after.get(c, (0, 0))[1] - before.get(c, (0, 0))[1])
            for c in set(before) | set(after)}


def top_classes(growth: Dict[str, Tuple[int, int]], most: int = 8) -> List[Tuple[str, int, int]]:
    """The `most` classes that grew most, as (class, instances, bytes)."""
    return [(c, n, b) for c, (n, b) in sorted(growth.items(), key=lambda kv: -kv[1][1])[:most] if b > 0]


def net_of(growth: Dict[str, Tuple[int, int]], control: Optional[Dict[str, Tuple[int, int]]]) -> Dict[str, Tuple[int, int]]:
    """Per class, the growth minus the control run's (the broker's own cost of the same backlog)."""
    if not control:
        return growth
    return {c: (growth.get(c, (0, 0))[0] - control.get(c, (0, 0))[0], growth.get(c, (0, 0))[1] - control.get(c, (0, 0))[1])
            for c in set(growth) | set(control)}


def describe_classes(rows: List[Tuple[str, int, int]]) -> str:
    return ", ".join(f"{c} +{b / MB:.1f} MB ({n:+,})" for c, n, b in rows)


def memory_control(ctx: Ctx) -> Dict[str, Any]:
    """The control of a tracker's memory: the same M messages (payloads and deliver-at property), no
    broker deliver-at, held as the subscription's backlog with the same consumer connected. What the
    broker grows here is what any backlog costs it; the tracker's own share is its run minus this."""
    m, a = ctx.args.pending, ctx.args
    topic = fresh_topic("mem-control")
    consumer = wc.output_consumer(ctx.client, topic)
    try:
        now = wc.now_ms()
        load(ctx.client, topic, 1, a.payload_bytes, lambda i: now, native=False, first=10**9 - 1, batched=False)
        consumer.acknowledge(consumer.receive(timeout_millis=60_000))
        before = jvm_memory(ctx.broker, topic)
        hist0 = class_histogram(ctx.broker)
        t0 = time.monotonic()
        load_s = load(ctx.client, topic, m, a.payload_bytes, spread_24h(wc.now_ms()), native=False, batched=False)
        held, _ = wait_until(lambda: int(sub_stats(ctx.broker, topic).get("msgBacklog", -1)), m,
                             time.monotonic() + a.timeout + m / 500)
        if held < m:
            raise BenchFailure(f"memory control: backlog {held:,} of {m:,}")
        time.sleep(a.settle_s)
        after = jvm_memory(ctx.broker, topic)
        growth = histogram_growth(hist0, class_histogram(ctx.broker))
    except BaseException:
        consumer.close()
        raise
    res = {"pending": m, "before": before, "after": after, "load_s": round(load_s, 1),
           "held_s": round(time.monotonic() - t0, 1), "top_classes": top_classes(growth),
           **{f"{k}_growth": after[k] - before.get(k, 0.0) for k in ("heap_used", "direct_used", "rss")}}
    print(f"  memory control (the same {m:,} as backlog, no deliver-at): heap after full GC "
          f"+{res['heap_used_growth'] / MB:.1f} MB, JVM direct +{res['direct_used_growth'] / MB:.1f} MB, RSS "
          f"+{res['rss_growth'] / MB:.1f} MB; grew most: {describe_classes(res['top_classes'][:5])}", flush=True)
    # (topic, readings, consumer): the driver closes the consumer at the end
    ctx.handles["memory-control"] = (topic, (growth, res), consumer)
    return res


def memory_writer(ctx: Ctx, label: str = "writer") -> Dict[str, Any]:
    """The writer's RSS growth with M pending; `writer` keeps its index in a directory (localrun's
    `auto`), `writer, table service` on the standalone's table service (`auto` under a function
    worker). The broker JVM's growth beside it: the table service lives in the standalone's JVM."""
    m, a = ctx.args.pending, ctx.args
    on_table = label == "writer, table service"
    topics, wd, port, proc, consumer = (start_writer(ctx, "mem-writer-bk", ctx.broker.state_storage_url) if on_table
                                        else start_writer(ctx, "mem-writer"))
    try:
        time.sleep(2.0)
        jvm0 = jvm_memory(ctx.broker, topics.sched)
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
        jvm1 = jvm_memory(ctx.broker, topics.sched)
        disk = sum(f.stat().st_size for d in (wd / "snapshots", wd / "data") if d.is_dir()
                   for f in d.rglob("*") if f.is_file())
    except BaseException:
        wc.stop_process(proc)
        consumer.close()
        raise
    if on_table:  # no restart follows: stopped here, so later parts run without its backlog
        wc.stop_process(proc)
        consumer.close()
    else:
        ctx.handles[label] = (topics, wd, proc, consumer)
    res = {"pending": m, "rss_before": rss0, "rss_after": rss1, "growth": rss1 - rss0, "peak_growth": peak_rss - rss0,
           "load_s": round(load_s, 1), "intake_s": round(intake_s, 1), "disk_bytes": disk,
           "storage": "table service" if on_table else "directory",
           **{f"broker_{k}_growth": jvm1[k] - jvm0.get(k, 0.0) for k in ("heap_used", "direct_used", "rss")}}
    print(f"  memory {label}: RSS {rss0 / MB:.1f} -> {rss1 / MB:.1f} MB, growth {res['growth'] / MB:.1f} MB (peak "
          f"+{res['peak_growth'] / MB:.1f} MB) with {m:,} pending; all durable and acked {intake_s:.1f} s after the "
          f"load began (load {load_s:.1f} s); {disk / MB:.0f} MB of snapshots and state on local disk; the broker "
          f"JVM meanwhile: heap after full GC {res['broker_heap_used_growth'] / MB:+.1f} MB, direct "
          f"{res['broker_direct_used_growth'] / MB:+.1f} MB, RSS {res['broker_rss_growth'] / MB:+.1f} MB", flush=True)
    return res



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
        hist0 = class_histogram(ctx.broker)
        t0 = time.monotonic()
        load_s = load(ctx.client, topic, m, a.payload_bytes, spread_24h(wc.now_ms()), native=True)
        tracked, _ = wait_until(lambda: int(sub_stats(ctx.broker, topic).get("msgDelayed", -1)), m,
                                time.monotonic() + a.timeout + m / 500)
        track_s = time.monotonic() - t0
        if tracked < m:
            raise BenchFailure(f"memory {label}: {tracked:,} of {m:,} tracked (subscription msgDelayed)")
        time.sleep(a.settle_s)
        after = jvm_memory(ctx.broker, topic)
        growth = histogram_growth(hist0, class_histogram(ctx.broker))
    except BaseException:
        consumer.close()
        raise
    ctx.handles[label] = (topic, consumer)
    res = {"pending": m, "before": before, "after": after, "load_s": round(load_s, 1), "track_s": round(track_s, 1),
           **{f"{k}_growth": after[k] - before.get(k, 0.0) for k in ("heap_used", "direct_used", "index_bytes", "rss")}}
    res["tracker_growth"] = res["heap_used_growth"] + res["index_bytes_growth"]
    own = {c: g for c, g in growth.items() if c.startswith(TRACKER_HELD)}
    res["tracker_classes_bytes"] = sum(b for _, b in own.values())
    res["tracker_classes"] = top_classes(own, 5)
    # The tracker's own: its index (off-heap, the tracker's own figure) and its objects on the heap.
    # Heap after GC is not: the standalone's bookie (its write memtable) and the entry cache share
    # the JVM and grow as much for the same backlog without deliver-at (the control).
    res["tracker_own"] = res["index_bytes_growth"] + max(0.0, res["tracker_classes_bytes"])
    control = ctx.handles.get("memory-control")
    control_res: Optional[Dict[str, Any]] = control[1][1] if control else None
    net = net_of(growth, control[1][0] if control else None)
    res["top_classes_net"] = top_classes(net)
    if control_res:
        # the broker's cost of the same backlog without deliver-at taken off: the tracker's own share
        res["net_heap_growth"] = res["heap_used_growth"] - control_res["heap_used_growth"]
        res["net_rss_growth"] = res["rss_growth"] - control_res["rss_growth"]
        res["net_tracker_growth"] = res["net_heap_growth"] + res["index_bytes_growth"]
    print(f"  memory {label}: heap after full GC +{res['heap_used_growth'] / MB:.1f} MB, tracker's index (direct) "
          f"+{res['index_bytes_growth'] / MB:.1f} MB, sum +{res['tracker_growth'] / MB:.1f} MB; JVM direct "
          f"+{res['direct_used_growth'] / MB:.1f} MB (entry cache included), RSS +{res['rss_growth'] / MB:.1f} MB; "
          f"{m:,} tracked {track_s:.1f} s after the load began (load {load_s:.1f} s); "
          + ", ".join(f"{k} {after[k]:,.0f}" for k in ("buckets", "loaded", "snapshot_bytes") if k in after),
          flush=True)
    if control_res:
        print(f"    net of the control: heap {res['net_heap_growth'] / MB:+.1f} MB, + index = tracker's own "
              f"{res['net_tracker_growth'] / MB:+.1f} MB; JVM RSS {res['net_rss_growth'] / MB:+.1f} MB", flush=True)
    print(f"    the tracker's own {res['tracker_own'] / MB:.1f} MB: index +{res['index_bytes_growth'] / MB:.1f} MB, "
          f"{' and '.join(p + '*' for p in TRACKER_HELD)} objects (shallow) +{res['tracker_classes_bytes'] / MB:.2f} MB: "
          f"{describe_classes(res['tracker_classes'])}", flush=True)
    print(f"    grew most{' beyond the control' if control else ''}: {describe_classes(res['top_classes_net'])}",
          flush=True)
    return res


def summary_memory(results: Dict[str, Dict[str, Any]]) -> None:
    """The summary's memory lines: the writer against each tracker's own growth."""
    bucket = "bucket"
    mem = results.get("memory", {})
    w_mem = mem.get("writer")
    if w_mem:
        for who, r in mem.items():
            if who in ("writer", "control") or who.startswith("writer"):
                continue
            own = r.get("tracker_own", r["tracker_growth"])
            print(f"  memory growth writer RSS / {who}'s own (index + its objects): {ratio(w_mem['growth'], own)} "
                  f"({w_mem['growth'] / MB:.1f} vs {own / MB:.1f} MB); {who}'s JVM heap after GC "
                  f"{r['heap_used_growth'] / MB:+.1f} MB"
                  + (f" ({r['net_heap_growth'] / MB:+.1f} net of the control)" if "net_heap_growth" in r else "")
                  + f"; RSS beside RSS: writer {w_mem['growth'] / MB:.1f} MB, broker JVM {r['rss_growth'] / MB:+.1f} MB"
                  + (f" ({r['net_rss_growth'] / MB:+.1f} net of the control)" if "net_rss_growth" in r else ""))
        on_table = mem.get("writer, table service")
        if on_table:
            print(f"  memory writer on the table service: RSS {on_table['growth'] / MB:.1f} MB, the broker JVM's heap "
                  f"after GC {on_table['broker_heap_used_growth'] / MB:+.1f} MB (the table service is in it) vs on a "
                  f"directory {w_mem['growth'] / MB:.1f} MB, broker {w_mem['broker_heap_used_growth'] / MB:+.1f} MB")
        if mem.get(bucket):
            own = mem[bucket].get("tracker_own", mem[bucket]["tracker_growth"])
            ok = w_mem["growth"] <= own
            print(f"  target writer RSS growth <= bucket tracker's own growth: {'met' if ok else 'NOT met'}")
