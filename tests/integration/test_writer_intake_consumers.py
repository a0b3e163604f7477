"""The writer's direct intake beside the runtime's own consumer of the scheduling topic
(docs/architecture.md, "Runtime input"): on the embedded broker, that consumer (receiver queue 1,
a message listener) is closed before the direct consumer subscribes, and the direct consumer then
receives everything, what the closed one held included; closing an already closed one is
harmless; where the Context has no consumers the input stays open; the service closes it only
after a successful recovery.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Set, cast

import pulsar
import pytest

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.config import parse_writer_config
from pulsar_lifecycle.scheduler.runtime_input import RuntimeInput
from pulsar_lifecycle.scheduler.scheduling_consumer import SchedulingConsumer, SchedulingSubscription
from pulsar_lifecycle.scheduler.service import SchedulerService
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
        adds, others = batch.split()
        got.update(m.payload for m in adds)
        got.update(p.payload for p in others)
        batch.ack()
    return got


def _sub(topic: str, subscription: str) -> SchedulingSubscription:
    return SchedulingSubscription(topic=topic, subscription=subscription, batch_size=500, batch_delay_ms=5,
                                  max_delay_ms=10**9, allowed_target_prefixes=(NS + "/",))


class _Context:
    """What RuntimeInput reads from the runtime's Context: its input consumers by topic."""

    def __init__(self, consumers: Dict[str, pulsar.Consumer]) -> None:
        self.consumers = consumers


def test_closed_runtime_input_leaves_everything_it_held_to_the_direct_consumer(broker, unique):
    topic, sub, n = f"{NS}/wic-rt-{unique}", "writer", 3000
    client = quiet_client(broker.service_url)
    client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                     initial_position=pulsar.InitialPosition.Earliest).close()
    _entries(client, topic, n)
    seen: List[bytes] = []
    first = threading.Event()

    def listener(consumer: pulsar.Consumer, msg: pulsar.Message) -> None:  # a slow process() under MANUAL: no ack
        seen.append(msg.data())
        first.set()
        time.sleep(0.05)

    runtime = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1,
                               initial_position=pulsar.InitialPosition.Earliest, message_listener=listener)
    source = None
    try:
        assert first.wait(10), "the runtime's consumer got no message"
        # As SchedulerService.start: close the runtime's input, then subscribe the direct consumer.
        ri = RuntimeInput(_Context({topic.replace(NS + "/", ""): runtime}), topic)
        assert ri.close() and ri.closed
        source = SchedulingConsumer(client, _sub(topic, sub), watchdog=False)
        got = _take_all(source, {b"m%d" % i for i in range(n)}, timeout_s=15)
        via_runtime = len(seen)
    finally:
        if source is not None:
            source.close()
        client.close()
    # Every message, those the runtime's listener saw (never acked) and the rest of the entry it
    # held included, reaches the direct consumer; the closed one takes no more.
    assert len(got) == n, f"{n - len(got)} of {n} never reached the direct consumer"
    assert via_runtime <= 5, f"the closed runtime consumer still handed {via_runtime} messages to its listener"


def test_closing_an_already_closed_runtime_input_is_harmless(broker, unique):
    """A service rebuilt in the same instance finds the input its predecessor closed."""
    topic = f"{NS}/wic-again-{unique}"
    client = quiet_client(broker.service_url)
    try:
        runtime = client.subscribe(topic, "writer", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1,
                                   message_listener=lambda consumer, msg: None)
        context = _Context({topic: runtime})
        assert RuntimeInput(context, topic).close()
        again = RuntimeInput(context, topic)
        assert again.close() and again.closed
    finally:
        client.close()


def test_runtime_input_stays_open_where_the_context_has_no_consumers():
    ri = RuntimeInput(object(), f"{NS}/t")
    assert ri.close() is False and ri.closed is False
    assert ri.close() is False  # given up once: not tried (nor logged) again


class _Input:
    """A RuntimeInput stand-in that records when it is closed."""

    def __init__(self, events: List[str]) -> None:
        self.events = events
        self.closed = False

    def close(self) -> bool:
        self.events.append("close")
        self.closed = True
        return True


class _Engine:
    def __init__(self, events: List[str], fail: bool) -> None:
        self.events, self.fail = events, fail

    def recover(self) -> str:
        self.events.append("recover")
        if self.fail:
            raise OSError("snapshot storage unavailable")
        return "ok"


def _service(events: List[str], fail_recovery: bool = False, fail_subscribe: bool = False) -> SchedulerService:
    def source() -> Any:
        events.append("subscribe")
        if fail_subscribe:
            raise pulsar.Timeout("subscribe timed out")
        raise AssertionError("the test ends the start here")

    cfg = parse_writer_config({"schedulingTopic": f"{NS}/s", "tickTopic": f"{NS}/ticks"}, topic=f"{NS}/s", cursor="c")
    svc = SchedulerService(_Engine(events, fail_recovery), cast(Any, None), cfg, f"{NS}/out", f"{NS}/s-INVALID",
                           None, lambda name, value: None, source_factory=source, runtime_input=_Input(events))
    svc.on_failure = lambda: events.append("wake")
    return svc


def test_the_service_closes_the_runtime_input_after_recovery_and_before_the_direct_consumer_subscribes():
    events: List[str] = []
    with pytest.raises(AssertionError, match="ends the start"):
        _service(events).start()
    assert events[:3] == ["recover", "close", "subscribe"]


def test_a_failed_recovery_leaves_the_runtime_input_open():
    """The runtime then redelivers the message that started the writer and process() builds again."""
    events: List[str] = []
    svc = _service(events, fail_recovery=True)
    with pytest.raises(OSError):
        svc.start()
    assert events == ["recover"] and not svc.runtime_input_closed


def test_a_start_failing_after_the_close_wakes_the_writer_with_a_tick():
    """Nothing redelivers the starting message to process() once the input is closed: on_failure
    (a wake tick after tickTimeMillis) has process() build again."""
    events: List[str] = []
    svc = _service(events, fail_subscribe=True)
    with pytest.raises(pulsar.Timeout):
        svc.start()
    assert events == ["recover", "close", "subscribe", "wake"] and svc.runtime_input_closed


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
