"""Reproduction (docs/architecture.md, "Runtime input"): where a paused runtime input holds messages.

It shows a behaviour of pulsar-client (its C++ consumer under Python) on both brokers, not a broker
quirk: the writer closes its runtime input instead of pausing it, and tests/integration/
test_writer_paced_start.py checks on both brokers that nothing is held then.

The writer's shipped config (direct intake) has two consumers on one Shared subscription of the
scheduling topic: the runtime's (a message listener, receiver queue 1) and the writer's own batch
consumer. This script builds that pair against a broker while a batching producer sends steadily
(payload = the message's sequence number), and then takes the runtime's consumer out of the way
in one of three ways:

- `pause`: the batch consumer subscribes, then `pause_message_listener()` and
  `redeliver_unacknowledged_messages()` (pause and hand back);
- `close`: `close()`, then the batch consumer subscribes (what the writer does:
  pulsar_lifecycle/scheduler/runtime_input.py);
- `close-late`: the batch consumer subscribes, then `close()` (the other order, for comparison).

After the load it counts what the batch consumer received; in `pause` it then resumes the
listener and prints the ids that come out of it. A message that comes out of the resumed
consumer and that the batch consumer never received was held by the paused consumer: nothing
acks, nacks or redelivers it while the consumer lives. Each is printed with its message id
(ledger:entry:batch index) and its publish time relative to the hand-back.

    .venv/bin/python scripts/repro/paused_runtime_input.py [--broker lite|pulsar] [--service-url pulsar://host:6650
        [--admin-url http://host:8080]] [--rate 2000]
        [--seconds 4] [--switch-after 1.5] [--runs 3] [--scenarios pause,close,close-late] [--at start,mid]

Without `--service-url` it starts the embedded broker (pulsar-lite), or with `--broker pulsar` a
real Apache Pulsar standalone, whose admin API then also shows the paused consumer's permits and
unacked messages.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import queue
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pulsar

from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client

SUBSCRIPTION = "writer"
SCENARIOS = ("pause", "close", "close-late")


def fmt_id(mid: pulsar.MessageId) -> str:
    """ledger:entry:batch index."""
    return f"{mid.ledger_id()}:{mid.entry_id()}:{mid.batch_index()}"


@dataclass
class Seen:
    """What one consumer received: payload number -> message id, and publish times (ms)."""

    ids: Dict[int, str] = field(default_factory=dict)
    published: Dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, msg: pulsar.Message) -> None:
        n = int(msg.data())
        with self.lock:
            self.ids[n] = fmt_id(msg.message_id())
            self.published[n] = msg.publish_timestamp()


class Producer(threading.Thread):
    """Sends 0, 1, 2, ... at `rate` per second through a batching producer (entries of ~rate/100).
    With `hold`, message 0 goes alone and the rest only once `hold` is set (a writer started by
    the first message of a topic, as in a fresh deployment or after a benchmark's warm-up)."""

    def __init__(self, client: pulsar.Client, topic: str, rate: int, seconds: float,
                 hold: Optional[threading.Event] = None) -> None:
        super().__init__(name="paced-producer", daemon=True)
        self._producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                                batching_max_publish_delay_ms=10, block_if_queue_full=True)
        self.rate, self.count, self._hold = rate, int(rate * seconds), hold

    def run(self) -> None:
        first = 0
        if self._hold is not None:
            self._producer.send(b"0")
            self._hold.wait(30)
            first = 1
        start = time.monotonic()
        for i in range(first, self.count):
            delay = start + (i - first) / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._producer.send_async(str(i).encode(), None)
        self._producer.flush()
        self._producer.close()


class BatchConsumer(threading.Thread):
    """The writer's direct consumer: batch_receive, ack every message."""

    def __init__(self, client: pulsar.Client, topic: str) -> None:
        super().__init__(name="batch-consumer", daemon=True)
        self.seen = Seen()
        self.last_receive = time.monotonic()
        self._stop_event = threading.Event()
        self._consumer = client.subscribe(
            topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=2000,
            initial_position=pulsar.InitialPosition.Earliest,
            batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(500, 16 << 20, 5))

    def run(self) -> None:
        while not self._stop_event.is_set():
            msgs = self._consumer.batch_receive()
            for m in msgs:
                self.seen.add(m)
                self._consumer.acknowledge(m)
            if msgs:
                self.last_receive = time.monotonic()
            else:
                time.sleep(0.005)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
        self._consumer.close()


@dataclass
class Outcome:
    """One scenario's counts."""

    scenario: str
    at: str
    sent: int
    by_batch: int
    by_runtime: int
    missing: List[int]
    held: List[int]
    held_also_batch: int


class RuntimeInput:
    """The runtime's consumer: a listener puts each message on a queue of one, an execution thread
    takes them one at a time (Pulsar's python_instance.py, and the local runner, do the same)."""

    def __init__(self, client: pulsar.Client, topic: str) -> None:
        self.queue: "queue.Queue[pulsar.Message]" = queue.Queue(1)
        self.acked, self.left = Seen(), Seen()  # handled and acked / left unacked for the broker
        self.resumed = Seen()  # what comes out after `pause`, when resumed
        self.stopped = threading.Event()
        self.consumer = client.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared,
                                         receiver_queue_size=1, initial_position=pulsar.InitialPosition.Earliest,
                                         message_listener=self._listener)

    def _listener(self, consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
        while not self.stopped.is_set():
            try:
                self.queue.put(msg, timeout=0.1)
                return
            except queue.Full:
                continue


def run_scenario(service_url: str, admin_url: Optional[str], scenario: str, at: str, rate: int, seconds: float,
                 switch_after: float, quiet_s: float) -> Outcome:
    """One run: the two consumers, the runtime's one switched off by the message being processed
    (as the writer's process() does): the topic's first message (`at` "start", the load follows)
    or the one processed `switch_after` seconds into the load ("mid"); then count."""
    topic = f"persistent://public/default/repro-runtime-input-{scenario}-{uuid.uuid4().hex[:8]}"
    client = quiet_client(service_url)
    rt = RuntimeInput(client, topic)
    batch: List[BatchConsumer] = []
    switched = threading.Event()
    switched_ms = [0]
    trigger: List[str] = []

    def switch(msg: pulsar.Message) -> None:
        trigger.append(fmt_id(msg.message_id()))
        switched_ms[0] = int(time.time() * 1000)
        if scenario == "pause":
            # Pause and hand back from process(): the message goes to the intake queue (acked once
            # durable), the service has subscribed its batch consumer, the runtime's consumer pauses.
            rt.acked.add(msg)
            rt.consumer.acknowledge(msg)
            batch.append(BatchConsumer(client, topic))
            rt.consumer.pause_message_listener()
            rt.consumer.redeliver_unacknowledged_messages()
        elif scenario == "close":
            rt.left.add(msg)  # not acked: the broker redelivers it
            rt.consumer.close()
            batch.append(BatchConsumer(client, topic))
        else:
            rt.left.add(msg)
            batch.append(BatchConsumer(client, topic))
            rt.consumer.close()
        batch[0].start()
        for line in consumer_stats(admin_url, topic):
            print(line.replace("broker:", "broker at the switch:"), flush=True)
        switched.set()

    def execute() -> None:
        start = time.monotonic()
        while not rt.stopped.is_set():
            try:
                msg = rt.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if not switched.is_set() and (at == "start" or time.monotonic() - start >= switch_after):
                switch(msg)
            elif switched.is_set() and scenario == "pause" and paused_view[0]:
                rt.resumed.add(msg)
            elif switched.is_set() and scenario != "pause":
                rt.left.add(msg)  # reached process() after the close: left to the broker
            else:
                rt.acked.add(msg)
                rt.consumer.acknowledge(msg)

    paused_view = [False]  # True once the paused listener is resumed to look inside
    executor = threading.Thread(target=execute, name="execution", daemon=True)
    executor.start()
    try:
        producer = Producer(client, topic, rate, seconds, switched if at == "start" else None)
        producer.start()
        producer.join()
        if not switched.wait(30):
            raise RuntimeError("the runtime's consumer received nothing after --switch-after")
        b = batch[0]
        # Until the batch consumer has been quiet for quiet_s (bounded).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and time.monotonic() - b.last_receive < quiet_s:
            time.sleep(0.1)
        b.stop()
        by_batch = set(b.seen.ids)
        acked = set(rt.acked.ids)
        missing = sorted(set(range(producer.count)) - by_batch - acked)
        held: List[int] = []
        also = 0
        print(f"  switched at the runtime's message {trigger[0]}; the runtime's consumer acked {len(acked):,}, "
              f"left {len(rt.left.ids)} unacked after the switch", flush=True)
        for line in consumer_stats(admin_url, topic):
            print(line.replace("broker:", "broker after the load:"))
        if scenario == "pause":
            paused_view[0] = True
            rt.consumer.resume_message_listener()
            time.sleep(2.0)
            with rt.resumed.lock:
                out = dict(rt.resumed.ids)
            held = sorted(n for n in out if n not in by_batch and n not in acked)
            also = sum(1 for n in out if n in by_batch)
            print(f"  the resumed listener gave {len(out)} messages: {also} the batch consumer also received "
                  f"(handed back), {len(held)} nobody else received (held):")
            for line in _id_lines(held, rt.resumed, switched_ms[0]):
                print(line)
        elif missing:
            for line in _id_lines(missing, rt.left, switched_ms[0]):
                print(line)
        return Outcome(scenario, at, producer.count, len(by_batch), len(acked), missing, held, also)
    finally:
        rt.stopped.set()
        executor.join(timeout=5)
        with contextlib.suppress(Exception):
            rt.consumer.close()  # already closed in close scenarios: harmless
        client.close()


def _id_lines(held: List[int], seen: Seen, switched_ms: int) -> Iterator[str]:
    """Held messages grouped by entry: payloads, message ids, publish time vs the hand-back."""
    by_entry: Dict[str, List[int]] = {}
    for n in held:
        by_entry.setdefault(seen.ids[n].rsplit(":", 1)[0], []).append(n)
    for entry, ns in by_entry.items():
        ids = ", ".join(seen.ids[n] for n in ns[:3]) + (", ..." if len(ns) > 3 else "")
        rel = seen.published[ns[0]] - switched_ms
        yield (f"    entry {entry}: payloads {ns[0]}..{ns[-1]} ({len(ns)}), ids {ids}; published "
               f"{rel:+d} ms {'after' if rel >= 0 else 'before'} the hand-back")


@contextlib.contextmanager
def broker_urls(service_url: Optional[str], admin_url: Optional[str], kind: str) -> Iterator[Tuple[str, Optional[str]]]:
    """(service URL, admin URL or None): the given broker, or one started for the run."""
    if service_url:
        yield service_url, admin_url
        return
    with tempfile.TemporaryDirectory(prefix="repro-runtime-input-") as tmp:
        if kind == "pulsar":
            from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone

            with PulsarStandalone(data_dir=Path(tmp) / "pulsar") as standalone:
                yield standalone.service_url, standalone.admin_url
        else:
            with EmbeddedBroker(data_dir=Path(tmp) / "broker") as broker:
                yield broker.service_url, None


def consumer_stats(admin_url: Optional[str], topic: str) -> List[str]:
    """The subscription's consumers as the broker sees them (admin REST; real Pulsar only)."""
    if not admin_url:
        return []
    path = topic.replace("persistent://", "persistent/")
    try:
        with urllib.request.urlopen(f"{admin_url}/admin/v2/{path}/stats", timeout=10) as resp:
            stats = json.load(resp)
    except (OSError, ValueError) as exc:
        return [f"    (no stats: {exc!r})"]
    return [f"    broker: consumer {c.get('consumerName')}: availablePermits {c.get('availablePermits')}, "
            f"unackedMessages {c.get('unackedMessages')}, msgOutCounter {c.get('msgOutCounter')}"
            for c in stats.get("subscriptions", {}).get(SUBSCRIPTION, {}).get("consumers", [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--service-url", help="A running broker (default: start one, see --broker).")
    ap.add_argument("--admin-url", help="Its admin REST URL, to print the consumers' stats (real Pulsar).")
    ap.add_argument("--broker", choices=("lite", "pulsar"), default="lite",
                    help="Without --service-url: start pulsar-lite or a real Pulsar standalone (runtime/pulsar_standalone.py).")
    ap.add_argument("--rate", type=int, default=2000, help="Messages per second (entries of about rate/100).")
    ap.add_argument("--seconds", type=float, default=4.0, help="Length of the load.")
    ap.add_argument("--switch-after", type=float, default=1.5,
                    help="`mid`: the runtime's consumer is paused or closed this long into the load (s).")
    ap.add_argument("--quiet", type=float, default=2.0, help="The batch consumer idle this long ends a run (s).")
    ap.add_argument("--runs", type=int, default=3, help="Runs of each scenario.")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="Comma-separated, of: " + ", ".join(SCENARIOS))
    ap.add_argument("--at", default="start,mid", help="Comma-separated, of: start (the topic's first message "
                    "switches, then the load), mid (a message --switch-after into the load switches).")
    args = ap.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    ats = [a for a in args.at.split(",") if a]
    if not scenarios or any(s not in SCENARIOS for s in scenarios):
        ap.error(f"--scenarios: choose from {', '.join(SCENARIOS)}")
    if not ats or any(a not in ("start", "mid") for a in ats):
        ap.error("--at: choose from start, mid")
    outcomes: List[Outcome] = []
    with broker_urls(args.service_url, args.admin_url, args.broker) as (url, admin):
        print(f"broker {url}; {args.rate:,} msg/s for {args.seconds:g} s", flush=True)
        for run in range(1, args.runs + 1):
            for at in ats:
                for scenario in scenarios:
                    print(f"run {run} {scenario} at {at}:", flush=True)
                    o = run_scenario(url, admin, scenario, at, args.rate, args.seconds, args.switch_after, args.quiet)
                    outcomes.append(o)
                    print(f"  sent {o.sent:,}; runtime consumer acked {o.by_runtime:,}; batch consumer "
                          f"{o.by_batch:,}; missing {len(o.missing)}"
                          + (f" (payloads {_ranges(o.missing)})" if o.missing else ""), flush=True)
    print("summary (messages never received by the batch consumer nor acked by the runtime's, per run):")
    for at in ats:
        for scenario in scenarios:
            mine = [o for o in outcomes if o.scenario == scenario and o.at == at]
            line = f"  {scenario:10s} at {at:5s}: missing {[len(o.missing) for o in mine]}"
            if scenario == "pause":
                line += f"; held by the paused consumer {[len(o.held) for o in mine]}"
            print(line)


def _ranges(ns: List[int]) -> str:
    """'0..19, 40..59' for sorted numbers."""
    out: List[str] = []
    start = prev = ns[0]
    for n in ns[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}..{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)


if __name__ == "__main__":
    main()
