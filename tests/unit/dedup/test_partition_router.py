"""Partition routing: Pulsar's own key hashes, unkeyed spreading, and routing histories."""
from __future__ import annotations

import pytest

from pulsar_lifecycle.dedup.partition_router import (
    RoutingError,
    RoutingHistory,
    choose_partition,
    java_string_hash,
    key_hasher,
    murmur3_32_hash,
)

# Computed by Pulsar 4.0.8's own org.apache.pulsar.client.impl.JavaStringHash and Murmur3Hash32
# (pulsar-client-original-4.0.8.jar): key, JavaStringHash, Murmur3_32Hash.
PULSAR_HASHES = [
    ("", 0, 0),
    ("a", 97, 1009084850),
    ("order-42", 1234255197, 1259446670),
    ("héllo wörld", 1628148953, 402125428),
    ("日本語キー", 1289065926, 1610471384),
    ("\U0001F600emoji", 913791171, 1391726296),  # a surrogate pair in Java's UTF-16
]


@pytest.mark.parametrize("key,java,murmur", PULSAR_HASHES)
def test_hashes_equal_pulsars_java_client(key: str, java: int, murmur: int) -> None:
    assert java_string_hash(key) == java
    assert murmur3_32_hash(key) == murmur


def test_keyed_message_goes_where_a_java_producer_sends_its_key() -> None:
    for n in (1, 2, 4, 7, 16):
        assert choose_partition("order-42", 99, n) == 1234255197 % n
        assert choose_partition("order-42", 5, n, murmur3_32_hash) == 1259446670 % n


def test_unkeyed_messages_spread_and_repeat() -> None:
    parts = [choose_partition(None, seq, 4) for seq in range(1, 4001)]
    assert parts == [choose_partition("", seq, 4) for seq in range(1, 4001)]  # an empty key is none
    counts = [parts.count(p) for p in range(4)]
    assert min(counts) > 800, counts
    # Positions with the same low bits (batch index 0) spread too.
    shifted = {choose_partition(None, seq << 28, 4) for seq in range(1, 200)}
    assert shifted == {0, 1, 2, 3}


def test_unknown_hashing_is_named() -> None:
    with pytest.raises(RoutingError, match="boost"):
        key_hasher("boost")
    with pytest.raises(RoutingError):
        choose_partition("k", 1, 0)


def test_history_routes_each_id_with_the_count_in_force() -> None:
    h = RoutingHistory()
    assert h.grow(2, 0)
    assert not h.grow(2, 50)
    assert h.grow(4, 11)
    assert h.partitions_at(10) == 2 and h.partitions_at(11) == 4 and h.partitions == 4
    keyed = [h.route("order-42", s, java_string_hash) for s in (3, 10, 11, 500)]
    assert keyed == [1234255197 % 2, 1234255197 % 2, 1234255197 % 4, 1234255197 % 4]
    again = RoutingHistory.from_bytes(h.to_bytes())
    assert [again.route(None, s, java_string_hash) for s in range(1, 40)] == \
        [h.route(None, s, java_string_hash) for s in range(1, 40)]
    with pytest.raises(RoutingError, match="down"):
        h.grow(3, 600)


def test_history_replaces_a_count_nothing_was_sent_with() -> None:
    h = RoutingHistory()
    h.grow(2, 0)
    h.grow(3, 0)
    assert h.epochs[-1].partitions == 3 and len(h.epochs) == 1


def test_unreadable_history_is_an_error() -> None:
    with pytest.raises(RoutingError):
        RoutingHistory.from_bytes(b"{not json")
    with pytest.raises(RoutingError):
        RoutingHistory.from_bytes(b"[[5, 4], [3, 8]]")
