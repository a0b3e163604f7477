"""The writer starts by itself and never multiplies ticks (docs/architecture.md, "Clock").

On the embedded broker, which delivers deliver_after messages at once, with the shipped config
(tickMode hold: no runner ticks): a fresh deployment releases with no operator action; after a
restart with an idle scheduling topic the held wake tick is redelivered and releases are on
time; extra ticks are acked and never re-sent; the retired `chain` mode sends no tick chain.
"""
from __future__ import annotations

import time
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.scheduler.wake import WakeTickHolder
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.helpers import drain
from support.writer import start_writer, writer_spec

pytestmark = pytest.mark.integration


def test_holder_keeps_one_tick_and_acks_the_rest():
    h = WakeTickHolder()
    assert h.on_tick((5, 1, -1, -1)) and h.held == (5, 1, -1, -1)
    assert h.on_tick((5, 1, -1, -1))  # its redelivery (ack timeout) stays held
    assert not h.on_tick((5, 2, -1, -1)) and not h.on_tick((6, 0, -1, -1))
    assert h.held == (5, 1, -1, -1)


def _count_ticks(client, topic: str, sub: str, seconds: float) -> int:
    """Messages published on the tick topic, read on a subscription of its own."""
    c = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    n = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                m = c.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            c.acknowledge(m)
            n += 1
    finally:
        c.close()
    return n


def _lateness(got: List, ats: dict) -> List[int]:
    return sorted(int(m.properties()[RELEASED_AT_PROP]) - ats[m.data()] for m in got)


def test_fresh_deployment_and_idle_restart_release_on_time_with_no_operator_action(broker, tmp_path, unique):
    spec, sched = writer_spec(unique, tmp_path, "direct")
    assert spec.user_config["tickMode"] == "hold"  # the shipped mode: nobody sends ticks
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    runner = start_writer(broker, tmp_path, spec)
    try:
        # 1. Fresh deployment: the first scheduling message starts the function.
        base = now_ms()
        first = {f"a{i}".encode(): base + 300 + 100 * i for i in range(10)}
        for payload, at in first.items():
            dp.send(spec.output, payload, at)
        got = drain(client, spec.output, "check", expect=10, timeout=20)
        assert sorted(m.data() for m in got) == sorted(first)
        assert _lateness(got, first)[0] >= 0
        # 2. Scheduled, durable, then a restart with nothing new on the scheduling topic.
        base = now_ms()
        second = {f"b{i}".encode(): base + 3000 + 100 * i for i in range(10)}
        for payload, at in second.items():
            dp.send(spec.output, payload, at)
        fn = runner.functions()[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and fn.service.engine.pending_count() < 10:
            time.sleep(0.05)
        assert fn.service.engine.pending_count() == 10
    finally:
        runner.stop()
    assert now_ms() < min(second.values()), "test too slow: due before the restart"
    runner = start_writer(broker, tmp_path, spec)
    try:
        got = drain(client, spec.output, "check", expect=10, timeout=20)
        assert sorted(m.data() for m in got) == sorted(second)
        lateness = _lateness(got, second)
        assert lateness[0] >= 0, f"released early: {lateness}"
        # Functional bound, not a benchmark: without a wake-up nothing would leave at all.
        assert lateness[-1] < 2000, f"not on time after an idle restart: lateness ms {lateness}"
        ticks = _count_ticks(client, spec.user_config["tickTopic"], "count", 1.0)
    finally:
        dp.close()
        client.close()
        runner.stop()
    assert ticks == 2, f"one wake tick per start, got {ticks}"  # never a periodic or chained one


@pytest.mark.parametrize("mode", ["hold", "chain"])
def test_extra_ticks_never_multiply_and_no_runaway_without_deliver_after(broker, tmp_path, unique, mode):
    """The embedded broker ignores deliver_after (the old chain sent ~1,000 ticks/s there); five
    extra ticks plus a duplicate must leave the tick count where it was: at most one per start."""
    spec, sched = writer_spec(unique, tmp_path, "direct", tickMode=mode)
    tick_topic = spec.user_config["tickTopic"]
    client = quiet_client(broker.service_url)
    counter = client.subscribe(tick_topic, "count", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest)
    counter.close()  # the subscription now records every tick from here on
    runner = start_writer(broker, tmp_path, spec)
    dp = DelayedProducer(client, scheduling_topic=sched)
    try:
        dp.send(spec.output, b"go", now_ms())  # starts the function (one wake tick)
        assert len(drain(client, spec.output, "check", expect=1, timeout=20)) == 1
        extra = client.create_producer(tick_topic)
        for _ in range(5):
            extra.send(b"tick", properties={"__pl_tick__": "1"})
        extra.close()
        seconds = 2.0  # 10 tick periods of 200 ms
        ticks = _count_ticks(client, tick_topic, "count", seconds)
        held = runner.functions()[0].wake.held
    finally:
        dp.close()
        runner.stop()
    # 1 wake tick + our 5; a chain would add at least one per period, per extra tick.
    assert ticks == 6, f"ticks on the topic: {ticks}"
    assert ticks - 5 <= seconds * 1000 / spec.user_config["tickTimeMillis"]
    assert held is not None
    # The held tick survives the stop: the restarted writer wakes with nothing else arriving.
    runner = start_writer(broker, tmp_path, spec)
    try:
        fn = runner.functions()[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and fn.service is None:
            time.sleep(0.05)
        assert fn.service is not None, "the held tick did not wake the restarted writer"
        assert fn.wake.held == held, "the same tick came back"
        assert _count_ticks(client, tick_topic, "count", 1.0) == 1  # this start's wake tick only
    finally:
        client.close()
        runner.stop()


def test_failed_service_is_rebuilt_with_an_idle_input(broker, tmp_path, unique):
    """A release thread that dies (here: pop_due raises once) leaves a failed service; with no
    message arriving, the tick it sends itself tickTimeMillis later gets it rebuilt."""
    spec, sched = writer_spec(unique, tmp_path, "direct")
    client = quiet_client(broker.service_url)
    dp = DelayedProducer(client, scheduling_topic=sched)
    runner = start_writer(broker, tmp_path, spec)
    try:
        dp.send(spec.output, b"first", now_ms())
        assert len(drain(client, spec.output, "check", expect=1, timeout=20)) == 1
        fn = runner.functions()[0]
        broken = fn.service
        at = now_ms() + 1500
        dp.send(spec.output, b"second", at)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and broken.engine.pending_count() < 1:
            time.sleep(0.02)

        def fail(*_a, **_k):
            raise RuntimeError("injected release failure")
        broken.engine.pop_due = fail
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and broken.healthy:
            time.sleep(0.02)
        assert not broken.healthy
        got = drain(client, spec.output, "check", expect=1, timeout=15)
        assert [m.data() for m in got] == [b"second"]
        assert fn.service is not broken
    finally:
        dp.close()
        client.close()
        runner.stop()
