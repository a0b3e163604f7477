"""How fast a SIGKILLed BucketSnapshotWriter serves again on a broker it does not own, and what
becomes of the messages its consumer held.

One broker outlives the writer (as on a cluster, or a shared pulsar-lite): a pulsar-lite of the
benchmark's own (`--broker lite`, its log at `info` to count connection resets) or an Apache
Pulsar 4.0.0 standalone (`--broker pulsar`). The writer runs the shipped config through
`pulsar-lifecycle localrun --broker-service-url`. A paced producer sends scheduling messages due
0.5-5 s later for the whole run, so the writer always has intake and releases; a counter reads
the output topic. The writer is SIGKILLed `--kills` times at random moments (4-9 s apart) and
started again at once. Per kill it reports:

- serves again: from the SIGKILL to the first release of the new process (the first message on
  the output topic whose `__pl_released_at__` is after the kill);
- held: the messages the restarted writer read from a gap of its subscription
  (`event=intake_gap_read ... found=N`: a dead consumer of the subscription held them);
- late after serving: the latest release, relative to the moment it served again, of the
  messages due between the kill and that moment.

and the lateness (released-at minus deliver-at) of the messages due while a writer served.

At the end: every message released exactly once and none early (exit 1 otherwise), the restart
times (median, max) and on pulsar-lite how many kills left a connection reset in the broker's
log (a reset connection's consumers stay registered: subscribe.py, scheduler/intake_gaps.py).

    python bench/bench_writer_restart.py --broker lite [--kills 10] [--rate 300] [--seed 1]
"""
from __future__ import annotations

import argparse
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pulsar
import yaml

from _writer_common import byte_compile_package
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from pulsar_lifecycle.timing import now_ms

REPO = Path(__file__).resolve().parents[1]
NS = "persistent://public/default"
GAP_READ = re.compile(r"event=intake_gap_read how=gap .* found=(\d+) ")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", re.M)


def log_ms(line_start: str) -> Optional[int]:
    """Epoch ms of a log line's timestamp (local time, as the writer's log writes it)."""
    m = LOG_TIME.match(line_start)
    if m is None:
        return None
    return int(time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) * 1000) + int(m.group(2))


def phases(new_log: str, killed: int) -> str:
    """When the new process logged its first line and subscribed, in s after the kill."""
    lines = new_log.splitlines()
    first = next((log_ms(ln) for ln in lines if log_ms(ln) is not None), None)
    sub = next((log_ms(ln) for ln in lines if "event=scheduling_consumer_subscribed" in ln), None)
    fmt = lambda t: "?" if t is None else "%.1f s" % ((t - killed) / 1000)  # noqa: E731
    return f"process up after {fmt(first)}, subscribed after {fmt(sub)}"


@dataclass
class Run:
    """What the counter saw: payload -> [(receive ms, released-at ms)], and what was sent."""

    sent: Dict[bytes, int] = field(default_factory=dict)  # payload -> deliver-at
    seen: Dict[bytes, List[Tuple[int, int]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_release_after(self, t_ms: int) -> Optional[int]:
        with self.lock:
            times = [rel for copies in self.seen.values() for _, rel in copies if rel > t_ms]
        return min(times) if times else None


def writer_config(tmp: Path) -> Tuple[Path, str, str]:
    cfg = yaml.safe_load((REPO / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    sched, ticks, out = f"{NS}/restart-sched", f"{NS}/restart-ticks", f"{NS}/restart-out"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"},
                         sched: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    cfg.update(output=out, name="restart-writer", subName="restart-writer")
    cfg["userConfig"].update(schedulingTopic=sched, schedulingSubscription="restart-writer", tickTopic=ticks,
                             tickTimeMillis=200, snapshotStorage="directory", snapshotDir=str(tmp / "snapshots"))
    path = tmp / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, sched, out


def start_writer(config: Path, url: str, tmp: Path) -> "subprocess.Popen[bytes]":
    with open(tmp / "writer.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "INFO", "localrun", "--function-config-file",
             str(config), "--broker-service-url", url, "--data-dir", str(tmp / "data")],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp)


def feed(client: pulsar.Client, topic: str, rate: int, run: Run, stop: threading.Event, rng: random.Random) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                      max_pending_messages=10_000, block_if_queue_full=True)
    failed: List[bytes] = []
    i = 0
    t0 = time.monotonic()
    while not stop.is_set():
        due_n = int((time.monotonic() - t0) * rate)
        while i < due_n:
            payload = f"r{i}".encode()
            at = now_ms() + rng.randint(500, 5000)
            with run.lock:
                run.sent[payload] = at
            producer.send_async(payload, lambda res, _mid, p=payload: None if res == pulsar.Result.Ok else failed.append(p),
                                properties={DELIVER_AT_PROP: str(at)})
            i += 1
        time.sleep(0.01)
    producer.flush()
    producer.close()
    if failed:
        with run.lock:
            for p in failed:
                run.sent.pop(p, None)  # never confirmed: not counted as sent


def count(consumer: pulsar.Consumer, run: Run, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        with run.lock:
            run.seen.setdefault(m.data(), []).append((now_ms(), int(m.properties()[RELEASED_AT_PROP])))
        consumer.acknowledge(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=("lite", "pulsar"), default="lite")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--rate", type=int, default=300, help="scheduling messages per second")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-writer-restart-"))
    broker: Any = (EmbeddedBroker(data_dir=tmp / "broker", log_level="info") if args.broker == "lite"
                   else PulsarStandalone(data_dir=tmp / "pulsar"))
    broker.start()
    config, sched, out = writer_config(tmp)
    print(byte_compile_package(), flush=True)
    writer = start_writer(config, broker.service_url, tmp)
    client = quiet_client(broker.service_url)
    run, stop = Run(), threading.Event()
    consumer = client.subscribe(out, "count", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
    threads = [threading.Thread(target=feed, args=(client, sched, args.rate, run, stop, rng), daemon=True),
               threading.Thread(target=count, args=(consumer, run, stop), daemon=True)]
    kills: List[Tuple[int, Optional[int], int]] = []  # (kill ms, serves-again ms, gap messages found)
    rc = 0
    try:
        for t in threads:
            t.start()
        time.sleep(8)  # the first start, and a backlog of releases
        for k in range(args.kills):
            time.sleep(rng.uniform(4, 9))
            log_before = (tmp / "writer.log").read_text(errors="replace")
            killed = now_ms()
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=10)
            writer = start_writer(config, broker.service_url, tmp)
            served: Optional[int] = None
            deadline = time.monotonic() + 90
            while served is None and time.monotonic() < deadline:
                time.sleep(0.05)
                served = run.first_release_after(killed)
            time.sleep(2)  # a gap read follows the start within a second
            new_log = (tmp / "writer.log").read_text(errors="replace")[len(log_before):]
            found = sum(int(n) for n in GAP_READ.findall(new_log))
            kills.append((killed, served, found))
            follower = " (a Reader followed the topic)" if "event=intake_follower_started" in new_log else ""
            print(f"kill {k + 1}: serves again after "
                  f"{'%.1f s' % ((served - killed) / 1000) if served else 'more than 90 s'} ({phases(new_log, killed)}); "
                  f"held messages read from a gap: {found}{follower}", flush=True)
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        deadline = time.monotonic() + 30  # the last messages fall due
        while time.monotonic() < deadline:
            with run.lock:
                if set(run.sent) <= set(run.seen):
                    break
            time.sleep(0.5)
        end_stop = threading.Event()
        tail = threading.Thread(target=count, args=(consumer, run, end_stop), daemon=True)
        tail.start()
        time.sleep(3)  # a copy released late would show up here
        end_stop.set()
        tail.join(timeout=5)
        writer.send_signal(signal.SIGINT)
        try:
            writer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            writer.kill()
        client.close()
        broker_log = broker.log_path.read_text(errors="replace") if args.broker == "lite" else ""
        broker.stop()
    with run.lock:
        missing = set(run.sent) - set(run.seen)
        twice = [p for p, copies in run.seen.items() if len(copies) > 1]
        early = [p for p, copies in run.seen.items() if p in run.sent and min(r for _, r in copies) < run.sent[p]]
        late_after_serving = []
        windows = [(killed, served) for killed, served, _ in kills if served is not None]
        for killed, served in windows:
            for p, at in run.sent.items():
                if killed <= at <= served and p in run.seen:
                    late_after_serving.append(min(r for _, r in run.seen[p]) - max(at, served))
        serving = sorted(min(r for _, r in run.seen[p]) - at for p, at in run.sent.items()
                         if p in run.seen and not any(k <= at <= s for k, s in windows))
    with open(tmp / "lateness.tsv", "w") as out:  # payload, deliver-at, released-at (first copy), copies
        for p, at in sorted(run.sent.items(), key=lambda kv: kv[1]):
            copies = run.seen.get(p, [])
            out.write(f"{p.decode()}\t{at}\t{min((r for _, r in copies), default=-1)}\t{len(copies)}\n")
    with open(tmp / "kills.tsv", "w") as out:  # kill ms, serves-again ms, gap messages found
        for killed, served, found in kills:
            out.write(f"{killed}\t{served or -1}\t{found}\n")
    restart_s = [(s - k) / 1000 for k, s, _ in kills if s is not None]
    print(f"\n{args.broker}: {len(run.sent)} messages, {len(kills)} kills; missing {len(missing)}, released twice "
          f"{len(twice)}, early {len(early)}")
    if restart_s:
        print(f"serves again after a SIGKILL: median {statistics.median(restart_s):.1f} s, max {max(restart_s):.1f} s, "
              f"all: {', '.join('%.1f' % s for s in restart_s)}")
    print(f"held messages read from gaps: {sum(f for _, _, f in kills)} in {sum(1 for *_, f in kills if f)} of "
          f"{len(kills)} restarts")
    if serving:
        print(f"lateness (released-at minus deliver-at) of the {len(serving)} messages due while a writer served: "
              f"p50 {serving[len(serving) // 2]} ms, p99 {serving[int(len(serving) * 0.99)]} ms, max {serving[-1]} ms")
    if late_after_serving:
        print(f"the {len(late_after_serving)} messages due between a SIGKILL and the restarted writer serving: "
              f"released at most {max(late_after_serving)} ms after it served")
    if args.broker == "lite":
        print(f"broker log: {broker_log.count('reset by peer')} connection resets, "
              f"{broker_log.count('already exists')} 'already exists' refusals")
    if missing or twice or early or len(restart_s) < len(kills):
        rc = 1
    if args.keep or rc:
        print(f"logs in {tmp}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
