"""A refused forward's dead-letter decision is durable before its ack (issue 41): a syncer killed
after its dead letters are confirmed and before it acks them, restarted when the target accepts
again, sends the redelivered messages to the dead-letter topic (dropped there as duplicates), not
to the target. Each parked message ends up in exactly one place. A PartitionForwarder over a fake
publisher and consumer (no broker): the kill is a BaseException at the dead letter's confirmation."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Set, Tuple

from pulsar_lifecycle.dedup.channel import Outcome, OutMessage
from pulsar_lifecycle.dedup.sequence_map import DedupError
from pulsar_lifecycle.delaylevel.forwarder import DEAD_LETTER_KEY_PREFIX, ERROR_PROP, ForwardPolicy, PartitionForwarder
from support.parked_fakes import FakeConsumer, FakeMsg

DLQ = "persistent://public/default/biz-delay-level-DLQ"
TARGET = "persistent://public/default/biz"


class Killed(BaseException):
    """SIGKILL at a chosen point: nothing after it runs."""


class MemState:
    def __init__(self) -> None:
        self.values: Dict[str, bytes] = {}

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> Optional[bytes]:
        return self.values.get(key)


class FakeBroker:
    """topic -> [(sequence id, payload, properties)]; `refusing` topics refuse every publish."""

    def __init__(self) -> None:
        self.topics: Dict[str, List[Tuple[int, bytes, Dict[str, str]]]] = {}
        self.refusing: Set[str] = set()


class FakePublisher:
    """DedupPublisher's surface the forwarder uses: one producer, its map recovered from the
    broker's topics (as a restart recovers it); `kill_at` raises Killed at that topic's confirmation."""

    producer_name = "syncer-p0"

    def __init__(self, broker: FakeBroker, state: MemState, kill_at: str = "") -> None:
        self.broker, self.state_store, self.kill_at = broker, state, kill_at

    def partitions(self, topic: str) -> int:
        return 0

    def destination(self, topic: str, sequence_id: int, partition_key: Optional[str] = None) -> str:
        return topic

    def route(self, topic: str, msgs: Sequence[OutMessage]) -> List[Tuple[str, List[OutMessage]]]:
        return [(topic, list(msgs))]

    def persisted_seq(self, topic: str) -> int:
        return max((s for s, _, _ in self.broker.topics.get(topic, [])), default=-1)

    def publish_many(self, topic: str, msgs: Sequence[OutMessage], *, properties_owned: bool = False) -> List[Outcome]:
        if topic in self.broker.refusing:
            raise DedupError(f"{topic}: authorization refused")
        out = []
        for m in msgs:
            if m.sequence_id <= self.persisted_seq(topic):
                out.append(Outcome.DUPLICATE)
            else:
                self.broker.topics.setdefault(topic, []).append((m.sequence_id, m.payload, dict(m.properties or {})))
                out.append(Outcome.SENT)
        return out

    def wait_persisted(self, topic: str, sequence_id: int, timeout_s: Optional[float] = None) -> None:
        if topic == self.kill_at:
            raise Killed(topic)

    def flush(self, timeout_s: Optional[float] = None) -> None:
        pass

    def reset(self, topic: str) -> None:
        pass


def forwarder(broker: FakeBroker, state: MemState, consumer: FakeConsumer, kill_at: str = "") -> PartitionForwarder:
    # Broker backend (forwards go to the business topic); retry_s 0: dead-lettered at the first refusal.
    policy = ForwardPolicy(unit_ms=1000, lookahead_ms=0, batch_size=10, near_term_topic=None, dead_letter_topic=DLQ,
                           target_exists=None, wait_for_room=lambda stop: None, clock=lambda: 10_000, retry_s=0.0)
    return PartitionForwarder(0, "persistent://public/default/biz-delay-level-partition-0", consumer,
                              FakePublisher(broker, state, kill_at), policy, threading.Event())  # type: ignore[arg-type]


def kill_after_dead_letters(broker: FakeBroker, state: MemState, n: int) -> List[FakeMsg]:
    msgs = [FakeMsg(e, TARGET) for e in range(1, n + 1)]
    broker.refusing.add(TARGET)
    first = forwarder(broker, state, FakeConsumer(msgs), kill_at=DLQ)
    try:
        first._step()  # noqa: SLF001 -- one step of the partition's loop, run here instead of its thread
    except Killed:
        pass
    else:
        raise AssertionError("the dead letters were never confirmed")
    assert [p for _, p, _ in broker.topics[DLQ]] == [m.data() for m in msgs]
    return msgs


def test_killed_between_dead_letter_and_ack_the_redelivered_messages_never_reach_the_target():
    broker, state = FakeBroker(), MemState()
    msgs = kill_after_dead_letters(broker, state, 3)
    assert all("refused" in props[ERROR_PROP] for _, _, props in broker.topics[DLQ])
    # Restarted: the target accepts now; the three come back, two new ones follow them.
    broker.refusing.clear()
    later = [FakeMsg(4, TARGET), FakeMsg(5, TARGET)]
    consumer = FakeConsumer(msgs + later)
    second = forwarder(broker, state, consumer)
    second._step()  # noqa: SLF001
    second._step()  # noqa: SLF001
    assert [p for _, p, _ in broker.topics[DLQ]] == [b"m1", b"m2", b"m3"], "each dead letter once"
    assert [p for _, p, _ in broker.topics.get(TARGET, [])] == [b"m4", b"m5"], "only the new ones reach the target"
    assert consumer.acked == msgs + later
    assert second.stats.duplicates == 3 and second.stats.forwarded == 2
    assert not state.get(f"{DEAD_LETTER_KEY_PREFIX}/syncer-p0"), "the decision is cleared once passed"


def test_without_the_decision_record_the_redelivered_message_lands_twice():
    # What the record closes: the same kill, the record lost, and the target accepts the replay.
    broker, state = FakeBroker(), MemState()
    msgs = kill_after_dead_letters(broker, state, 2)
    state.values.pop(f"{DEAD_LETTER_KEY_PREFIX}/syncer-p0")
    broker.refusing.clear()
    second = forwarder(broker, state, FakeConsumer(msgs))
    second._step()  # noqa: SLF001
    assert [p for _, p, _ in broker.topics[TARGET]] == [b"m1", b"m2"]  # also on the dead-letter topic


def test_a_decision_the_handled_position_passed_is_ignored():
    broker, state = FakeBroker(), MemState()
    state.put(f"{DEAD_LETTER_KEY_PREFIX}/syncer-p0", b'{"why": "x", "seqs": [5]}')
    state.put("delay-level/handled/syncer-p0", b"9")
    consumer = FakeConsumer([])
    fw = forwarder(broker, state, consumer)
    assert fw._decided == {}  # noqa: SLF001
