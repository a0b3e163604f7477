"""The clock (DESIGN §5): after a restart with an idle input, due messages still leave on time.

The release thread lives in the function instance and starts on the first process() call; the
local runner's ticks on `tickTopic` provide that call when no scheduling message arrives. The
control case shows the ticks are what makes it work.
"""
from __future__ import annotations

import time

import pytest

from helpers import drain
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from test_bucket_writer import INTAKES, start_writer, writer_spec

pytestmark = pytest.mark.integration


def send_plain_tick(client, spec) -> None:
    """One tick without __pl_tick__, so tickMode chain does not schedule a next one."""
    ticks = client.create_producer(spec.user_config["tickTopic"])
    ticks.send(b"tick")
    ticks.close()


def _schedule_then_stop(broker, tmp_path, spec, sched, n: int, lead_ms: int) -> list:
    runner = start_writer(broker, tmp_path, spec)
    client = quiet_client(broker.service_url)
    if spec.user_config.get("schedulingTopic") and spec.user_config.get("tickMode") == "chain":
        send_plain_tick(client, spec)  # no runner ticks: start the function (without a chain)
    dp = DelayedProducer(client, scheduling_topic=sched)
    base = now_ms() + lead_ms
    ats = [base + 100 * i for i in range(n)]
    try:
        for i, at in enumerate(ats):
            dp.send(spec.output, f"t{i}".encode(), at)
        # Wait until the function made them durable (acked), then stop before any is due.
        fn = runner.functions()[0]

        def pending() -> int:
            return fn.service.engine.pending_count() if fn.service is not None else 0

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and pending() < n:
            time.sleep(0.05)
        assert pending() == n
    finally:
        dp.close()
        client.close()
        runner.stop()
    assert now_ms() < ats[0], "test too slow: messages became due before the restart"
    return ats


@pytest.mark.parametrize("intake", INTAKES)
def test_restart_with_idle_input_releases_on_time(broker, tmp_path, unique, intake):
    spec, sched = writer_spec(unique, tmp_path, intake)
    n = 10
    ats = _schedule_then_stop(broker, tmp_path, spec, sched, n, lead_ms=3000)
    runner = start_writer(broker, tmp_path, spec)  # nothing new on the scheduling topic
    client = quiet_client(broker.service_url)
    try:
        got = drain(client, spec.output, "check", expect=n, timeout=20)
    finally:
        client.close()
        runner.stop()
    assert sorted(m.data() for m in got) == sorted(f"t{i}".encode() for i in range(n))
    lateness = sorted(int(m.properties()[RELEASED_AT_PROP]) - ats[int(m.data()[1:])] for m in got)
    assert lateness[0] >= 0, f"released early: {lateness}"
    # A functional bound, not a benchmark: a clock that did not fire would be late by the
    # whole wait (or never release); the tick period here is 200 ms.
    assert lateness[-1] < 2000, f"not on time after an idle restart: lateness ms {lateness}"


@pytest.mark.parametrize("intake", INTAKES)
def test_control_without_ticks_nothing_leaves_until_process_is_called(broker, tmp_path, unique, intake):
    """No runner ticks (tickMode chain). Runtime intake: a scheduling message calls process() and
    starts the function. Direct intake: the tick topic is the only input, so a scheduling message
    starts nothing and the first tick does (on real Pulsar the operator sends it once -
    docs/operations.md)."""
    spec, sched = writer_spec(unique, tmp_path, intake, tickMode="chain")
    n = 5
    ats = _schedule_then_stop(broker, tmp_path, spec, sched, n, lead_ms=2000)
    runner = start_writer(broker, tmp_path, spec)
    client = quiet_client(broker.service_url)
    try:
        wait_s = max((ats[-1] - now_ms()) / 1000 + 1.5, 1.0)
        producer = DelayedProducer(client, scheduling_topic=sched)
        if intake == "runtime":
            idle = drain(client, spec.output, "check", expect=n, timeout=wait_s)
            producer.send(spec.output, b"wake", now_ms())
        else:
            producer.send(spec.output, b"new", now_ms())
            idle = drain(client, spec.output, "check", expect=n + 1, timeout=wait_s)
            send_plain_tick(client, spec)
        woke = drain(client, spec.output, "check", expect=n + 1, timeout=15)
    finally:
        client.close()
        runner.stop()
    assert idle == []
    assert len(woke) == n + 1
