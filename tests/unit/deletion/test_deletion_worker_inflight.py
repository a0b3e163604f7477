"""DeletionWorkerRunner with deletions in flight, against the local admin and bookie servers and a
fake runtime Context: side by side, never two of one ledger, one internalStats call per topic,
retries and dead letters stored before the ack, a failed send nacked and never acked."""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.codec import encode
from pulsar_lifecycle.deletion.config import DeletionConfig
from pulsar_lifecycle.deletion.engine import DeletionEngine
from pulsar_lifecycle.deletion.oracle import ComponentOracle, InternalStatsOracle
from pulsar_lifecycle.deletion.routing import StorageRouter
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient, BookieLedgerStorage
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.deletion.worker import DeletionWorkerRunner
from servers.bookie_http_server import pulsar_metadata
from servers.internal_stats_server import InternalStatsServer
from support.deletion import req
from support.helpers import wait_for
from support.watched_bookie import WatchedBookie

SRC = "persistent://pulsar/system/__ledger_deletion-partition-0"
RETRY = "persistent://pulsar/system/__ledger_deletion-RETRY-partition-0"
DLQ = "persistent://pulsar/system/__ledger_deletion-DLQ"


class FakeProducer:
    def __init__(self, sent: List[Tuple[str, bytes, Dict[str, str]]], topic: str) -> None:
        self.sent, self.topic = sent, topic

    def send(self, payload: bytes, properties: Optional[Dict[str, str]] = None, **_: Any) -> str:
        self.sent.append((self.topic, payload, dict(properties or {})))
        return f"{self.topic}:{len(self.sent)}"

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeClient:
    """create_producer for the runner's DLQ pool; what it sends is in `sent`."""

    def __init__(self) -> None:
        self.sent: List[Tuple[str, bytes, Dict[str, str]]] = []

    def create_producer(self, topic: str, **_: Any) -> FakeProducer:
        return FakeProducer(self.sent, topic)


class FakeDelayed:
    """The retry path's DelayedProducer: `gate` holds sends, `fail` makes them raise."""

    def __init__(self) -> None:
        self.sent: List[Tuple[str, bytes, Dict[str, str]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail = False

    def send(self, topic: str, payload: bytes, deliver_at_ms: int, properties: Optional[Dict[str, str]] = None,
             **_: Any) -> str:
        self.entered.set()
        self.gate.wait(10)
        if self.fail:
            raise RuntimeError("retry topic unreachable")
        self.sent.append((topic, payload, dict(properties or {})))
        return "retry-id"

    def close(self) -> None:
        pass


class FakeConsumer:
    def __init__(self) -> None:
        self.nacks: List[str] = []

    def negative_acknowledge(self, message_id: str) -> None:
        self.nacks.append(message_id)


class FakeContext:
    """The runtime Context: one current message at a time, ack(msgid, topic), and the consumers."""

    def __init__(self, bookie: WatchedBookie, ledger_of: Dict[str, int]) -> None:
        self.current: Tuple[str, Dict[str, str], str] = ("", {}, SRC)
        self.lock = threading.Lock()
        self.acks: List[str] = []
        self.acked_while_stored: List[str] = []  # acks of DELETED ledgers that were still in the bookie
        self.consumers = {SRC: FakeConsumer()}
        self.bookie, self.ledger_of = bookie, ledger_of
        self.metrics: Dict[str, float] = {}

    def deliver(self, runner: DeletionWorkerRunner, mid: str, payload: bytes, props: Optional[Dict[str, str]] = None,
                ledger: Optional[int] = None) -> None:
        if ledger is not None:
            self.ledger_of[mid] = ledger
        self.current = (mid, dict(props or {}), SRC)
        runner.process(payload, self)

    def get_message_id(self) -> str:
        return self.current[0]

    def get_message_properties(self) -> Dict[str, str]:
        return self.current[1]

    def get_current_message_topic_name(self) -> str:
        return self.current[2]

    def ack(self, msgid: str, topic: str) -> None:
        assert topic == SRC
        with self.lock:
            self.acks.append(msgid)

    def record_metric(self, name: str, value: float) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + value


@pytest.fixture
def admin() -> Iterator[InternalStatsServer]:
    with InternalStatsServer() as s:
        yield s


@pytest.fixture
def bookie() -> Iterator[WatchedBookie]:
    with WatchedBookie(call_s=0.02) as s:
        yield s


def make_runner(admin: InternalStatsServer, bookie: WatchedBookie, in_flight: int = 8, max_redeliver: int = 3,
                ) -> Tuple[DeletionWorkerRunner, FakeClient, FakeDelayed]:
    config = DeletionConfig.from_user_config({"delayBackend": "broker", "reconsumeLaterSeconds": 0,
                                              "maxRedeliverCount": max_redeliver, "maxDeletionsInFlight": in_flight})
    oracle = InternalStatsOracle(PulsarAdminClient.connect([admin.url], pool_size=in_flight), ttl_seconds=600)
    router = StorageRouter(bookkeeper=BookieLedgerStorage(BookieHttpClient.connect([bookie.url], pool_size=in_flight)))
    engine = DeletionEngine(ComponentOracle(default=oracle), router, DeletionTopics(),
                            max_redeliver_count=max_redeliver)
    client, delayed = FakeClient(), FakeDelayed()
    runner = DeletionWorkerRunner(engine, config, client, delayed)  # type: ignore[arg-type]
    return runner, client, delayed


def topic_with_ledgers(admin: InternalStatsServer, bookie: WatchedBookie, k: int, n: int) -> Tuple[str, List[int]]:
    """Topic k with n removable ledgers and a newer current one (so none is above the cached maximum)."""
    topic = f"public/default/t{k}-partition-0"
    ids = [k * 1000 + i for i in range(n)]
    admin.set_topic(topic, ledgers=[k * 1000 + 999])
    for lid in ids + [k * 1000 + 999]:
        bookie.add_ledger(lid, pulsar_metadata(topic))
    return topic, ids


def test_deletions_run_side_by_side_each_acked_once_after_it_is_done(admin, bookie):
    runner, _, _ = make_runner(admin, bookie, in_flight=8)
    ledger_of: Dict[str, int] = {}
    ctx = FakeContext(bookie, ledger_of)
    stored_at_ack: List[int] = []
    plain_ack = ctx.ack

    def ack(msgid: str, topic: str) -> None:
        if bookie.exists(ledger_of[msgid]):
            stored_at_ack.append(ledger_of[msgid])
        plain_ack(msgid, topic)

    ctx.ack = ack  # type: ignore[method-assign]
    work: List[Tuple[str, int]] = []
    for k in range(3):
        topic, ids = topic_with_ledgers(admin, bookie, k, 20)
        work += [(topic, lid) for lid in ids]
    for i, (topic, lid) in enumerate(work):
        ctx.deliver(runner, f"m{i}", encode(req(topic, lid)), ledger=lid)
    assert runner.drain(60)
    runner.close(5)
    assert sorted(ctx.acks) == sorted(f"m{i}" for i in range(len(work)))  # each once
    assert stored_at_ack == []  # acked only once the ledger was gone
    assert sorted(bookie.deleted) == sorted(lid for _, lid in work)
    assert bookie.most_in_progress >= 2, "deletions never overlapped"
    assert bookie.overlaps == []
    # 20 first lookups of a topic at once share one internalStats load.
    assert all(admin.calls_for(f"public/default/t{k}-partition-0") == 1 for k in range(3))
    assert runner.metrics.value("deleted") == len(work)


def test_duplicate_and_forged_requests_of_one_ledger_never_overlap(admin, bookie):
    runner, client, _ = make_runner(admin, bookie, in_flight=8)
    topic, ids = topic_with_ledgers(admin, bookie, 1, 10)
    other, _ = topic_with_ledgers(admin, bookie, 2, 1)
    target = ids[0]
    ctx = FakeContext(bookie, {})
    payloads = [encode(req(topic, target)) for _ in range(5)] + [encode(req(other, target)) for _ in range(2)]
    payloads += [encode(req(topic, lid)) for lid in ids[1:]]
    for i, p in enumerate(payloads):
        ctx.deliver(runner, f"m{i}", p)
    assert runner.drain(60)
    runner.close(5)
    assert bookie.overlaps == [], f"two calls about one ledger at once: {bookie.overlaps}"
    assert bookie.delete_requests[target] == 1  # the copies found it gone (or refused it) first
    assert not bookie.exists(target) and bookie.deleted.count(target) == 1
    assert len(ctx.acks) == len(payloads)
    assert runner.metrics.value("deleted") == len(ids)
    # A forged copy that ran first went to the DLQ without deleting; one that ran later found it gone.
    assert all(topic_ == DLQ and props["OUTCOME"] == "OWNER_MISMATCH" for topic_, _, props in client.sent)


def test_in_use_ledger_is_retried_and_acked_only_after_the_retry_is_stored(admin, bookie):
    runner, _, delayed = make_runner(admin, bookie)
    topic = "public/default/live-partition-0"
    admin.set_topic(topic, ledgers=[7, 8])
    for lid in (7, 8):
        bookie.add_ledger(lid, pulsar_metadata(topic))
    ctx = FakeContext(bookie, {})
    delayed.gate.clear()
    ctx.deliver(runner, "m0", encode(req(topic, 7)))
    assert delayed.entered.wait(10)
    assert ctx.acks == [] and runner.in_flight == 1  # the retry is not stored yet: no ack
    delayed.gate.set()
    assert wait_for(lambda: ctx.acks == ["m0"], timeout=10)
    runner.close(5)
    (target, _, props), = delayed.sent
    assert target == RETRY and props["RECONSUMETIMES"] == "1" and "still in use" in props["REASON"]
    assert bookie.exists(7) and bookie.delete_requests[7] == 0


def test_retry_budget_spent_goes_to_the_dlq_before_the_ack(admin, bookie):
    runner, client, delayed = make_runner(admin, bookie, max_redeliver=3)
    topic, ids = topic_with_ledgers(admin, bookie, 3, 1)
    bookie.poisoned.add(ids[0])
    ctx = FakeContext(bookie, {})
    ctx.deliver(runner, "m0", encode(req(topic, ids[0])), {"RECONSUMETIMES": "3"})
    assert wait_for(lambda: ctx.acks == ["m0"], timeout=10)
    runner.close(5)
    (target, _, props), = client.sent
    assert target == DLQ and props["OUTCOME"] == "FAILED" and "gave up after 3 retries" in props["REASON"]
    assert delayed.sent == [] and bookie.exists(ids[0])


def test_a_failed_retry_send_nacks_and_never_acks(admin, bookie):
    runner, _, delayed = make_runner(admin, bookie)
    topic, ids = topic_with_ledgers(admin, bookie, 4, 1)
    bookie.poisoned.add(ids[0])
    delayed.fail = True
    ctx = FakeContext(bookie, {})
    ctx.deliver(runner, "m0", encode(req(topic, ids[0])))
    assert wait_for(lambda: ctx.consumers[SRC].nacks == ["m0"], timeout=10)
    runner.close(5)
    assert ctx.acks == [] and bookie.exists(ids[0])


def test_undecodable_message_is_dead_lettered_and_acked(admin, bookie):
    runner, client, _ = make_runner(admin, bookie)
    ctx = FakeContext(bookie, {})
    ctx.deliver(runner, "m0", b"\x08not-avro")
    assert wait_for(lambda: ctx.acks == ["m0"], timeout=10)
    runner.close(5)
    (target, _, props), = client.sent
    assert target == DLQ and props["OUTCOME"] == "REJECTED"


def test_one_in_flight_means_one_at_a_time(admin, bookie):
    runner, _, _ = make_runner(admin, bookie, in_flight=1)
    topic, ids = topic_with_ledgers(admin, bookie, 5, 8)
    ctx = FakeContext(bookie, {})
    for i, lid in enumerate(ids):
        ctx.deliver(runner, f"m{i}", encode(req(topic, lid)))
    assert runner.drain(60)
    runner.close(5)
    assert bookie.most_in_progress == 1 and len(ctx.acks) == len(ids) and not any(map(bookie.exists, ids))
