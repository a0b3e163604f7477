"""DelayedProducer's routing on partitioned scheduling topics, without a broker: a keyed message
goes to its key's JavaStringHash partition (or Murmur3_32), unkeyed ones round robin, and a
cancel goes to the partition its message id names."""
from __future__ import annotations

from typing import Optional

import pulsar
import pytest

from pulsar_lifecycle.dedup.partition_router import java_string_hash, murmur3_32_hash
from pulsar_lifecycle.scheduling_protocol import cancel_reply_topic
from pulsar_lifecycle.timing import DelayedProducer

SCHED = "persistent://public/default/sched"


class _Msg:
    """What pulsar-client hands a message_router: a message with partition_key()."""

    def __init__(self, key: Optional[str]) -> None:
        self._key = key or ""

    def partition_key(self) -> str:
        return self._key


def test_keyed_by_java_string_hash_unkeyed_round_robin() -> None:
    dp = DelayedProducer(None, scheduling_topic=SCHED)  # type: ignore[arg-type]  # no producer is opened
    for key in ("customer-1", "ключ", "😀", "a" * 100):
        assert dp.choose_partition(_Msg(key), 7) == java_string_hash(key) % 7
    assert [dp.choose_partition(_Msg(None), 4) for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    murmur = DelayedProducer(None, scheduling_topic=SCHED, key_hashing="murmur3_32")  # type: ignore[arg-type]
    assert murmur.choose_partition(_Msg("customer-1"), 7) == murmur3_32_hash("customer-1") % 7


def test_partitions_by_name_route_the_same_way() -> None:
    dp = DelayedProducer(None, scheduling_topic=SCHED, scheduling_partitions=4)  # type: ignore[arg-type]
    assert dp._destination(SCHED, "k") == (f"{SCHED}-partition-{java_string_hash('k') % 4}",  # noqa: SLF001
                                           java_string_hash("k") % 4)
    assert [dp._destination(SCHED, None)[1] for _ in range(4)] == [0, 1, 2, 3]  # noqa: SLF001
    assert dp._destination("persistent://public/default/other", "k") == ("persistent://public/default/other", -1)  # noqa: SLF001


def test_a_cancel_goes_to_the_partition_its_id_names() -> None:
    dp = DelayedProducer(None, scheduling_topic=SCHED)  # type: ignore[arg-type]
    assert dp.cancel_topic(pulsar.MessageId(2, 10, 5, -1)) == f"{SCHED}-partition-2"
    assert dp.cancel_reply_topic(pulsar.MessageId(2, 10, 5, -1)) == cancel_reply_topic(f"{SCHED}-partition-2")
    assert dp.cancel_topic(pulsar.MessageId(-1, 10, 5, -1)) == SCHED
    one = DelayedProducer(None, scheduling_topic=f"{SCHED}-partition-1")  # type: ignore[arg-type]
    assert one.cancel_topic(pulsar.MessageId(1, 10, 5, -1)) == f"{SCHED}-partition-1"
    by_name = DelayedProducer(None, scheduling_topic=SCHED, scheduling_partitions=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partition 4"):
        by_name.cancel_topic(pulsar.MessageId(4, 10, 5, -1))
    with pytest.raises(ValueError, match="broker cannot cancel"):
        DelayedProducer(None, backend="broker").cancel_topic(pulsar.MessageId(0, 1, 1, -1))  # type: ignore[arg-type]


@pytest.mark.parametrize("kw, needle", [
    ({"scheduling_partitions": -1}, "scheduling_partitions"),
    ({"scheduling_partitions": True}, "scheduling_partitions"),
    ({"scheduling_partitions": 4, "scheduling_topic": f"{SCHED}-partition-0"}, "not one partition"),
    ({"key_hashing": "boost"}, "java_string"),
])
def test_bad_settings_are_refused(kw: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        DelayedProducer(None, **{"scheduling_topic": SCHED, **kw})  # type: ignore[arg-type]
