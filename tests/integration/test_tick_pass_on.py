"""A tick a lost instance held reaches its restarted sibling (scheduler/wake.py, WakeTicks).

Two instances of a writer (or syncer) share the tick subscription, each with a receiver queue of
one, each holding one tick unacked. When one instance dies the broker hands its held tick to the
survivor, which already holds one: dropped there (acked), the lost instance's restarted copy,
subscribing later (a worker starts it again after its rescheduleTimeoutMs), would never get the
one message that calls its process() and would never start (seen on a two-worker Pulsar cluster:
the moved writer instance stayed idle). Here the survivor passes the extra tick on, and the
late sibling receives one.
"""
from __future__ import annotations

import time
from typing import List, Optional

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.wake import WakeTicks, position_of

pytestmark = pytest.mark.integration


def _survivor_round(consumer: pulsar.Consumer, wake: WakeTicks, client: pulsar.Client, topic: str,
                    instances: int, held: List[pulsar.Message]) -> None:
    """One receive of the surviving instance, handled as the writer's process() does."""
    try:
        msg = consumer.receive(timeout_millis=100)
    except pulsar.Timeout:
        return
    if wake.on_tick(position_of(msg.message_id()), msg.properties(), lambda m=msg: consumer.acknowledge(m),
                    client=client, tick_topic=topic, delay_ms=200, instances=instances):
        held.append(msg)


def _sibling_gets_a_tick(broker, unique: str, instances: int, wait_s: float) -> Optional[pulsar.Message]:
    topic = f"persistent://public/default/ticks-pass-{unique}-{instances}"
    sub = "writer"
    client = quiet_client(broker.service_url)
    try:
        def consumer() -> pulsar.Consumer:
            return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1,
                                    initial_position=pulsar.InitialPosition.Earliest)

        survivor = consumer()
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"tick")  # the survivor's own
        producer.send(b"tick")  # the one the lost sibling held, now redelivered to the survivor
        wake, held = WakeTicks(), []
        deadline = time.monotonic() + 10
        while len(held) < 1 and time.monotonic() < deadline:
            _survivor_round(survivor, wake, client, topic, instances, held)
        for _ in range(10):  # the extra one arrives and is handled before the sibling is back
            _survivor_round(survivor, wake, client, topic, instances, held)
        restarted = consumer()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _survivor_round(survivor, wake, client, topic, instances, held)
            try:
                return restarted.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
        return None
    finally:
        try:
            client.close()
        except pulsar.AlreadyClosed:  # pulsar-lite closed a producer under the client: nothing to close
            pass


def test_a_survivor_passes_a_lost_siblings_tick_on_to_its_restart(broker, unique: str) -> None:
    got = _sibling_gets_a_tick(broker, unique, instances=2, wait_s=20)
    assert got is not None, "the restarted sibling never received a tick: it would never start"


def test_a_single_instance_acks_extra_ticks_at_once(broker, unique: str) -> None:
    """parallelism 1: no sibling, so nothing is passed on (the extra tick is acked, not re-sent)."""
    assert _sibling_gets_a_tick(broker, unique, instances=1, wait_s=3) is None
