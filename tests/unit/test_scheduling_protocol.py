"""The scheduling protocol's message references round-trip, batch index 0 included (issue 9 defect b)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsar_lifecycle.scheduling_protocol import (
    CANCEL_PROP,
    ORIGIN_MSG_ID_PROP,
    MessageRef,
    ProtocolError,
    format_message_ref,
    format_origin_msg_id,
    parse_cancel_target,
    parse_origin_msg_id,
)

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
refs = st.builds(MessageRef, ledger_id=U64, entry_id=U64,
                 partition=st.integers(min_value=-1, max_value=(1 << 31) - 1),
                 batch_index=st.one_of(st.just(-1), st.just(0), st.integers(min_value=0, max_value=1 << 20)))


@given(refs)
def test_every_ref_round_trips_through_its_origin_form(ref: MessageRef) -> None:
    assert MessageRef.parse(ref.format()) == ref


@given(refs)
def test_every_ref_round_trips_through_its_cancel_form_without_the_partition(ref: MessageRef) -> None:
    assert MessageRef.parse_cancel(ref.format_cancel()) == MessageRef(ref.ledger_id, ref.entry_id, -1, ref.batch_index)
    assert parse_cancel_target(format_message_ref(ref.ledger_id, ref.entry_id, ref.batch_index)) == (
        ref.ledger_id, ref.entry_id, ref.batch_index)


def test_batch_index_zero_is_told_from_not_batched() -> None:
    batched, plain = MessageRef(12, 34, 3, 0), MessageRef(12, 34, 3, -1)
    assert (batched.format(), plain.format()) == ("12:34:3:0", "12:34:3")
    assert MessageRef.parse("12:34:3:0") == batched and MessageRef.parse("12:34:3") == plain
    assert (batched.format_cancel(), plain.format_cancel()) == ("12:34:0", "12:34")


def test_old_three_part_values_and_the_four_part_release_form_both_parse() -> None:
    assert parse_origin_msg_id("12:34:3") == (12, 34, 3)
    assert parse_origin_msg_id("12:34:-1:5") == (12, 34, -1)  # was rejected before
    assert format_origin_msg_id(12, 34, -1) == "12:34:-1"
    assert format_origin_msg_id(12, 34, 2, 0) == "12:34:2:0"


@pytest.mark.parametrize("bad", ["", "1:2", "1:2:3:4:5", "a:2:3", "1:-2:3", "1:2:x", "1:2:-2", "1:2:3:-1",
                                 "+1:2:3", "1:2: 3", "1:2:3:y", str(1 << 64) + ":0:0"])
def test_malformed_origin_ids_name_the_property_and_the_value(bad: str) -> None:
    with pytest.raises(ProtocolError, match=ORIGIN_MSG_ID_PROP) as err:
        MessageRef.parse(bad)
    assert ValueError in type(err.value).__mro__  # callers that catch ValueError keep working


@pytest.mark.parametrize("bad", ["", "1", "1:2:3:4", "x:2", "1:-1", "1:2:-1"])
def test_malformed_cancel_refs_name_the_property(bad: str) -> None:
    with pytest.raises(ProtocolError, match=CANCEL_PROP):
        MessageRef.parse_cancel(bad)
