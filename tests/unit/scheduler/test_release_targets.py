"""SchedulerService's release targets without a broker: a partitioned target's releases tracked per
partition, a target that refuses held (others released on time), retried, then dead-lettered,
a failed send held and sent again, and the watermark never passing a held release."""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from pulsar_lifecycle.bucket import positions
from pulsar_lifecycle.bucket.records import DelayedMessage, Release
from pulsar_lifecycle.clock import FakeClock
from pulsar_lifecycle.scheduler.config import WriterConfig
from pulsar_lifecycle.scheduler.service import STATUS_KEY, SchedulerService
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

OUT = "persistent://public/default/out"
BAD = "persistent://public/default/bad"
PART = "persistent://public/default/part"


class _Store:
    def __init__(self) -> None:
        self.data: Dict[str, bytes] = {}

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> Optional[bytes]:
        return self.data.get(key)


class _Publisher:
    """Plain topics and PART (2 partitions, by id parity); `refuse` fails opens, `fail_send` sends."""

    producer_name = "w-release"

    def __init__(self) -> None:
        self.opened: Set[str] = {OUT}
        self.refuse: Set[str] = set()
        self.fail_send: Set[str] = set()
        self.failed: Dict[str, str] = {}
        self.persisted: Dict[str, int] = {}
        self.sent: List[Tuple[str, int]] = []
        self.state_store = _Store()

    def topics(self) -> List[str]:
        return sorted(self.opened)

    def open(self, topic: str) -> int:
        if topic in self.refuse:
            raise RuntimeError(f"{topic}: AuthorizationError")
        self.opened.add(topic)
        return -1

    def partitions(self, topic: str) -> int:
        return 2 if topic == PART else 0

    def route(self, topic: str, messages: List[Any]) -> List[Tuple[str, List[Any]]]:
        if topic != PART:
            return [(topic, list(messages))]
        groups: Dict[str, List[Any]] = {}
        for m in messages:
            groups.setdefault(f"{PART}-partition-{m.sequence_id % 2}", []).append(m)
        return list(groups.items())

    def destination(self, topic: str, seq: int, key: Optional[str] = None) -> str:
        return topic if topic != PART else f"{PART}-partition-{seq % 2}"

    def publish_many(self, dest: str, messages: List[Any], **_: Any) -> None:
        if dest in self.failed:
            raise RuntimeError(f"{dest}: channel failed")
        for m in messages:
            self.sent.append((dest, m.sequence_id))
        if dest in self.fail_send:
            self.failed[dest] = "TopicTerminated"
        elif messages:
            self.persisted[dest] = max(self.persisted.get(dest, -1), messages[-1].sequence_id)

    def persisted_seq(self, dest: str) -> int:
        return self.persisted.get(dest, -1)

    def failed_topics(self) -> Dict[str, str]:
        return dict(self.failed)

    def reset(self, dest: str) -> None:
        self.failed.pop(dest, None)


class _Engine:
    def __init__(self) -> None:
        self.committed = 0

    def commit(self, upto: int) -> None:
        self.committed = upto


def _service(retry_s: int = 60) -> Tuple[SchedulerService, _Publisher, _Engine, FakeClock, _Publisher]:
    clock = FakeClock(1_700_000_000_000)
    pub, engine, dlq = _Publisher(), _Engine(), _Publisher()
    cfg = WriterConfig(target_retry_seconds=retry_s)
    service = SchedulerService(engine, pub, cfg, OUT, "persistent://public/default/sched-INVALID", None,
                               lambda n, v: None, clock=clock, dead_letter_topic="persistent://public/default/dlq")
    service._dead._publisher = lambda target: dlq  # type: ignore[method-assign]
    return service, pub, engine, clock, dlq


def _release(seq: int, target: Optional[str] = None) -> Release:
    m = DelayedMessage(7, positions.encode(seq, -1), -1, 5, f"m{seq}".encode(), None, {DELIVER_AT_PROP: "5"},
                       target=target)
    return Release(seq, m, False, 5)


def _settle(service: SchedulerService) -> None:
    """Start what is due, let the background opens finish and act on them."""
    service._tend_targets()
    for _ in range(200):
        if not any(not f.done() for f in service._opening.values()):
            break
        time.sleep(0.01)
    service._tend_targets()


def test_a_partitioned_target_is_tracked_per_partition():
    service, pub, engine, _clock, _dlq = _service()
    pub.opened.add(f"{PART}-partition-0")
    service._publish_round([_release(1, PART), _release(2, PART), _release(3)])
    assert sorted(pub.sent) == [(OUT, 3), (f"{PART}-partition-0", 2), (f"{PART}-partition-1", 1)]
    assert [e[1] for e in service._outstanding] == [f"{PART}-partition-1", f"{PART}-partition-0", OUT]
    service._advance_commit()
    assert engine.committed == 3


def test_a_refusing_target_is_held_while_others_go_out_then_dead_lettered_in_order():
    service, pub, engine, clock, dlq = _service(retry_s=5)
    pub.refuse.add(BAD)
    service._publish_round([_release(1), _release(2, BAD), _release(3)])
    _settle(service)  # the open fails: held, backoff 0.5 s
    service._publish_round([_release(4, BAD), _release(5)])
    assert [s for d, s in pub.sent] == [1, 3, 5]
    service._advance_commit()
    assert engine.committed == 1  # never past the held release 2
    status = service.status()
    assert status["held_targets"][0]["target"] == BAD and status["held_releases"] == 2
    assert "AuthorizationError" in status["held_targets"][0]["reason"]
    service._write_status()
    assert json.loads(pub.state_store.data[STATUS_KEY])["held_targets"][0]["held"] == 2
    while service._health.held(BAD) is not None:
        clock.advance(500)
        _settle(service)
    assert [(d, s) for d, s in dlq.sent] == [("persistent://public/default/dlq", 2),
                                             ("persistent://public/default/dlq", 4)]
    mark = json.loads(pub.state_store.data["dead-target/w-release@" + BAD])
    assert mark["seq"] == 4 and "AuthorizationError" in mark["reason"]
    service._advance_commit()
    assert engine.committed == 5 and service.dead_lettered == 2
    # A replay of the dead-lettered ids (a crash before the commit): to the dead-letter topic
    # again (its de-duplication drops them), never to the target, even once it accepts.
    pub.refuse.clear()
    pub.opened.add(BAD)
    service._publish_round([_release(4, BAD), _release(6, BAD)])
    assert (BAD, 4) not in pub.sent and (BAD, 6) in pub.sent
    assert dlq.sent[-1][1] == 4


def test_a_failed_send_holds_its_target_and_sends_again_after_a_reset():
    service, pub, engine, clock, dlq = _service()
    pub.opened.add(BAD)
    pub.fail_send.add(BAD)
    service._publish_round([_release(1, BAD), _release(2)])
    service._advance_commit()  # the failed channel is seen: release 1 held again
    assert service._health.held(BAD) is not None and engine.committed == 0
    service._publish_round([_release(3, BAD)])  # behind it
    pub.fail_send.clear()
    clock.advance(500)
    _settle(service)
    assert [s for d, s in pub.sent if d == BAD] == [1, 1, 3]
    service._advance_commit()
    assert engine.committed == 3 and not dlq.sent and service._health.held(BAD) is None
