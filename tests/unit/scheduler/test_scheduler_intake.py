"""Classifying scheduling messages, and choosing the intake, without a broker."""
from __future__ import annotations

import pulsar
import pytest

from pulsar_lifecycle.bucket import positions
from pulsar_lifecycle.bucket.records import DelayedMessage
from pulsar_lifecycle.scheduler.config import scheduling_input
from pulsar_lifecycle.scheduler.intake import Cancel, Invalid, classify
from pulsar_lifecycle.scheduling_protocol import BATCH_INDEX_PROP, CANCEL_PROP, DELIVER_AT_PROP, TARGET_PROP

NOW = 1_700_000_000_000
PREFIXES = ("persistent://public/default/",)


def run(props: dict, position=(7, 3, -1, 2), payload=b"body", key="k", event_time=5):
    return classify(payload=payload, properties=props, key=key, event_time=event_time, position=position,
                    now_ms=NOW, max_delay_ms=86_400_000, allowed_target_prefixes=PREFIXES)


def test_a_valid_message_becomes_an_index_item_without_the_target_property():
    item = run({DELIVER_AT_PROP: str(NOW + 5000), "app": "x",
                TARGET_PROP: "persistent://public/default/orders"})
    assert isinstance(item, DelayedMessage)
    assert (item.ledger_id, item.entry_id, item.partition) == (7, positions.encode(3, 2), -1)
    assert item.deliver_at == NOW + 5000 and item.payload == b"body" and item.key == "k"
    assert item.properties == {DELIVER_AT_PROP: str(NOW + 5000), "app": "x"}
    assert item.target == "persistent://public/default/orders" and item.event_time == 5
    item.validate()


def test_an_empty_key_is_no_key_and_a_past_deliver_at_is_still_scheduled():
    item = run({DELIVER_AT_PROP: str(NOW - 60_000)}, key="")
    assert isinstance(item, DelayedMessage) and item.key is None and item.deliver_at == NOW - 60_000


@pytest.mark.parametrize("props, reason", [
    ({}, "missing __pl_deliver_at__"),
    ({DELIVER_AT_PROP: "-5"}, "__pl_deliver_at__"),
    ({DELIVER_AT_PROP: "12 "}, "__pl_deliver_at__"),
    ({DELIVER_AT_PROP: str(NOW + 2 * 86_400_000)}, "maxDelaySeconds"),
    ({DELIVER_AT_PROP: str(NOW), TARGET_PROP: "persistent://other/ns/t"}, "allowedTargetPrefix"),
    ({CANCEL_PROP: "12"}, "__pl_cancel__"),
    ({CANCEL_PROP: "1:2:x"}, "__pl_cancel__"),
    ({CANCEL_PROP: f"1:{positions.MAX_INDEXABLE_ENTRY_ID + 1}"}, "position range"),
])
def test_bad_input_is_refused_with_a_reason_naming_the_problem(props, reason):
    item = run(props)
    assert isinstance(item, Invalid)
    assert reason in item.reason


def test_a_position_beyond_the_index_range_is_refused():
    item = run({DELIVER_AT_PROP: str(NOW)}, position=(7, positions.MAX_INDEXABLE_ENTRY_ID + 1, -1, -1))
    assert isinstance(item, Invalid) and "position range" in item.reason


def test_cancel_names_a_batched_or_plain_message():
    assert run({CANCEL_PROP: "12:34:5"}) == Cancel(12, positions.encode(34, 5))
    assert run({CANCEL_PROP: "12:34"}) == Cancel(12, positions.encode(34, -1))


def test_direct_intake_inputs_are_the_tick_topic_and_optionally_the_scheduling_topic():
    ticks = "persistent://public/default/ticks"
    sched = "persistent://public/default/sched"
    assert scheduling_input([ticks], {"tickTopic": ticks, "schedulingTopic": "sched"}) == (sched, True)
    assert scheduling_input([ticks, sched], {"tickTopic": ticks, "schedulingTopic": sched}) == (sched, True)
    with pytest.raises(ValueError, match="remove them from inputs"):
        scheduling_input([ticks, sched, "other"], {"tickTopic": ticks, "schedulingTopic": sched})
    with pytest.raises(ValueError, match="needs tickTopic"):
        scheduling_input([ticks], {"schedulingTopic": sched})


def test_runtime_intake_needs_exactly_one_scheduling_input():
    ticks = "persistent://public/default/ticks"
    assert scheduling_input(["s", ticks], {"tickTopic": ticks}) == ("persistent://public/default/s", False)
    with pytest.raises(ValueError, match="exactly one scheduling input"):
        scheduling_input([ticks], {"tickTopic": ticks})
    with pytest.raises(ValueError, match="exactly one scheduling input"):
        scheduling_input(["a", "b", ticks], {"tickTopic": ticks})


def test_an_upstream_dedup_publishers_properties_are_dropped():
    # The delay-level syncer forwards through a DedupPublisher; its __pl_producer__/__pl_seq__ are
    # not the release's (the release publisher refuses foreign ones).
    item = run({DELIVER_AT_PROP: str(NOW + 5000), "__pl_producer__": "syncer-p3", "__pl_seq__": "42", "app": "x"})
    assert isinstance(item, DelayedMessage)
    assert item.properties == {DELIVER_AT_PROP: str(NOW + 5000), "app": "x"}


def test_batch_index_zero_is_kept_with_the_item_and_a_foreign_marker_is_dropped():
    # The index id of (entry 3, batch 0) equals that of a non-batched entry 3: the item keeps the
    # difference so the release's __pl_origin_msg_id__ can say ":0" (issue 9 defect b).
    first = run({DELIVER_AT_PROP: str(NOW)}, position=(7, 3, -1, 0))
    plain = run({DELIVER_AT_PROP: str(NOW), BATCH_INDEX_PROP: "0"}, position=(7, 3, -1, -1))
    assert first.entry_id == plain.entry_id == positions.encode(3, -1)
    assert first.properties == {DELIVER_AT_PROP: str(NOW), BATCH_INDEX_PROP: "0"}
    assert plain.properties == {DELIVER_AT_PROP: str(NOW)}


def test_an_items_properties_are_a_copy_of_the_messages():
    props = {DELIVER_AT_PROP: str(NOW), "app": "x"}
    item = run(props)
    assert item.properties == props and item.properties is not props


class _Msg:
    """The accessors of a received (native) message the direct consumer calls."""

    def __init__(self, ledger: int, entry: int, batch: int, props: dict, payload: bytes) -> None:
        self._id, self._props, self._payload = pulsar.MessageId(-1, ledger, entry, batch), props, payload

    def properties(self) -> dict:
        return dict(self._props)

    def data(self) -> bytes:
        return self._payload

    def message_id(self) -> pulsar.MessageId:
        return self._id

    def partition_key(self) -> str:
        return ""

    def event_timestamp(self) -> int:
        return 0


class _Watchdog:
    def __init__(self) -> None:
        self.seen_at: list = []

    def seen(self, ledger: int, entry: int) -> None:
        self.seen_at.append((ledger, entry))


def test_the_direct_consumer_classifies_a_batch_into_items_and_the_rest_in_order():
    from pulsar_lifecycle.scheduler.scheduling_consumer import SchedulingConsumer, SchedulingSubscription
    from pulsar_lifecycle.scheduler.service import IntakeBatch

    consumer = object.__new__(SchedulingConsumer)  # no broker: only the classification
    consumer.sub = SchedulingSubscription("t", "s", 500, 5, 86_400_000, PREFIXES)
    consumer.watchdog = _Watchdog()
    msgs = [_Msg(7, 3, 0, {DELIVER_AT_PROP: str(NOW)}, b"a"),
            _Msg(7, 3, 1, {"app": "no deliver-at"}, b"b"),
            _Msg(7, 4, 0, {CANCEL_PROP: "7:3:0"}, b"c"),
            _Msg(6, 9, -1, {DELIVER_AT_PROP: str(NOW + 1)}, b"d"),
            _Msg(7, 4, 1, {DELIVER_AT_PROP: str(NOW + 2)}, b"e")]
    entries: list = []
    adds, others = consumer._classify_all(msgs, NOW, entries)
    assert [m.payload for m in adds] == [b"a", b"d", b"e"]
    assert [m.entry_id for m in adds] == [positions.encode(3, 0), positions.encode(9, -1), positions.encode(4, 1)]
    assert [type(p.item) for p in others] == [Invalid, Cancel]
    assert [(p.payload, p.properties) for p in others] == [(b"b", {"app": "no deliver-at"}),
                                                           (b"c", {CANCEL_PROP: "7:3:0"})]
    assert entries == [(7, 3), (7, 4), (6, 9), (7, 4)]
    assert consumer.watchdog.seen_at == [(7, 4)]  # the furthest position of the batch

    acked = []
    batch = IntakeBatch(others, lambda: acked.append(True), adds)
    assert len(batch) == 5 and batch.split() == (adds, others)
    batch.ack()
    assert acked == [True]


def test_an_intake_batch_of_pending_items_splits_into_items_and_the_rest():
    from pulsar_lifecycle.scheduler.service import IntakeBatch, Pending

    item = run({DELIVER_AT_PROP: str(NOW)})
    refused = Pending(Invalid("bad"), None, b"x", {})
    both = IntakeBatch([Pending(item), refused], lambda: None)
    assert len(both) == 2 and both.split() == ([item], [refused])
    only_items = IntakeBatch([Pending(item)], lambda: None)
    assert only_items.split() == ([item], [])
    assert len(IntakeBatch([], lambda: None, [])) == 0
