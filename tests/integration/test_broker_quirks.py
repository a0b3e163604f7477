"""The pulsar-lite quirks the package works around, checked on both brokers.

Each test makes one quirk happen the way the code that works around it expects, on pulsar-lite
and on real Apache Pulsar, and asserts what each broker does; where the workaround's own code
can run, it asserts whether it fired. docs/operations.md, "Tested brokers", lists each
workaround with its test here and its fate. Counts and behaviour are asserted, never times:
every wait is a bound, and what only one broker shows (or shows only sometimes) is recorded with
`record_property` instead of asserted.
"""
from __future__ import annotations

import datetime
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import pulsar
import pyarrow.parquet as pq
import pytest
from pulsar.schema import AvroSchema, Integer, Record, String

from pulsar_lifecycle.config.function_config import spec_from_config
from pulsar_lifecycle.dedup import recovery
from pulsar_lifecycle.pulsar_io import stall_watchdog as sw
from pulsar_lifecycle.pulsar_io.subscribe import skip_consumer_ids
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduler.wake import WakeTickHolder, position_of
from pulsar_lifecycle.spark.export.driver import export_backlog, part_files
from support.broker_fixtures import kind_of

pytestmark = pytest.mark.integration

NS = "persistent://public/default"
IDLE_MS = 3000  # a receive that gets nothing for this long counts as idle

# A child process that subscribes, receives `take` messages of each topic (unacked) and waits to
# be SIGKILLed: a crashed consumer holding what it received and prefetched.
HOLDER = """
import sys, time, pulsar
url, sub, queue, take = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = pulsar.Client(url, logger=pulsar.FileLogger(pulsar.LoggerLevel.Error, "/dev/stderr"))
consumers = [client.subscribe(t, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=queue,
                              initial_position=pulsar.InitialPosition.Earliest) for t in sys.argv[5:]]
held = 0
for c in consumers:
    for _ in range(take):
        c.receive(10000)
        held += 1
print("HOLDING", held, flush=True)
time.sleep(600)
"""


def _short_client(url: str, timeout_s: int = 5) -> pulsar.Client:
    """A client whose operations give up after `timeout_s` (a refused subscribe on pulsar-lite
    is a timeout, not an error)."""
    return pulsar.Client(url, operation_timeout_seconds=timeout_s,
                         logger=pulsar.FileLogger(pulsar.LoggerLevel.Error, "/dev/stderr"))


def _shared(client: pulsar.Client, topic: str, sub: str, queue: int = 1000) -> pulsar.Consumer:
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=queue,
                            initial_position=pulsar.InitialPosition.Earliest)


def _publish(client: pulsar.Client, topic: str, n: int, per_entry: int, prefix: str = "m") -> None:
    """`n` messages in entries of `per_entry` (one batch each), every send confirmed."""
    producer = client.create_producer(topic, batching_enabled=per_entry > 1, batching_max_messages=max(2, per_entry),
                                      batching_max_publish_delay_ms=1000, max_pending_messages=max(n, 1),
                                      block_if_queue_full=True)
    failed: List[pulsar.Result] = []
    try:
        for start in range(0, n, per_entry):
            for i in range(start, min(n, start + per_entry)):
                producer.send_async(f"{prefix}{i}".encode(),
                                    lambda res, _mid: failed.append(res) if res != pulsar.Result.Ok else None)
            producer.flush()  # one entry per flush
    finally:
        producer.close()
    assert not failed, f"{len(failed)} sends failed: {failed[:3]}"


def _drain(consumer: pulsar.Consumer, want: int, idle_ms: int = IDLE_MS, bound_s: float = 60.0) -> int:
    """Receive and ack until `want` messages, nothing for `idle_ms`, or `bound_s`; the count."""
    got = 0
    deadline = time.monotonic() + bound_s
    while got < want and time.monotonic() < deadline:
        try:
            msg = consumer.receive(timeout_millis=idle_ms)
        except pulsar.Timeout:
            break
        consumer.acknowledge(msg)
        got += 1
    return got


def _note(record_property: Callable[[str, object], None], **values: object) -> None:
    """Keep what a test observed but does not assert (`-rA` shows it; junit keeps it too)."""
    for name, value in values.items():
        record_property(name, value)
    print(" ".join(f"{k}={v}" for k, v in values.items()))


def _burn_consumer_id(client: pulsar.Client, unique: str) -> None:
    """Take consumer id 0 of `client` on a topic of its own: a client's consumer ids count from 0
    like the holder's, and pulsar-lite refuses a second consumer 0 on one subscription
    (test_a_second_clients_consumer_on_one_shared_subscription), which is not what these tests check."""
    client.subscribe(f"{NS}/quirk-burn-{unique}", "burn")


def _hold_and_kill(url: str, sub: str, queue: int, take: int, topics: List[str]) -> int:
    """Run HOLDER on `topics`, SIGKILL it once it holds its messages; what it had received."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, sub, str(queue), str(take), *topics],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["HOLDING"], f"holder did not start: {line}"
        return int(line[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture
def fast_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall watchdog checks at every idle receive (its waits are what a test must not wait for)."""
    monkeypatch.setattr(sw, "BLIND_WAIT_S", 0.0)
    monkeypatch.setattr(sw, "STALL_CHECK_S", 0.0)


def _watched_drain(consumer: pulsar.Consumer, dog: sw.StallWatchdog, want: int, check: bool = True,
                   bound_s: float = 60.0) -> Tuple[pulsar.Consumer, int]:
    """The forwarders' and the direct intake's loop: receive, ack, and at each idle receive (nothing
    held, nothing unacked) let the watchdog replace the consumer; without `check` the first idle
    receive ends it. (consumer now, messages received)."""
    got = 0
    deadline = time.monotonic() + bound_s
    while got < want and time.monotonic() < deadline:
        try:
            msg = consumer.receive(timeout_millis=IDLE_MS)
        except pulsar.Timeout:
            if not check:
                break
            consumer = dog.check(consumer) or consumer
            continue
        mid = msg.message_id()
        dog.seen(mid.ledger_id(), mid.entry_id())
        dog.flowing()
        consumer.acknowledge(msg)
        got += 1
    return consumer, got


# -- the permit deficit of a killed consumer (stall watchdog, batch cap, export-backlog) ------------

def test_a_killed_consumers_large_entry_and_the_stall_watchdog(broker, unique, fast_watchdog, record_property):
    """pulsar-lite dispatches a batch entry whole against a consumer's permits and keeps a killed
    consumer's negative balance in the subscription's total: a consumer with a queue of 1 that took
    one message of a 600-message entry leaves a deficit of 599, and its successor (queue 200) gets
    nothing until the watchdog re-subscribes it with a larger queue. Real Pulsar drops the dead
    consumer with its permits: the successor gets everything and the watchdog never fires."""
    topic = f"{NS}/quirk-deficit-{unique}"
    client = quiet_client(broker.service_url)
    try:
        _publish(client, topic, 600, per_entry=600)
        assert _hold_and_kill(broker.service_url, "s", 1, 1, [topic]) == 1
        _burn_consumer_id(client, unique)
        consumer = _shared(client, topic, "s", queue=200)
        dog = sw.StallWatchdog(topic, lambda q: _shared(client, topic, "s", q), 200)
        # The successor alone until it is idle, then with the watchdog's checks.
        consumer, before = _watched_drain(consumer, dog, 600, check=False)
        consumer, after = _watched_drain(consumer, dog, 600 - before)
        drained_check = dog.check(consumer)  # idle with everything received: nothing to do
        consumer.close()
    finally:
        client.close()
    _note(record_property, received_before_watchdog=before, resubscribed=dog.resubscribed)
    assert before + after == 600 and drained_check is None
    if kind_of(broker) == "lite":
        assert before == 0 and dog.resubscribed >= 1  # the deficit is real; re-subscribing ends it
    else:
        assert before == 600 and dog.resubscribed == 0  # no deficit; the watchdog is a no-op


def test_watchdog_blind_resubscriptions_on_a_topic_whose_messages_were_all_acked(broker, unique, fast_watchdog):
    """A consumer that has received nothing since its start cannot tell a stall from a topic whose
    last message was acked before it started: the watchdog re-subscribes it blind, at most
    BLIND_RESUBSCRIBES times, on either broker (the cost of the workaround on real Pulsar)."""
    topic = f"{NS}/quirk-blind-{unique}"
    client = quiet_client(broker.service_url)
    try:
        _publish(client, topic, 50, per_entry=10)
        first = _shared(client, topic, "s", queue=200)
        assert _drain(first, 50) == 50
        first.close()
        consumer = _shared(client, topic, "s", queue=200)
        dog = sw.StallWatchdog(topic, lambda q: _shared(client, topic, "s", q), 200)
        received = 0
        for _ in range(sw.BLIND_RESUBSCRIBES + 3):
            try:
                consumer.acknowledge(consumer.receive(timeout_millis=500))
                received += 1
            except pulsar.Timeout:
                consumer = dog.check(consumer) or consumer
        consumer.close()
    finally:
        client.close()
    assert received == 0
    assert dog.resubscribed == sw.BLIND_RESUBSCRIBES  # on both brokers: nothing distinguishes them


def test_a_consumer_connected_before_a_kill_gets_the_killed_consumers_messages(broker, unique, record_property):
    """Messages a SIGKILLed consumer held go back to the subscription when the broker drops it.
    Both brokers hand them to a consumer that is already connected: a freshly subscribed consumer
    finds nothing (why export-backlog drains with one consumer, without a second pass)."""
    topic = f"{NS}/quirk-redeliver-{unique}"
    client = quiet_client(broker.service_url)
    later = _short_client(broker.service_url, 30)
    try:
        _publish(client, topic, 20, per_entry=1)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.service_url, "s", "10", "5", topic],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().startswith("HOLDING")
            _burn_consumer_id(client, unique)
            connected = _shared(client, topic, "s")
            before_kill = _drain(connected, 20)
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
        after_kill = _drain(connected, 20 - before_kill, idle_ms=8000)
        connected.close()
        fresh = _drain(_shared(later, topic, "s"), 20)
    finally:
        later.close()
        client.close()
    _note(record_property, connected_before_kill=before_kill, connected_after_kill=after_kill, fresh_consumer=fresh)
    assert before_kill + after_kill == 20 and fresh == 0


def test_export_gets_a_killed_consumers_messages_in_its_one_pass(broker, unique, tmp_path: Path):
    """A consumer killed while export-backlog drains (it holds an entry of 300 with a queue of 1):
    its messages come back to the export's consumer, which is already connected, on both brokers,
    so the export's single pass ends with every message."""
    topic = f"{NS}/quirk-export-{unique}"
    client = quiet_client(broker.service_url)
    try:
        _publish(client, topic, 300, per_entry=300)  # the entry the holder takes (300 > its queue)
        _publish(client, topic, 500, per_entry=100, prefix="r")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.service_url, "sub", "1", "1", topic],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        killed: List[bool] = []

        def kill_holder(_rows: int) -> None:
            if not killed:  # after the first durable batch: the export's consumer is connected
                holder.send_signal(signal.SIGKILL)
                holder.wait(timeout=30)
                killed.append(True)

        try:
            assert holder.stdout is not None and holder.stdout.readline().startswith("HOLDING")
            _burn_consumer_id(client, unique)
            report = export_backlog(client, [topic], "sub", tmp_path / "out", batch_rows=100, idle_ms=IDLE_MS,
                                    on_batch=kill_holder)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(timeout=30)
    finally:
        client.close()
    assert killed and report.rows_written == 800



def test_a_resumed_export_reads_what_a_reset_exporters_consumer_holds(broker, unique, tmp_path: Path, record_property):
    """An export resumed after its predecessor's connection ended with a reset (stopped while the
    broker pushed into its socket, then SIGKILLed): pulsar-lite keeps that consumer with what it
    held, so the resumed export's consumer gets none of it and its Reader pass above the files'
    floor exports it (unacked); Apache Pulsar redelivers it to the consumer. Either way the
    directory ends with every message once."""
    topic = f"{NS}/quirk-export-reset-{unique}"
    out = tmp_path / "out"
    client = _short_client(broker.service_url)
    try:
        _publish(client, topic, 100, per_entry=100)
        first = export_backlog(client, [topic], "S", out, batch_rows=100, idle_ms=1500)
        assert first.rows_written == 100
        _publish(client, topic, 1100, per_entry=100, prefix="n")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.service_url, "S", "2000", "1", topic],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().startswith("HOLDING")
            holder.send_signal(signal.SIGSTOP)
            _publish(client, topic, 100, per_entry=100, prefix="late")  # pushed into the stopped socket
            time.sleep(0.5)
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
        resumed = export_backlog(client, [topic], "S", out, batch_rows=500, idle_ms=1500)
    finally:
        client.close()
    payloads = [p for f in part_files(out) for p in pq.read_table(f, columns=["payload"]).column(0).to_pylist()]
    _note(record_property, held_exported=resumed.held_exported, resumed_rows=resumed.rows_written)
    assert len(payloads) == len(set(payloads)) == 1300
    assert resumed.rows_written == 1200
    if kind_of(broker) == "pulsar":
        assert resumed.held_exported == 0  # redelivered to the export's consumer


# -- consumer ids after a kill, and a second client on one subscription ------------------------------

def test_consumers_of_a_killed_process_on_many_topics(broker, unique, record_property):
    """A process with one consumer on each of 10 topics is SIGKILLed; a new client subscribes the
    same subscriptions with the same consumer ids (0..9). pulsar-lite sometimes refuses them while
    it still holds the dead connection's consumers ("Consumer N already exists": the subscribe
    times out) and may keep what they prefetched (test_a_reset_connections_consumers_stay_registered). The
    runtime's subscribe retry and the syncer's rotated subscribe order exist for that. Real
    Pulsar accepts every subscribe at once and redelivers everything."""
    n_topics, per_topic = 10, 300
    topics = [f"{NS}/quirk-kill-{unique}-{k}" for k in range(n_topics)]
    setup = quiet_client(broker.service_url)
    try:
        for t in topics:
            _publish(setup, t, per_topic, per_entry=100)
    finally:
        setup.close()
    assert _hold_and_kill(broker.service_url, "S", 200, 1, topics) == n_topics
    client = _short_client(broker.service_url)
    refused, got = 0, 0
    try:
        consumers = []
        for t in topics:
            for _attempt in range(4):  # as FunctionInstance._subscribe_with_retry
                try:
                    consumers.append(_shared(client, t, "S", queue=200))
                    break
                except pulsar.PulsarException:
                    refused += 1
        deadline = time.monotonic() + 20
        while got < n_topics * per_topic and time.monotonic() < deadline:
            progress = False
            for c in consumers:
                try:
                    while True:
                        c.acknowledge(c.receive(timeout_millis=50))
                        got += 1
                        progress = True
                except pulsar.Timeout:
                    pass
            if not progress:
                time.sleep(0.2)
    finally:
        client.close()
    _note(record_property, refused_subscribes=refused, received=got)
    if kind_of(broker) == "pulsar":
        assert refused == 0 and got == n_topics * per_topic


def test_a_reset_connections_consumers_stay_registered(broker, unique, record_property):
    """A process holding messages on a Shared subscription is stopped while the broker pushes more
    into its socket, then SIGKILLed: its connection ends with a reset. pulsar-lite keeps that
    connection's consumer registered, with everything dispatched to it: a new client's consumer
    with the same id (0) is refused (the subscribe times out), one with another id is accepted
    but never gets the held messages, not even after a seek; a Reader reads them all. The writer's
    consumer-id skip, prompt subscribe retry and gap reads (subscribe.py,
    scheduler/intake_gaps.py) exist for that. Real Pulsar drops the consumer and redelivers."""
    topic = f"{NS}/quirk-reset-{unique}"
    client = _short_client(broker.service_url)
    try:
        _publish(client, topic, 100, per_entry=100)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.service_url, "S", "2000", "1", topic],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().startswith("HOLDING")
            # Stopped with permits left: the broker pushes the next entries into its socket, unread.
            holder.send_signal(signal.SIGSTOP)
            _publish(client, topic, 1100, per_entry=100, prefix="n")
            time.sleep(0.5)
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
        fresh = _short_client(broker.service_url)
        try:
            try:
                _shared(fresh, topic, "S", queue=2000).close()  # consumer id 0, as the holder's
                refused = False
            except pulsar.PulsarException:
                refused = True
            consumer = _shared(fresh, topic, "S", queue=2000)  # a new id
            got = _drain(consumer, 1200, idle_ms=1500)
            if got < 1200:
                consumer.seek(pulsar.MessageId(-1, 0, 0, -1) if kind_of(broker) == "lite" else pulsar.MessageId.earliest)
                got += _drain(consumer, 1200 - got, idle_ms=1500)
            consumer.close()
            reader = fresh.create_reader(topic, pulsar.MessageId.earliest)
            read = 0
            try:
                while read < 1200:
                    reader.read_next(timeout_millis=IDLE_MS)
                    read += 1
            except pulsar.Timeout:
                pass
            reader.close()
        finally:
            fresh.close()
    finally:
        client.close()
    _note(record_property, refused_same_id=refused, received=got, read_by_reader=read)
    assert read == 1200
    if kind_of(broker) == "pulsar":
        assert not refused and got == 1200
    elif refused:  # the reset left the consumer registered (the usual outcome of a stopped holder)
        assert got < 1200


def test_skip_consumer_ids_makes_and_closes_that_many_consumers(broker, unique):
    """localrun's consumer-id skip (subscribe.py) on the real broker: every consumer it makes is
    accepted and closed again, and the client still subscribes normally afterwards."""
    client = _short_client(broker.service_url)
    try:
        assert skip_consumer_ids(client, 50, f"non-persistent://public/default/ids-{unique}") == 50
        assert skip_consumer_ids(client, 0, f"non-persistent://public/default/ids-{unique}") == 0
        topic = f"{NS}/quirk-skip-{unique}"
        _publish(client, topic, 10, per_entry=10)
        consumer = _shared(client, topic, "S", queue=100)
        assert _drain(consumer, 10, idle_ms=1500) == 10
        consumer.close()
    finally:
        client.close()


def test_a_second_clients_consumer_on_one_shared_subscription(broker, unique):
    """pulsar-lite keys a subscription's consumers by the consumer id the client picks (a per-client
    counter from 0): a second client's consumer 0 on a Shared subscription another client's
    consumer 0 holds is refused (the subscribe times out). Why `localrun --parallelism N` shares
    one client between its instances. Real Pulsar scopes consumer ids per connection."""
    topic = f"{NS}/quirk-two-clients-{unique}"
    first, second = quiet_client(broker.service_url), _short_client(broker.service_url)
    try:
        _shared(first, topic, "s")
        try:
            _shared(second, topic, "s")
            accepted = True
        except pulsar.PulsarException:
            accepted = False
    finally:
        second.close()
        first.close()
    assert accepted == (kind_of(broker) == "pulsar")


# -- clocks and ticks ------------------------------------------------------------------------------

def test_deliver_after_and_the_held_wake_tick(broker, unique):
    """pulsar-lite ignores deliver_after (a message is delivered at once), so a tick that sends the
    next tick with deliver_after would storm there: the writer and the syncer never do that; they
    keep one tick unacked (WakeTickHolder), which the next consumer gets after a restart. Real
    Pulsar honours deliver_after; the held tick works the same on both."""
    delayed_topic, tick_topic = f"{NS}/quirk-delay-{unique}", f"{NS}/quirk-tick-{unique}"
    client = quiet_client(broker.service_url)
    try:
        consumer = _shared(client, delayed_topic, "s")
        client.create_producer(delayed_topic, batching_enabled=False).send(
            b"later", deliver_after=datetime.timedelta(seconds=600))
        early = _drain(consumer, 1, idle_ms=2000)
        consumer.close()

        ticks = client.create_producer(tick_topic, batching_enabled=False)
        holder = WakeTickHolder()
        consumer = _shared(client, tick_topic, "ticks", queue=1)
        for _ in range(3):
            ticks.send(b"tick")
        decisions = []
        for _ in range(3):
            msg = consumer.receive(timeout_millis=10000)
            keep = holder.on_tick(position_of(msg.message_id()))
            decisions.append(keep)
            if not keep:
                consumer.acknowledge(msg)
        consumer.close()  # a restart: the held tick is redelivered to the next consumer
        again = _shared(client, tick_topic, "ticks", queue=1)
        redelivered = [position_of(again.receive(timeout_millis=10000).message_id())]
        try:
            redelivered.append(position_of(again.receive(timeout_millis=1000).message_id()))
        except pulsar.Timeout:
            pass
        again.close()
    finally:
        client.close()
    assert early == (1 if kind_of(broker) == "lite" else 0)
    assert decisions == [True, False, False]
    assert redelivered == [holder.held]  # exactly the held tick, on both brokers


def test_ticks_spread_over_two_instances_with_a_queue_of_one(broker, unique, record_property):
    """`validate` asks a partitioned writer at parallelism > 1 for `receiverQueueSize: 1` on its
    tick input, so that each instance takes one start tick (a broker may hand every tick to one
    consumer with a larger queue). Both brokers spread two spaced ticks one each with a queue of
    one; the split with a queue of 1,000 is recorded."""
    splits = {}
    for queue in (1, 1000):
        topic = f"{NS}/quirk-spread-{queue}-{unique}"
        a_client, b_client = quiet_client(broker.service_url), quiet_client(broker.service_url)
        try:
            _burn_consumer_id(b_client, f"{queue}-{unique}")
            a, b = _shared(a_client, topic, "w", queue), _shared(b_client, topic, "w", queue)
            producer = a_client.create_producer(topic, batching_enabled=False)
            for _ in range(2):
                producer.send(b"tick")
                time.sleep(0.2)  # what send-ticks does between ticks

            def held(c: pulsar.Consumer) -> int:
                n = 0
                try:
                    while True:
                        c.receive(timeout_millis=2000)  # kept unacked, as an instance holds its tick
                        n += 1
                except pulsar.Timeout:
                    return n
            splits[queue] = (held(a), held(b))
        finally:
            a_client.close()
            b_client.close()
    _note(record_property, split_queue_1=splits[1], split_queue_1000=splits[1000])
    assert splits[1] == (1, 1)
    assert sum(splits[1000]) == 2


# -- schemas, the dedup recovery's probes and reader ---------------------------------------------

class _User(Record):
    name = String()
    age = Integer()


def test_avro_value_needs_the_schema_registry(broker, unique, record_property):
    """pulsar-lite has no schema registry and does not answer GetSchema: `msg.value()` of an Avro
    message waits for the client's operation timeout each time. Real Pulsar stores the schema and
    gives messages a schema version. The deletion worker decodes with fastavro from the bytes
    (never value()) and the local run mode takes bytes inputs: both read the same on each broker."""
    topic = f"{NS}/quirk-avro-{unique}"
    client = _short_client(broker.service_url, 5)
    try:
        consumer = client.subscribe(topic, "s", schema=AvroSchema(_User), consumer_type=pulsar.ConsumerType.Shared)
        client.create_producer(topic, schema=AvroSchema(_User)).send(_User(name="u", age=7))
        msg = consumer.receive(timeout_millis=10000)
        t0 = time.monotonic()
        value = msg.value()
        _note(record_property, value_seconds=round(time.monotonic() - t0, 3))
        from_bytes = AvroSchema(_User).decode(msg.data())
        version = msg.schema_version()
        consumer.acknowledge(msg)
    finally:
        client.close()
    assert (value.name, value.age) == (from_bytes.name, from_bytes.age) == ("u", 7)
    assert (version != "") == (kind_of(broker) == "pulsar")  # no registry, no version on pulsar-lite


class _CountingClient:
    """A pulsar.Client that counts the Readers and subscriptions made through it."""

    def __init__(self, client: pulsar.Client) -> None:
        self._client = client
        self.readers = 0
        self.subscribes = 0

    def create_reader(self, *args: Any, **kwargs: Any) -> Any:
        self.readers += 1
        return self._client.create_reader(*args, **kwargs)

    def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        self.subscribes += 1
        return self._client.subscribe(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_empty_topic_last_message_id_and_the_dedup_probe(broker, unique):
    """pulsar-lite answers get_last_message_id on an empty topic with UnknownError (the client logs
    it at ERROR and WARN); real Pulsar answers entry -1. The dedup recovery looks with a short
    Reader first on both and does not ask an empty topic: it adds no subscription to it."""
    topic = f"{NS}/quirk-empty-{unique}"
    client = quiet_client(broker.service_url)
    try:
        consumer = _shared(client, topic, "probe")
        last: Optional[Tuple[int, int]]
        try:
            mid = consumer.get_last_message_id()
            last = (mid.ledger_id(), mid.entry_id())
        except pulsar.UnknownError:
            last = None
        consumer.unsubscribe()
        counting = _CountingClient(client)
        assert recovery.last_position(counting, topic) is None  # type: ignore[arg-type]
    finally:
        client.close()
    assert counting.readers == 1 and counting.subscribes == 0
    if kind_of(broker) == "lite":
        assert last is None
    else:
        assert last is not None and last[1] == -1


def test_dedup_tail_replay_across_a_dropped_connection(broker, unique, record_property):
    """pulsar-lite closes a client's whole connection on a protocol error (a second Exclusive
    consumer); the dedup replay restarts a Reader that stalls. Real Pulsar answers ConsumerBusy
    and keeps the connection. The replay reads every message on both; the restarts are recorded."""
    topic = f"{NS}/quirk-tail-{unique}"
    setup = quiet_client(broker.service_url)
    try:
        _publish(setup, topic, 100, per_entry=1)
    finally:
        setup.close()
    client = _short_client(broker.service_url)
    conflicts: List[str] = []
    seen: List[pulsar.Message] = []

    def on_message(msg: pulsar.Message) -> bool:
        seen.append(msg)
        if len(seen) == 10:  # mid-replay: a protocol error on the replay's own connection
            other = f"{NS}/quirk-tail-excl-{unique}"
            client.subscribe(other, "x", consumer_type=pulsar.ConsumerType.Exclusive)
            try:
                client.subscribe(other, "x", consumer_type=pulsar.ConsumerType.Exclusive)
            except pulsar.PulsarException as exc:
                conflicts.append(type(exc).__name__)
        return True

    try:
        stats = recovery.read_tail(client, topic, None, on_message, timeout_s=60)
    finally:
        client.close()
    _note(record_property, reader_restarts=stats.restarts)
    assert stats.messages_read == 100
    assert conflicts == ["ConsumerBusy" if kind_of(broker) == "pulsar" else "Timeout"]
    if kind_of(broker) == "pulsar":
        assert stats.restarts == 0


# -- the embedded broker's orphan grace ------------------------------------------------------------

def test_localrun_with_a_broker_url_starts_no_embedded_broker(broker, unique, tmp_path: Path):
    """The orphan-grace watchdog belongs to the embedded pulsar-lite that `localrun` starts when
    it has no --broker-service-url; given one (real Pulsar or a separate pulsar-lite), no broker
    process is started, so nothing waits for a previous one's grace period."""
    spec = spec_from_config({"name": f"fn-{unique}", "className": "example_function.ExampleFunction",
                             "inputs": [f"{NS}/quirk-in-{unique}"], "output": f"{NS}/quirk-out-{unique}"})
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)).start()
    try:
        assert runner.broker is None
    finally:
        runner.stop()


def test_each_broker_names_itself_in_its_connected_answer(broker):
    """`localrun --broker-service-url` decides whether it needs the consumer-id skip (pulsar-lite
    only) from the server_version of the reachability probe's CONNECTED answer: Apache Pulsar
    answers "Pulsar Server" + its version (Commands.newConnectedCommand), pulsar-lite its own name."""
    from pulsar_lifecycle.runtime.connect import check_broker_answers
    from pulsar_lifecycle.runtime.localrun import runs_apache_pulsar

    version = check_broker_answers(broker.service_url, 10)
    assert version is not None
    if kind_of(broker) == "pulsar":
        assert version.startswith("Pulsar Server4."), version
    else:
        assert version.startswith("Pulsar-Lite"), version
    assert runs_apache_pulsar(broker.service_url, version) == (kind_of(broker) == "pulsar")
