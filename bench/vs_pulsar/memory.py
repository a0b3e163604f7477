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
from typing import Any, Dict, Optional

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


def jvm_memory(broker: PulsarStandalone, topic: str) -> Dict[str, float]:
    """The broker JVM after a full GC: heap used, direct memory used, the tracker's own index bytes
    for `topic` (what the tracker reports: its priority queues), bucket counts, RSS."""
    pid = str(broker.pid)
    tool = jcmd()
    subprocess.run([tool, pid, "GC.run"], check=True, capture_output=True, timeout=300)
    info = subprocess.run([tool, pid, "GC.heap_info"], check=True, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"heap\s+total (\d+)K, used (\d+)K", info)
    if not m:
        raise BenchFailure(f"unexpected GC.heap_info output: {info[:300]}")
    with urllib.request.urlopen(broker.admin_url + "/metrics/", timeout=60) as resp:
        text = resp.read().decode("utf-8", "replace")
    out: Dict[str, float] = {"heap_used": int(m.group(2)) * 1024.0, "heap_total": int(m.group(1)) * 1024.0,
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



# -- 3. memory and 4. recovery ---------------------------------------------------------------------------
def memory_writer(ctx: Ctx) -> Dict[str, Any]:
    m, a = ctx.args.pending, ctx.args
    topics, wd, port, proc, consumer = start_writer(ctx, "mem-writer")
    try:
        time.sleep(2.0)
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
        disk = sum(f.stat().st_size for d in (wd / "snapshots", wd / "data") if d.is_dir()
                   for f in d.rglob("*") if f.is_file())
    except BaseException:
        wc.stop_process(proc)
        consumer.close()
        raise
    ctx.handles["writer"] = (topics, wd, proc, consumer)
    res = {"pending": m, "rss_before": rss0, "rss_after": rss1, "growth": rss1 - rss0, "peak_growth": peak_rss - rss0,
           "load_s": round(load_s, 1), "intake_s": round(intake_s, 1), "disk_bytes": disk}
    print(f"  memory writer: RSS {rss0 / MB:.1f} -> {rss1 / MB:.1f} MB, growth {res['growth'] / MB:.1f} MB (peak "
          f"+{res['peak_growth'] / MB:.1f} MB) with {m:,} pending; all durable and acked {intake_s:.1f} s after the "
          f"load began (load {load_s:.1f} s); {disk / MB:.0f} MB of snapshots and state on disk", flush=True)
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
        t0 = time.monotonic()
        load_s = load(ctx.client, topic, m, a.payload_bytes, spread_24h(wc.now_ms()), native=True)
        tracked, _ = wait_until(lambda: int(sub_stats(ctx.broker, topic).get("msgDelayed", -1)), m,
                                time.monotonic() + a.timeout + m / 500)
        track_s = time.monotonic() - t0
        if tracked < m:
            raise BenchFailure(f"memory {label}: {tracked:,} of {m:,} tracked (subscription msgDelayed)")
        time.sleep(a.settle_s)
        after = jvm_memory(ctx.broker, topic)
    except BaseException:
        consumer.close()
        raise
    ctx.handles[label] = (topic, consumer)
    res = {"pending": m, "before": before, "after": after, "load_s": round(load_s, 1), "track_s": round(track_s, 1),
           **{f"{k}_growth": after[k] - before.get(k, 0.0) for k in ("heap_used", "direct_used", "index_bytes", "rss")}}
    res["tracker_growth"] = res["heap_used_growth"] + res["index_bytes_growth"]
    print(f"  memory {label}: heap after full GC +{res['heap_used_growth'] / MB:.1f} MB, tracker's index (direct) "
          f"+{res['index_bytes_growth'] / MB:.1f} MB, sum +{res['tracker_growth'] / MB:.1f} MB; JVM direct "
          f"+{res['direct_used_growth'] / MB:.1f} MB (entry cache included), RSS +{res['rss_growth'] / MB:.1f} MB; "
          f"{m:,} tracked {track_s:.1f} s after the load began (load {load_s:.1f} s); "
          + ", ".join(f"{k} {after[k]:,.0f}" for k in ("buckets", "loaded", "snapshot_bytes") if k in after),
          flush=True)
    return res


