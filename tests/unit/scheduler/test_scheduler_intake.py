"""Classifying scheduling messages, and choosing the intake, without a broker."""
from __future__ import annotations

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
