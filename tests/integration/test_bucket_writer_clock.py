"""The clock (DESIGN §5): after a restart with an idle input, due messages still leave on time.

The release thread lives in the function instance and starts on the first process() call; after
a restart the wake tick the writer keeps unacked provides that call when no scheduling message
arrives (scheduler/wake.py; tests/integration/test_writer_wake.py has the no-operator cases). The control
case shows that something must call process(): with direct intake and the tick topic as the only
input, nothing starts a writer that was never ticked.
"""
from __future__ import annotations

import time

import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import drain
from support.writer import INTAKES, start_writer, writer_spec

pytestmark = pytest.mark.integration


def send_plain_tick(client, spec) -> None:
    """One operator tick on the tick topic."""
    ticks = client.create_producer(spec.user_config["tickTopic"])
    ticks.send(b"tick")
    ticks.close()


def _schedule_then_stop(broker, tmp_path, spec, sched, n: int, lead_ms: int) -> list:
    runner = start_writer(broker, tmp_path, spec)
    client = quiet_client(broker.service_url)
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


def test_control_nothing_leaves_until_process_is_called(broker, tmp_path, unique):
    """Direct intake with the tick topic as the only input and nobody ticking (the layout before
    the scheduling topic became an input): scheduled messages stay until a tick arrives."""
    spec, sched = writer_spec(unique, tmp_path, "direct")
    spec.inputs.remove(sched)
    spec.input_specs.pop(sched)
    # Nobody ticking: not even localrun's start ticks (a convenience of the local runner only).
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path,
                                               start_ticks=False)).start()
    client = quiet_client(broker.service_url)
    try:
        producer = DelayedProducer(client, scheduling_topic=sched)
        producer.send(spec.output, b"new", now_ms())
        idle = drain(client, spec.output, "check", expect=1, timeout=2.0)
        send_plain_tick(client, spec)
        woke = drain(client, spec.output, "check", expect=1, timeout=15)
    finally:
        client.close()
        runner.stop()
    assert idle == []
    assert [m.data() for m in woke] == [b"new"]
