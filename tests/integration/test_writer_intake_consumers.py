"""The writer's direct intake beside the runtime's own consumer of the scheduling topic
(docs/architecture.md, "Intake"): on the embedded broker, that consumer (receiver queue 1, a
message listener) is paused once the service runs and hands what it prefetched to the direct
consumer, which then receives everything; where the Context has no consumers nothing is paused.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, List, Set

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.runtime_input import RuntimeInput
from pulsar_lifecycle.scheduler.scheduling_consumer import SchedulingConsumer, SchedulingSubscription
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

pytestmark = pytest.mark.integration

NS = "persistent://public/default"


def _entries(client: pulsar.Client, topic: str, n: int, per_entry: int = 1000) -> None:
    """n messages in batch entries of up to `per_entry` messages."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=per_entry,
                                      batching_max_allowed_size_in_bytes=8 << 20,
                                      batching_max_publish_delay_ms=200, block_if_queue_full=True)
    for i in range(n):
        producer.send_async(b"m%d" % i, None, properties={DELIVER_AT_PROP: "1"})
    producer.flush()
    producer.close()


def _take_all(source: SchedulingConsumer, want: Set[bytes], timeout_s: float) -> Set[bytes]:
    got: Set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not want <= got:
        batch = source.take()
        if batch is None:
            continue
        got.update(p.payload for p in batch.items)
        batch.ack()
    return got


def _sub(topic: str, subscription: str) -> SchedulingSubscription:
    return SchedulingSubscription(topic=topic, subscription=subscription, batch_size=500, batch_delay_ms=5,
                                  max_delay_ms=10**9, allowed_target_prefixes=(NS + "/",))


class _Context:
    """What RuntimeInput reads from the runtime's Context: its input consumers by topic."""

    def __init__(self, consumers: Dict[str, pulsar.Consumer]) -> None:
        self.consumers = consumers


def test_paused_runtime_input_hands_its_prefetched_entry_to_the_direct_consumer(broker, unique):
    topic, sub, n = f"{NS}/wic-rt-{unique}", "writer", 3000
    client = quiet_client(broker.service_url)
    client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                     initial_position=pulsar.InitialPosition.Earliest).close()
    _entries(client, topic, n)
    seen: List[bytes] = []
    first = threading.Event()

    def listener(consumer: pulsar.Consumer, msg: pulsar.Message) -> None:  # a slow process(), as the runtime's
        seen.append(msg.data())
        first.set()
        time.sleep(0.05)
        consumer.acknowledge(msg)

    runtime = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1,
                               initial_position=pulsar.InitialPosition.Earliest, message_listener=listener)
    source = None
    try:
        assert first.wait(10), "the runtime's consumer got no message"
        source = SchedulingConsumer(client, _sub(topic, sub), watchdog=False)
        assert RuntimeInput(_Context({topic.replace(NS + "/", ""): runtime}), topic).pause()
        got = _take_all(source, {b"m%d" % i for i in range(n)} - set(seen), timeout_s=15)
        via_runtime = len(seen)
    finally:
        if source is not None:
            source.close()
        runtime.close()
        client.close()
    # Without the pause the runtime's consumer keeps its 1,000-message entry (50 ms each) and the
    # direct one gets a few hundred of the rest in 15 s (pulsar-lite: the holder's deficit).
    assert len(got | set(seen)) == n, f"{n - len(got | set(seen))} of {n} never received"
    assert via_runtime <= 5, f"the paused runtime consumer still handed {via_runtime} messages to process()"


def test_runtime_input_is_not_paused_where_the_context_has_no_consumers():
    ri = RuntimeInput(object(), f"{NS}/t")
    assert ri.pause() is False and ri.paused is False
    ri.hand_back()  # nothing to hand back: no error


def test_close_leaves_every_handed_over_batch_acked_on_the_broker(broker, unique):
    """The acks run on the acker thread and receiving on a thread of its own: close() still acks
    everything the intake handed over before the consumer goes, so nothing comes back."""
    topic, sub, n = f"{NS}/wic-ack-{unique}", "writer", 2000
    client = quiet_client(broker.service_url)
    try:
        client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest).close()
        _entries(client, topic, n)
        source = SchedulingConsumer(client, _sub(topic, sub), watchdog=False)
        try:
            got = _take_all(source, {b"m%d" % i for i in range(n)}, timeout_s=15)
        finally:
            source.close()
        assert len(got) == n
        again = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                                 initial_position=pulsar.InitialPosition.Earliest)
        with pytest.raises(pulsar.Timeout):
            again.receive(timeout_millis=1000)
        again.close()
    finally:
        client.close()
