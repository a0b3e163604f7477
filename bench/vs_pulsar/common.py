"""What every part shares: the run context (Ctx), constants, topic and load helpers, the writer's start."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pulsar
import yaml

import _writer_common as wc
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

NS = "persistent://public/default"
SUB = "bench-check"  # wc.output_consumer's subscription
HOUR_MS = 3_600_000
MB = 1024 * 1024
PARTS = ("saturated", "lateness", "dedup", "memory", "recovery")
PRODUCER_START_MS = 1500  # the paced producer's process start-up margin


class BenchFailure(RuntimeError):
    """A contender of ours lost, duplicated or released early a message, or a run did not complete."""


@dataclass
class Ctx:
    """What the parts of one broker share."""

    args: argparse.Namespace
    broker: PulsarStandalone
    client: pulsar.Client
    workdir: Path
    handles: Dict[str, Any] = field(default_factory=dict)  # memory -> recovery hand-over

    @property
    def url(self) -> str:
        return self.broker.service_url


# -- helpers -------------------------------------------------------------------------------------------
def fresh_topic(tag: str, ns: str = NS) -> str:
    return f"{ns}/vsp-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def fresh_dir(parent: Path, tag: str) -> Path:
    """parent/tag, or parent/tag-2, -3, ... when a run before this one used it (--runs)."""
    d, i = parent / tag, 1
    while d.exists():
        i += 1
        d = parent / f"{tag}-{i}"
    d.mkdir(parents=True)
    return d


def load(client: pulsar.Client, topic: str, n: int, payload_bytes: int, at_of: Callable[[int], int],
         native: bool, first: int = 0, every: Optional[Callable[[], None]] = None, batched: bool = True) -> float:
    """Send messages first..first+n-1 (payload_of(i), deliver-at property at_of(i); with `native` also
    pulsar-client's deliver_at); returns the seconds until all are confirmed. `batched=False`: one
    entry each, as pulsar-client sends the broker contenders' deliver-at messages (a tracker's control)."""
    producer = (wc.batching_producer(client, topic) if batched else
                client.create_producer(topic, batching_enabled=False, max_pending_messages=5000,
                                       block_if_queue_full=True))
    failed: List[object] = []

    def cb(res: pulsar.Result, _mid: object) -> None:
        if res != pulsar.Result.Ok:
            failed.append(res)

    t0 = time.perf_counter()
    for i in range(first, first + n):
        at = at_of(i)
        if native:
            producer.send_async(wc.payload_of(i, payload_bytes), cb, properties={DELIVER_AT_PROP: str(at)},
                                deliver_at=at)
        else:
            producer.send_async(wc.payload_of(i, payload_bytes), cb, properties={DELIVER_AT_PROP: str(at)})
        if every is not None and i % 10_000 == 0:
            every()
    producer.flush()
    seconds = time.perf_counter() - t0
    producer.close()
    if failed:
        raise BenchFailure(f"{len(failed)} of {n} sends to {topic} failed: {failed[:3]}")
    return seconds


def spread_24h(base_ms: int) -> Callable[[int], int]:
    """Deliver-at of message i: within 1 h .. 24 h after base_ms (a cheap deterministic hash of i)."""
    return lambda i: base_ms + HOUR_MS + (i * 2_654_435_761) % (23 * HOUR_MS)


def admin_json(broker: PulsarStandalone, path: str) -> Any:
    with urllib.request.urlopen(broker.admin_url + path, timeout=30) as resp:
        return json.loads(resp.read())


def sub_stats(broker: PulsarStandalone, topic: str) -> Dict[str, Any]:
    stats = admin_json(broker, "/admin/v2/persistent/" + topic[len("persistent://"):] + "/stats")
    return dict(stats.get("subscriptions", {}).get(SUB, {}))


def wait_until(count: Callable[[], int], target: int, until_mono: float, poll_s: float = 0.5) -> Tuple[int, float]:
    """Poll count() until it reaches target or until_mono; (last count, seconds waited)."""
    t0 = time.monotonic()
    c = -1
    while True:
        try:
            c = count()
        except (OSError, ValueError, KeyError):
            c = -1
        if c >= target or time.monotonic() >= until_mono:
            return c, time.monotonic() - t0
        time.sleep(poll_s)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    """a / b to two places, or "n/a" when either is missing (or b is 0): the summaries' ratios."""
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def stats_of(values: Sequence[float]) -> Dict[str, float]:
    return {"p50": wc.percentile(values, 50), "p99": wc.percentile(values, 99), "max": max(values),
            "min": min(values), "early": float(sum(1 for v in values if v < 0))}


def require(label: str, got: wc.Received, n: int, ours: bool, early: int = 0) -> None:
    """All n arrived; for our contenders also no duplicate and nothing early."""
    if got.unique != n:
        raise BenchFailure(f"{label}: {got.unique:,} of {n:,} arrived")
    if ours and (got.duplicates or early):
        raise BenchFailure(f"{label}: {got.duplicates} duplicates, {early} before their deliver-at")
    if got.duplicates or early:
        print(f"    FINDING {label}: {got.duplicates} duplicate deliveries, {early} early", flush=True)


def start_writer(ctx: Ctx, tag: str, storage_url: Optional[str] = None
                 ) -> Tuple[wc.Topics, Path, int, subprocess.Popen, pulsar.Consumer]:
    """The shipped writer config on fresh topics, in its own localrun process, warmed up (one
    message through); its metrics (received_total) on the returned port, every second.
    `storage_url`: the index on that BookKeeper table service (where the shipped `auto` storage
    puts it under Pulsar's function worker) instead of a directory."""
    topics = wc.topics_for(tag)
    wd = fresh_dir(ctx.workdir, tag)
    port = wc.free_port()
    config = wc.write_writer_config(wd, topics, metricsIntervalSeconds=1)
    if storage_url:
        cfg = yaml.safe_load(config.read_text())
        del cfg["userConfig"]["snapshotDir"]
        cfg["userConfig"]["snapshotStorageServiceUrl"] = storage_url
        config.write_text(yaml.safe_dump(cfg))
    consumer = wc.output_consumer(ctx.client, topics.out)
    proc = wc.start_localrun(config, ctx.url, wd, port)
    try:
        wc.warm_up(ctx.client, topics, consumer, proc, wd / "localrun.log")
    except BaseException:
        wc.stop_process(proc)
        consumer.close()
        raise
    return topics, wd, port, proc, consumer


def start_profile(args: argparse.Namespace, pid: int, name: str) -> Optional[subprocess.Popen]:
    """With --profile-writer DIR: py-spy sampling `pid` (all threads, --nonblocking: the process is
    never paused) into DIR/<name>.txt as collapsed stacks, until stop_profile."""
    if not args.profile_writer:
        return None
    out = Path(args.profile_writer)
    out.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "-p", str(pid), "--nonblocking", "--threads", "--format", "raw",
                             "-r", "50", "-o", str(out / f"{name}.txt")],
                            stdout=subprocess.DEVNULL, stderr=open(out / f"{name}.log", "ab"))


def stop_profile(spy: Optional[subprocess.Popen]) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(timeout=10)


