"""StateStore behaviour every backend must have; test modules subclass StateStoreContract.

A subclass provides the fixture `open_store(table: str = "fn") -> StateStore` that opens (or
re-opens) a table of one function namespace; stores it returns are closed by the subclass.
"""
from __future__ import annotations

from typing import Callable

import pytest

from pulsar_lifecycle.state.base import StateStore

OpenStore = Callable[..., StateStore]


class StateStoreContract:
    """Backend-independent StateStore tests (not collected by itself: no Test prefix)."""

    def test_is_a_state_store(self, open_store: OpenStore) -> None:
        assert isinstance(open_store(), StateStore)

    def test_put_get_bytes(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("k", b"\x00\x01\xffbinary")
        assert store.get("k") == b"\x00\x01\xffbinary"

    def test_put_str_reads_back_utf8_bytes(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("k", "héllo ✓")
        assert store.get("k") == "héllo ✓".encode("utf-8")

    def test_put_empty_value(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("k", b"")
        assert store.get("k") == b""

    def test_overwrite_replaces(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("k", b"first, and longer")
        store.put("k", b"second")
        assert store.get("k") == b"second"

    def test_missing_key_is_none(self, open_store: OpenStore) -> None:
        store = open_store()
        assert store.get("never-written") is None
        assert store.get_counter("never-written") is None

    def test_large_value(self, open_store: OpenStore) -> None:
        store = open_store()
        blob = bytes(range(256)) * 1024  # 256 KiB
        store.put("blob", blob)
        assert store.get("blob") == blob

    def test_incr_and_get_counter(self, open_store: OpenStore) -> None:
        store = open_store()
        store.incr("n", 5)
        assert store.get_counter("n") == 5
        store.incr("n", 1)
        assert store.get_counter("n") == 6

    def test_incr_negative_amounts(self, open_store: OpenStore) -> None:
        store = open_store()
        store.incr("n", -3)
        assert store.get_counter("n") == -3
        store.incr("n", 10)
        store.incr("n", -10)
        assert store.get_counter("n") == -3

    def test_incr_zero_creates_counter(self, open_store: OpenStore) -> None:
        store = open_store()
        store.incr("z", 0)
        assert store.get_counter("z") == 0

    def test_large_counter_values(self, open_store: OpenStore) -> None:
        store = open_store()
        store.incr("big", 2 ** 62)
        store.incr("big", 2 ** 62 - 1)
        assert store.get_counter("big") == 2 ** 63 - 1
        store.incr("small", -(2 ** 63))
        assert store.get_counter("small") == -(2 ** 63)

    def test_delete_value(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("k", b"v")
        store.delete("k")
        assert store.get("k") is None

    def test_delete_counter(self, open_store: OpenStore) -> None:
        store = open_store()
        store.incr("n", 7)
        store.delete("n")
        assert store.get_counter("n") is None
        store.incr("n", 2)  # starts again from 0
        assert store.get_counter("n") == 2

    def test_delete_missing_key_is_not_an_error(self, open_store: OpenStore) -> None:
        store = open_store()
        store.delete("never-written")
        assert store.get("never-written") is None

    def test_delete_leaves_other_keys(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("a", b"1")
        store.put("b", b"2")
        store.incr("c", 3)
        store.delete("a")
        assert store.get("b") == b"2"
        assert store.get_counter("c") == 3

    @pytest.mark.parametrize(
        "key",
        ["a/b/c", "/leading", "a..b", "ключ", "键/值", "emoji🙂", "spaces and\ttabs", "%2F", "a" * 200],
    )
    def test_unusual_keys(self, open_store: OpenStore, key: str) -> None:
        store = open_store()
        store.put(key, key.encode("utf-8"))
        store.incr(key + "#n", 4)
        assert store.get(key) == key.encode("utf-8")
        assert store.get_counter(key + "#n") == 4
        store.delete(key)
        assert store.get(key) is None

    def test_dot_keys(self, open_store: OpenStore) -> None:
        store = open_store()
        for key in (".", "..", "...", "./x"):
            store.put(key, key.encode())
        for key in (".", ".."):
            store.incr(key + "#n", 1)
        assert [store.get(k) for k in (".", "..", "...", "./x")] == [b".", b"..", b"...", b"./x"]
        assert store.get_counter(".#n") == store.get_counter("..#n") == 1

    def test_similar_keys_do_not_collide(self, open_store: OpenStore) -> None:
        store = open_store()
        keys = ["a/b", "a%2Fb", "a_b", "A/b", "a/b/"]
        for i, key in enumerate(keys):
            store.put(key, str(i).encode())
        assert [store.get(k) for k in keys] == [str(i).encode() for i in range(len(keys))]

    def test_two_tables_are_isolated(self, open_store: OpenStore) -> None:
        one, two = open_store("fn_one"), open_store("fn_two")
        one.put("k", b"one")
        one.incr("n", 1)
        two.put("k", b"two")
        assert one.get("k") == b"one"
        assert two.get("k") == b"two"
        assert two.get_counter("n") is None
        two.delete("k")
        assert one.get("k") == b"one"

    def test_reopen_sees_data(self, open_store: OpenStore) -> None:
        store = open_store()
        store.put("k", b"kept")
        store.incr("n", 41)
        store.close()
        again = open_store()
        assert again.get("k") == b"kept"
        again.incr("n", 1)
        assert again.get_counter("n") == 42
