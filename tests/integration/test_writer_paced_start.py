"""The shipped writer config started while a paced producer sends (docs/architecture.md, "Runtime input").

Direct intake with the scheduling topic also a runtime input (receiver queue 1, same
subscription): the first scheduling message starts the writer, whose service then takes the
runtime's consumer of the topic out of the way. A paced, batching producer sends steadily, each
message due `LEAD_MS` after it is sent; the writer must release every message exactly once and
never before its deliver-at, with nothing restarted (a restart would release what a consumer that
no longer reads still holds, and hide the loss).

- `first-message`: the topic's first message starts the writer, the steady load follows once it
  released that message (a fresh deployment, or the lateness benchmark's warm-up). A paused runtime consumer kept
  the permit it granted for that message, and the load's next batch entry could go to it after
  the hand-back, where nothing released it.
- `under-load`: the load runs from before the start, through it and after it.

Counted by payload id; waits are bounded.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.writer import start_writer, writer_spec

pytestmark = pytest.mark.integration

RATE = 1500  # msg/s
SECONDS = 4.0  # length of the steady load
LEAD_MS = 2500  # each message is due this long after it is sent
CLOCK_GRANULARITY_MS = 1  # ms timestamps of one clock, read at different moments


@dataclass
class Released:
    """What reached the output topic, by payload id."""

    count: Dict[int, int] = field(default_factory=dict)
    early: List[str] = field(default_factory=list)

    def add(self, msg: pulsar.Message, arrival_ms: int) -> None:
        n = int(msg.data())
        self.count[n] = self.count.get(n, 0) + 1
        props = msg.properties()
        deliver_at, released_at = int(props[DELIVER_AT_PROP]), int(props[RELEASED_AT_PROP])
        if released_at < deliver_at or arrival_ms < deliver_at - CLOCK_GRANULARITY_MS:
            self.early.append(f"{n}: deliver-at {deliver_at}, released-at {released_at}, arrival {arrival_ms}")


class PacedLoad(threading.Thread):
    """Payloads 0..n-1 through a DelayedProducer (batching on), `RATE` per second, each due
    `LEAD_MS` after it is sent. With `first_alone`, payload 0 goes alone, due at once, and the
    rest once `go` is set."""

    def __init__(self, client: pulsar.Client, sched: str, output: str, first_alone: bool) -> None:
        super().__init__(name="paced-load", daemon=True)
        self.producer = DelayedProducer(client, scheduling_topic=sched)
        self.output, self.first_alone = output, first_alone
        self.n = 1 + int(RATE * SECONDS)
        self.go = threading.Event()
        self.failed: List[int] = []
        self.error: Optional[BaseException] = None

    def _send(self, i: int) -> None:
        self.producer.send_async(self.output, str(i).encode(), now_ms() + LEAD_MS,
                                 lambda res, _mid, i=i: res == pulsar.Result.Ok or self.failed.append(i))

    def run(self) -> None:
        try:
            first = 0
            if self.first_alone:
                self.producer.send(self.output, b"0", now_ms())  # due at once: its release says the writer runs
                if not self.go.wait(60):
                    raise TimeoutError("the writer released nothing of the first message")
                first = 1
            start = time.monotonic()
            for i in range(first, self.n):
                delay = start + (i - first) / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._send(i)
            self.producer.flush()
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def _service(runner):
    fn = runner.functions()[0]
    return getattr(fn, "service", None) if fn is not None else None


@pytest.mark.parametrize("start", ["first-message", "under-load"])
def test_every_message_released_once_never_early_when_the_writer_starts_under_a_paced_load(
        broker, tmp_path, unique, start):
    spec, sched = writer_spec(unique, tmp_path)  # the shipped config: the scheduling topic is an input too
    client = quiet_client(broker.service_url)
    out = client.subscribe(spec.output, "check", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    runner = start_writer(broker, tmp_path, spec)
    load = PacedLoad(client, sched, spec.output, first_alone=start == "first-message")
    released = Released()
    service = None
    try:
        load.start()
        if start == "under-load":
            load.go.set()
        # Until every payload arrived, then a quiet second for late duplicates; bounded.
        deadline = time.monotonic() + LEAD_MS / 1000 + SECONDS + 60
        quiet_until = None
        while time.monotonic() < deadline:
            service = service or _service(runner)
            if quiet_until is None and len(released.count) == load.n:
                quiet_until = time.monotonic() + 1.0
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            try:
                msg = out.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            released.add(msg, now_ms())
            out.acknowledge(msg)
            load.go.set()  # first-message: the writer runs (it released payload 0), the load starts
        load.join(timeout=30)
        same_service = service is not None and _service(runner) is service and service.healthy
    finally:
        load.producer.close()
        runner.stop()
        out.close()
        client.close()
    assert load.error is None and not load.failed, f"the load failed: {load.error!r}, {len(load.failed)} sends"
    missing = sorted(set(range(load.n)) - set(released.count))
    twice = sorted(n for n, c in released.count.items() if c > 1)
    assert not missing, f"{len(missing)} of {load.n} never released: {missing[:40]}"
    assert not twice, f"{len(twice)} released more than once: {twice[:40]}"
    assert not released.early, f"{len(released.early)} released early: {released.early[:5]}"
    assert same_service, "the writer's service was rebuilt during the run"
