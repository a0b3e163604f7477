"""DirectoryStateStore: the shared StateStore behaviour plus durability on disk."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from pulsar_lifecycle.state import DirectoryStateStore, StateError, StateStore, open_state_store
from support.state_contract import StateStoreContract

TENANT, NAMESPACE = "my-tenant", "my-ns"


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., StateStore]]:
    opened: List[StateStore] = []

    def _open(table: str = "fn") -> StateStore:
        store = DirectoryStateStore(tmp_path, TENANT, NAMESPACE, table)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


class TestDirectoryContract(StateStoreContract):
    """The shared StateStore behaviour on the local directory backend."""

    pass


def test_layout_uses_pulsar_table_naming(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path, "acme-corp", "orders-eu", "fn")
    store.put("k", b"v")
    assert store.path == tmp_path / "acme_corp_orders_eu" / "fn"
    assert (store.path / "values").is_dir() and (store.path / "counters").is_dir()


def test_keys_with_slashes_and_unicode_stay_single_files(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path, TENANT, NAMESPACE, "fn")
    keys = ["a/b/../c", "ключ/значение", "...", "%2F", "a/"]
    for key in keys:
        store.put(key, key.encode())
    files = list((store.path / "values").iterdir())
    assert len(files) == len(keys)
    assert all(f.parent == store.path / "values" for f in files)
    assert not any(p.name.endswith(".tmp") for p in store.path.rglob("*"))


def test_empty_key(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path, TENANT, NAMESPACE, "fn")
    store.put("", b"empty key")
    assert store.get("") == b"empty key"


def test_survives_reopening_with_a_new_instance(tmp_path: Path) -> None:
    first = DirectoryStateStore(tmp_path, TENANT, NAMESPACE, "fn")
    first.put("k/1", "ü")
    first.incr("n", -9)
    first.incr("gone", 1)
    first.delete("gone")
    first.close()
    second = DirectoryStateStore(tmp_path, TENANT, NAMESPACE, "fn")
    assert second.get("k/1") == "ü".encode()
    assert second.get_counter("n") == -9
    assert second.get_counter("gone") is None


def test_value_and_counter_under_same_key_are_separate(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path, TENANT, NAMESPACE, "fn")
    store.put("k", b"v")
    store.incr("k", 2)
    assert (store.get("k"), store.get_counter("k")) == (b"v", 2)
    store.delete("k")
    assert (store.get("k"), store.get_counter("k")) == (None, None)


def test_unwritable_root_is_a_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    with pytest.raises(StateError, match="cannot create state directory"):
        DirectoryStateStore(blocker, TENANT, NAMESPACE, "fn")


def test_factory_opens_directory_store_that_persists(tmp_path: Path) -> None:
    store = open_state_store(None, tmp_path, TENANT, NAMESPACE, "fn")
    store.put("k", b"v")
    store.close()
    assert open_state_store("", tmp_path, TENANT, NAMESPACE, "fn").get("k") == b"v"


def test_keys_longer_than_a_file_name_are_stored_and_kept_apart(tmp_path: Path) -> None:
    # A dedup snapshot key names its producer and topic; with long names the quoted key is more
    # than NAME_MAX bytes, which failed every put with ENAMETOOLONG.
    store = DirectoryStateStore(tmp_path, "public", "default", "fn")
    long_a = "dedup/" + "p" * 300 + "/persistent://public/default/" + "t" * 200 + "-a"
    long_b = long_a[:-1] + "b"  # same prefix, different key
    near = "k" * 250  # fits: stays under its plain quoted name
    for key, value in ((long_a, b"A"), (long_b, b"B"), (near, b"N")):
        store.put(key, value)
    store.incr(long_a, 3)
    reopened = DirectoryStateStore(tmp_path, "public", "default", "fn")
    assert (reopened.get(long_a), reopened.get(long_b), reopened.get(near)) == (b"A", b"B", b"N")
    assert reopened.get_counter(long_a) == 3
    assert (store.path / "values" / near).is_file()
    assert all(len(p.name) <= 255 for p in (store.path / "values").iterdir())
    reopened.delete(long_a)
    assert reopened.get(long_a) is None and reopened.get(long_b) == b"B"
