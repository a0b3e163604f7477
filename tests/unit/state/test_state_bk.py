"""BookKeeperStateStore against the local table-service server, over gRPC on 127.0.0.1."""
from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest
from bookkeeper import types as bk_types
from bookkeeper.admin.client import Client as AdminClient
from bookkeeper.kv.client import Client as KvClient

from pulsar_lifecycle.state import (
    DirectoryStateStore,
    StateError,
    StateStore,
    open_state_store,
)
from pulsar_lifecycle.state.bk_table import (
    BookKeeperStateStore,
    BookKeeperTable,
    new_bk_table_conf,
    parse_bk_url,
)
from servers.bk_table_server import TableServer, start_table_server
from support.state_contract import StateStoreContract

TENANT, NAMESPACE = "my-tenant", "my-ns"
TABLE_NS = "my_tenant_my_ns"


@pytest.fixture(scope="module")
def server() -> Iterator[TableServer]:
    with start_table_server() as srv:
        yield srv


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A table-name-safe prefix unique to the test (tables outlive a test on the shared server)."""
    return re.sub(r"\W", "_", request.node.name)


@pytest.fixture
def open_store(server: TableServer, unique: str) -> Iterator[Callable[..., StateStore]]:
    opened: List[BookKeeperStateStore] = []

    def _open(table: str = "fn") -> StateStore:
        store = BookKeeperStateStore(server.url, TENANT, NAMESPACE, f"{unique}_{table}")
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


class TestBookKeeperContract(StateStoreContract):
    """The shared StateStore behaviour, through the bookkeeper client and the gRPC server."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pulsar_style_table(url: str, table_ns: str, table: str):  # type: ignore[no-untyped-def]
    """A table opened the way Pulsar's state_context.py does (plain client, no extras)."""
    settings = bk_types.StorageClientSettings(service_uri=url)
    return KvClient(storage_client_settings=settings, namespace=table_ns).table(table_name=table)


# -- naming and creation --------------------------------------------------------------------------


def test_creates_namespace_and_table_with_pulsar_naming(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, "acme-corp", "orders-eu", unique) as store:
        assert (store.table_ns, store.table_name) == ("acme_corp_orders_eu", unique)
    assert "acme_corp_orders_eu" in server.namespaces()
    # Seen over the wire by an independent admin client, as Pulsar's admin would.
    admin = AdminClient(storage_client_settings=bk_types.StorageClientSettings(service_uri=server.url))
    props = admin.namespace("acme_corp_orders_eu").get(stream_name=unique)
    assert props.stream_name == unique
    assert props.stream_conf == new_bk_table_conf(1)
    assert props.stream_conf.storage_type == 1  # TABLE
    assert props.stream_conf.min_num_ranges == props.stream_conf.initial_num_ranges == 1


def test_second_table_reuses_namespace(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, "reuse", "ns", f"{unique}_a"):
        pass
    before = server.calls().get("CreateNamespace", 0)
    with BookKeeperStateStore(server.url, "reuse", "ns", f"{unique}_b"):
        pass
    assert server.calls().get("CreateNamespace", 0) == before
    assert server.stream("reuse_ns", f"{unique}_b") is not None


def test_existing_table_is_not_recreated(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique) as store:
        store.put("k", b"v")
    stream_id = server.stream(TABLE_NS, unique).stream_id  # type: ignore[union-attr]
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique) as store:
        assert store.get("k") == b"v"
    assert server.stream(TABLE_NS, unique).stream_id == stream_id  # type: ignore[union-attr]


def test_concurrent_openers_share_one_table(server: TableServer, unique: str) -> None:
    errors: List[BaseException] = []

    def open_and_put(i: int) -> None:
        try:
            with BookKeeperStateStore(server.url, "race", f"ns_{unique}", "fn") as store:
                store.incr("opens", 1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_and_put, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors
    with BookKeeperStateStore(server.url, "race", f"ns_{unique}", "fn") as store:
        assert store.get_counter("opens") == 6


def test_invalid_table_name_is_a_clear_error(server: TableServer) -> None:
    # BookKeeper's stream-name rule (distributedlog's): no space, '<', '>', NUL or control characters.
    for bad in ("my function", "a<b", "tab\there"):
        with pytest.raises(StateError, match=re.escape(f"table name {bad!r} is invalid")):
            BookKeeperStateStore(server.url, TENANT, NAMESPACE, bad)


def test_function_names_with_dashes_and_dots_are_valid_tables(server: TableServer, unique: str) -> None:
    """Pulsar function names (`bucket-snapshot-writer`) are stream names the real service takes."""
    name = f"bucket-snapshot-writer.{unique}"
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, name) as store:
        store.put("k", "v")
        assert store.get("k") == b"v"


# -- compatibility with Pulsar's runtime ------------------------------------------------------------


def test_state_written_by_pulsar_style_client_is_readable(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique) as store:
        table = _pulsar_style_table(server.url, TABLE_NS, unique)
        table.put_str("greeting", "hello")          # Context.put_state
        table.incr_str("visits", 3)                 # Context.incr_counter
        assert store.get("greeting") == b"hello"
        assert store.get_counter("visits") == 3
        store.put("reply", "world")
        store.incr("visits", -1)
        assert table.get_str("reply").value == b"world"        # Context.get_state
        assert table.get_str("visits").number_value == 2       # Context.get_counter
        table.delete_str("visits")                              # Context.del_counter
        assert store.get_counter("visits") is None


def test_keys_are_stored_as_utf8(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique) as store:
        store.put("ключ/1", b"v")
        store.incr("n", 2)
    assert server.items(TABLE_NS, unique) == {"ключ/1".encode(): b"v", b"n": 2}


def test_a_key_holds_bytes_or_a_counter_not_both(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique) as store:
        store.incr("n", 5)
        with pytest.raises(StateError, match="holds a counter"):
            store.put("n", b"x")
        store.put("b", b"bytes")
        with pytest.raises(StateError, match="holds bytes"):
            store.incr("b", 1)
        # As Pulsar's get_state: a counter reads as its 8-byte big-endian value.
        assert store.get("n") == (5).to_bytes(8, "big", signed=True)
        assert store.get_counter("b") is None
        assert store.get_counter("n") == 5 and store.get("b") == b"bytes"


def test_value_and_key_types_are_checked(server: TableServer, unique: str) -> None:
    with BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique) as store:
        with pytest.raises(TypeError, match="must be bytes or str"):
            store.put("k", 12)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="state key must be str"):
            store.get(b"k")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="amount"):
            store.incr("n", 1.5)  # type: ignore[arg-type]
        store.put("ba", bytearray(b"xy"))
        store.put("mv", memoryview(b"zw"))
        assert (store.get("ba"), store.get("mv")) == (b"xy", b"zw")


def test_raw_table_helper(server: TableServer, unique: str) -> None:
    table = BookKeeperTable(server.url, "snapshots", unique)
    try:
        table.put(b"\x00bucket/1", b"\x01\x02")
        kv = table.get(b"\x00bucket/1")
        assert kv is not None and kv.value == b"\x01\x02" and not kv.is_number
        assert table.get(b"missing") is None
        table.incr(b"ids", 10)
        assert table.get(b"ids").number_value == 10  # type: ignore[union-attr]
        table.delete(b"\x00bucket/1")
        table.delete(b"missing")
        assert table.get(b"\x00bucket/1") is None
        assert table.stream_id == server.stream("snapshots", unique).stream_id  # type: ignore[union-attr]
    finally:
        table.close()


def test_raw_table_without_create_needs_existing_table(server: TableServer, unique: str) -> None:
    with pytest.raises(StateError, match=r"open table failed"):
        BookKeeperTable(server.url, "nowhere", unique, create=False)


# -- errors and bounded waits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, problem",
    [
        ("http://127.0.0.1:4181", "scheme 'http'"),
        ("127.0.0.1:4181", "scheme"),
        ("bk://127.0.0.1", "no port"),
        ("bk://:4181", "no host"),
        ("bk://127.0.0.1:notaport", "invalid port"),
        ("bk://a:1,b:2", "several hosts"),
        ("bk://127.0.0.1:4181/path", "extra parts"),
        ("", "non-empty"),
    ],
)
def test_bad_url_is_a_clear_error(url: str, problem: str) -> None:
    with pytest.raises(StateError, match=re.escape(problem)):
        BookKeeperStateStore(url, TENANT, NAMESPACE, "fn")


def test_parse_bk_url() -> None:
    parsed = parse_bk_url("bk://bookie-1.example:4181")
    assert (parsed.host, parsed.port, parsed.target) == ("bookie-1.example", 4181, "bookie-1.example:4181")
    assert parse_bk_url("bk://[::1]:4181").target == "[::1]:4181"


def test_unreachable_url_fails_within_a_few_seconds() -> None:
    url = f"bk://127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StateError, match=re.escape(url) + ".*unreachable"):
        BookKeeperStateStore(url, TENANT, NAMESPACE, "fn")  # default timeouts
    assert time.monotonic() - started < 15


def test_silent_peer_fails_within_the_connect_timeout() -> None:
    # Accepts TCP connections but never speaks HTTP/2.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"bk://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(StateError, match="unreachable"):
            BookKeeperStateStore(url, TENANT, NAMESPACE, "fn", connect_timeout=0.5)


def test_stalled_server_call_times_out(unique: str) -> None:
    with start_table_server() as srv:
        store = BookKeeperStateStore(srv.url, TENANT, NAMESPACE, unique, op_timeout=0.5)
        try:
            srv.stall(10)
            with pytest.raises(StateError, match=re.escape(srv.url) + ".*put"):
                store.put("k", b"v")
            srv.stall(0)
        finally:
            store.close()


def test_server_gone_after_open_is_a_state_error(unique: str) -> None:
    srv = start_table_server()
    store = BookKeeperStateStore(srv.url, TENANT, NAMESPACE, unique, op_timeout=2.0)
    try:
        store.put("k", b"v")
        srv.stop()
        with pytest.raises(StateError, match=re.escape(srv.url)):
            store.get("k")
    finally:
        store.close()
        srv.stop()


def test_closed_store_raises_state_error(server: TableServer, unique: str) -> None:
    store = BookKeeperStateStore(server.url, TENANT, NAMESPACE, unique)
    store.close()
    with pytest.raises(StateError):
        store.get("k")


def test_bad_timeouts_are_rejected(server: TableServer) -> None:
    with pytest.raises(StateError, match="timeouts must be positive"):
        BookKeeperStateStore(server.url, TENANT, NAMESPACE, "fn", op_timeout=0)


# -- the factory ---------------------------------------------------------------------------------------


def test_factory_bk_url_opens_table_service(server: TableServer, unique: str, tmp_path: Path) -> None:
    store = open_state_store(server.url, tmp_path, TENANT, NAMESPACE, unique)
    try:
        assert isinstance(store, BookKeeperStateStore)
        store.put("k", "v")
        assert server.items(TABLE_NS, unique) == {b"k": b"v"}
        assert list(tmp_path.iterdir()) == []
    finally:
        store.close()


@pytest.mark.parametrize("url", [None, ""])
def test_factory_without_url_is_directory_store(url: object, tmp_path: Path) -> None:
    store = open_state_store(url, tmp_path, TENANT, NAMESPACE, "fn")  # type: ignore[arg-type]
    assert isinstance(store, DirectoryStateStore)


@pytest.mark.parametrize("url", ["s3://bucket/state", "http://127.0.0.1:4181", "file:///tmp/x"])
def test_factory_rejects_other_urls(url: str, tmp_path: Path) -> None:
    with pytest.raises(StateError, match=re.escape(url)):
        open_state_store(url, tmp_path, TENANT, NAMESPACE, "fn")


def test_factory_bk_url_without_port_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="no port"):
        open_state_store("bk://127.0.0.1", tmp_path, TENANT, NAMESPACE, "fn")


# -- the test server itself: it must hold clients to the real wire contract --------------------------


def test_server_rejects_calls_without_routing_metadata(server: TableServer) -> None:
    import grpc
    from bookkeeper.proto import kv_rpc_pb2, storage_pb2
    from bookkeeper.proto.kv_rpc_pb2_grpc import TableServiceStub
    from bookkeeper.proto.storage_pb2_grpc import RootRangeServiceStub

    with grpc.insecure_channel(parse_bk_url(server.url).target) as channel:
        with pytest.raises(grpc.RpcError) as root_err:
            RootRangeServiceStub(channel).GetNamespace(storage_pb2.GetNamespaceRequest(name="x"), timeout=5)
        assert root_err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as table_err:
            TableServiceStub(channel).Range(
                kv_rpc_pb2.RangeRequest(key=b"k", header=kv_rpc_pb2.RoutingHeader(stream_id=1024, r_key=b"k")),
                timeout=5,
            )
        assert table_err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_server_txn_compare_and_put(server: TableServer, unique: str) -> None:
    import grpc
    from bookkeeper.proto import kv_rpc_pb2, storage_pb2
    from bookkeeper.proto.kv_rpc_pb2_grpc import TableServiceStub

    table = BookKeeperTable(server.url, "txn", unique)
    try:
        sid = table.stream_id
        table.put(b"m", b"v1")
    finally:
        table.close()
    header = kv_rpc_pb2.RoutingHeader(stream_id=sid, r_key=b"m")
    md = [("bk-rt-sid-bin", sid.to_bytes(8, "big")), ("bk-rt-key-bin", b"m")]

    def cas(expected: bytes, new: bytes) -> bool:
        req = kv_rpc_pb2.TxnRequest(
            header=header,
            compare=[kv_rpc_pb2.Compare(key=b"m", target=kv_rpc_pb2.Compare.VALUE,
                                        result=kv_rpc_pb2.Compare.EQUAL, value=expected)],
            success=[kv_rpc_pb2.RequestOp(request_put=kv_rpc_pb2.PutRequest(key=b"m", value=new, header=header))],
        )
        with grpc.insecure_channel(parse_bk_url(server.url).target) as channel:
            resp = TableServiceStub(channel).Txn(req, metadata=md, timeout=5)
        assert resp.header.code == storage_pb2.SUCCESS
        return resp.succeeded

    assert cas(b"v1", b"v2") is True
    assert cas(b"v1", b"v3") is False
    assert server.items("txn", unique) == {b"m": b"v2"}
