"""SchedulerService's release round (what it hands the dedup publisher), without a broker."""
from __future__ import annotations

from typing import Any, List, Tuple

from pulsar_lifecycle.bucket import positions
from pulsar_lifecycle.bucket.records import DelayedMessage, Release
from pulsar_lifecycle.clock import FakeClock
from pulsar_lifecycle.scheduler.config import WriterConfig
from pulsar_lifecycle.scheduler.service import SchedulerService
from pulsar_lifecycle.scheduling_protocol import (
    BATCH_INDEX_PROP,
    DELIVER_AT_PROP,
    ORIGIN_MSG_ID_PROP,
    RELEASED_AT_PROP,
)

OUT = "persistent://public/default/out"
OTHER = "persistent://public/default/other"


class _Publisher:
    def __init__(self) -> None:
        self.calls: List[Tuple[str, List[Any], dict]] = []

    def publish_many(self, topic: str, messages: List[Any], **kwargs: Any) -> None:
        self.calls.append((topic, list(messages), kwargs))

    def topics(self) -> List[str]:
        return [OUT, OTHER]

    def partitions(self, topic: str) -> int:
        return 0

    def route(self, topic: str, messages: List[Any]) -> List[Tuple[str, List[Any]]]:
        return [(topic, list(messages))]


def test_a_round_hands_fresh_property_dicts_to_the_publisher_per_target_in_order():
    clock = FakeClock(1_700_000_000_000)
    pub = _Publisher()
    service = SchedulerService(None, pub, WriterConfig(), OUT, OUT + "-INVALID", None, lambda n, v: None,
                               clock=clock)
    first = DelayedMessage(7, positions.encode(3, 0), -1, 5, b"a", "k",
                           {DELIVER_AT_PROP: "5", BATCH_INDEX_PROP: "0", "app": "x"}, 9)
    plain = DelayedMessage(7, positions.encode(4, -1), 2, 6, b"b", None, {DELIVER_AT_PROP: "6"}, target=OTHER)
    cancelled = DelayedMessage(7, positions.encode(4, 1), -1, 6, b"c", None, {DELIVER_AT_PROP: "6"})
    kept = [dict(first.properties), dict(plain.properties)]
    service._publish_round([Release(1, first, False, 5), Release(2, cancelled, True, 6), Release(3, plain, False, 6)])

    assert [(topic, kwargs) for topic, _, kwargs in pub.calls] == [(OUT, {"properties_owned": True}),
                                                                  (OTHER, {"properties_owned": True})]
    (_, [a], _), (_, [b], _) = pub.calls
    assert (a.payload, a.sequence_id, a.partition_key, a.event_timestamp) == (b"a", 1, "k", 9)
    assert a.properties == {DELIVER_AT_PROP: "5", "app": "x", ORIGIN_MSG_ID_PROP: "7:3:-1:0",
                            RELEASED_AT_PROP: str(clock())}
    assert (b.payload, b.sequence_id, b.event_timestamp) == (b"b", 3, None)
    assert b.properties == {DELIVER_AT_PROP: "6", ORIGIN_MSG_ID_PROP: "7:4:2", RELEASED_AT_PROP: str(clock())}
    # The publisher may write into what it was handed: never the released messages' own dicts.
    assert a.properties is not first.properties and b.properties is not plain.properties
    assert [first.properties, plain.properties] == kept
    assert [(e[0], e[1]) for e in service._outstanding] == [(1, OUT), (2, None), (3, OTHER)]
    assert (service.released, service.cancelled) == (2, 1)
