"""Function state in BookKeeper's table service, reached like Pulsar's Python runtime does.

Pulsar's `state_context.BKManagedStateContext` opens the table with the PyPI package
`apache-bookkeeper-client`: an admin client gets (or creates) the namespace
`<tenant>_<namespace>` and the stream `<function name>` configured by `new_bk_table_conf(1)`,
then `bookkeeper.kv.Client(...).table(name)` does put/get/incr/delete. This module does the
same, with the same keys and encodings, so a function's state is shared with Pulsar's runtime.

Two things are added for a production process that must never hang:
* every gRPC call carries a deadline (the stock client sends none and would wait forever on a
  peer that accepts the TCP connection but never answers), and the first connection must be up
  within `connect_timeout`;
* every client error becomes a `StateError` naming the service URL and the operation.

`BookKeeperTable` is the reusable connection helper (bytes keys, raw table calls); the bucket
snapshot storage uses it too. `BookKeeperStateStore` is the `StateStore` on top of it.
"""
from __future__ import annotations

import collections
import logging
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
from bookkeeper import types as bk_types
from bookkeeper.admin.client import Client as AdminClient
from bookkeeper.admin.namespaces import Namespaces
from bookkeeper.common import exceptions as bk_exceptions
from bookkeeper.kv.client import Client as KvClient
from bookkeeper.proto import kv_pb2, kv_rpc_pb2, stream_pb2
from bookkeeper.proto.storage_pb2_grpc import RootRangeServiceStub

from .base import StateError, table_namespace

logger = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_OP_TIMEOUT = 10.0

_T = TypeVar("_T")


@dataclass(frozen=True)
class BkServiceUrl:
    """A parsed `bk://host:port` table-service URL."""

    url: str
    host: str
    port: int

    @property
    def target(self) -> str:
        """The gRPC target `host:port` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_bk_url(url: str) -> BkServiceUrl:
    """Validate a BookKeeper table-service URL of the form `bk://host:port`.

    Raises StateError naming the URL and what is wrong with it.
    """
    if not isinstance(url, str) or not url:
        raise StateError(f"BookKeeper state URL must be a non-empty 'bk://host:port' string, got {url!r}")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() != "bk":
        raise StateError(
            f"BookKeeper state URL {url!r} has scheme {parsed.scheme or '(none)'!r}; expected 'bk://host:port'"
        )
    if "," in parsed.netloc:
        raise StateError(f"BookKeeper state URL {url!r} lists several hosts; expected one 'bk://host:port'")
    try:
        port = parsed.port
    except ValueError as exc:
        raise StateError(f"BookKeeper state URL {url!r} has an invalid port: {exc}") from exc
    if not parsed.hostname:
        raise StateError(f"BookKeeper state URL {url!r} has no host; expected 'bk://host:port'")
    if port is None:
        raise StateError(f"BookKeeper state URL {url!r} has no port; expected 'bk://host:port' (usually 4181)")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment or parsed.username:
        raise StateError(f"BookKeeper state URL {url!r} has extra parts; expected exactly 'bk://host:port'")
    return BkServiceUrl(url=url, host=parsed.hostname, port=port)


def new_bk_table_conf(num_ranges: int) -> stream_pb2.StreamConfiguration:
    """The stream configuration Pulsar's Python runtime creates function state tables with."""
    return stream_pb2.StreamConfiguration(
        key_type=stream_pb2.RangeKeyType.Value("HASH"),
        min_num_ranges=num_ranges,
        initial_num_ranges=num_ranges,
        split_policy=stream_pb2.SplitPolicy(
            type=stream_pb2.SplitPolicyType.Value("FIXED"),
            fixed_range_policy=stream_pb2.FixedRangeSplitPolicy(num_ranges=2),
        ),
        rolling_policy=stream_pb2.SegmentRollingPolicy(
            size_policy=stream_pb2.SizeBasedSegmentRollingPolicy(max_segment_size=128 * 1024 * 1024)
        ),
        retention_policy=stream_pb2.RetentionPolicy(
            time_policy=stream_pb2.TimeBasedRetentionPolicy(retention_minutes=-1)
        ),
        storage_type=stream_pb2.StorageType.Value("TABLE"),
    )


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _DeadlineInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Gives every unary call a deadline; the bookkeeper client never sets one."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        if details.timeout is None:
            details = _CallDetails(
                details.method,
                self._timeout,
                details.metadata,
                details.credentials,
                getattr(details, "wait_for_ready", None),
                getattr(details, "compression", None),
            )
        return continuation(details, request)


def _use_channel(client: Any, channel: grpc.Channel) -> None:
    """Point a bookkeeper admin/kv client at `channel` instead of the one it made itself.

    The clients expose no channel options, so this is the only way to get deadlines on their
    calls (and a channel that can be closed: they have no close()).
    """
    own = getattr(client, "__channel__", None)
    if own is None or not hasattr(client, "__root_range__"):
        raise StateError("unsupported apache-bookkeeper-client version: no __channel__/__root_range__ on its clients")
    own.close()
    client.__channel__ = channel
    root_range = RootRangeServiceStub(channel=channel)
    client.__root_range__ = root_range
    if hasattr(client, "__namespaces__"):
        client.__namespaces__ = Namespaces(root_range)


def _bad_java_char(c: int) -> bool:
    """A UTF-16 unit ProtoUtils.validateStreamName refuses (its ranges are exclusive)."""
    return (c in (0, 0x20, 0x3C, 0x3E) or 0 < c < 0x1F or 0x7F < c < 0x9F or 0xD800 < c < 0xF8FF
            or 0xFFF0 < c < 0xFFFF)


def _check_name(kind: str, name: str) -> None:
    # BookKeeper's ProtoUtils.validateStreamName (namespaces use it too) follows distributedlog's
    # stream-name rule, per UTF-16 unit; say so up front instead of surfacing INVALID_*_NAME
    # from deep inside the client.
    raw = name.encode("utf-16-le", "surrogatepass") if name else b""
    if not name or any(_bad_java_char(raw[i] | (raw[i + 1] << 8)) for i in range(0, len(raw), 2)):
        raise StateError(
            f"BookKeeper {kind} name {name!r} is invalid: the table service refuses empty names, NUL, space, "
            "'<', '>' and control characters (distributedlog's stream-name rule)"
        )


class BookKeeperTable:
    """One open table-service table (bytes keys), with bounded, error-mapped calls.

    Opens the table the way Pulsar's runtime does, creating the namespace and the stream when
    missing. All methods raise StateError naming the URL on any failure.
    """

    def __init__(
        self,
        service_url: str,
        table_ns: str,
        table_name: str,
        *,
        create: bool = True,
        stream_conf: Optional[stream_pb2.StreamConfiguration] = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
    ) -> None:
        self.service = parse_bk_url(service_url)
        if not (connect_timeout > 0 and op_timeout > 0):
            raise StateError(
                f"timeouts must be positive (connect_timeout={connect_timeout!r}, op_timeout={op_timeout!r})"
            )
        _check_name("namespace", table_ns)
        _check_name("table", table_name)
        self.table_ns = table_ns
        self.table_name = table_name
        self._raw_channel = grpc.insecure_channel(self.service.target)
        self._channel = grpc.intercept_channel(self._raw_channel, _DeadlineInterceptor(op_timeout))
        try:
            self._wait_connected(connect_timeout)
            settings = bk_types.StorageClientSettings(service_uri=f"bk://{self.service.target}")
            admin = AdminClient(storage_client_settings=settings)
            _use_channel(admin, self._channel)
            if create:
                self._ensure_stream(admin, stream_conf or new_bk_table_conf(1))
            kv = KvClient(storage_client_settings=settings, namespace=table_ns)
            _use_channel(kv, self._channel)
            self._table = self._call("open table", lambda: kv.table(table_name=table_name))
        except BaseException:
            self._raw_channel.close()
            raise
        logger.info("opened BookKeeper table %s/%s at %s", table_ns, table_name, self.service.url)

    def _where(self) -> str:
        return f"BookKeeper table service at {self.service.url} (table {self.table_ns}/{self.table_name})"

    def _wait_connected(self, timeout: float) -> None:
        try:
            grpc.channel_ready_future(self._raw_channel).result(timeout=timeout)
        except grpc.FutureTimeoutError as exc:
            raise StateError(
                f"BookKeeper table service at {self.service.url} is unreachable: no connection within {timeout:g} s"
            ) from exc

    def _call(self, what: str, fn: Callable[[], _T], bad_request_hint: str = "") -> _T:
        try:
            return fn()
        except StateError:
            raise
        except bk_exceptions.BadRequest as exc:
            raise StateError(f"{self._where()}: {what} rejected{bad_request_hint}: {exc}") from exc
        except bk_exceptions.BKError as exc:
            raise StateError(f"{self._where()}: {what} failed: {exc}") from exc
        except grpc.RpcError as exc:
            raise StateError(f"{self._where()}: {what} failed: {exc}") from exc
        except ValueError as exc:
            # grpc raises ValueError for calls on a closed channel.
            raise StateError(f"{self._where()}: {what} failed: {exc}") from exc

    def _ensure_stream(self, admin: AdminClient, conf: stream_pb2.StreamConfiguration) -> None:
        # Same sequence as Pulsar's BKManagedStateContext.__init__, tolerating a concurrent creator.
        ns = admin.namespace(self.table_ns)

        def create_stream() -> None:
            try:
                ns.create(stream_name=self.table_name, stream_config=conf)
                logger.info("created BookKeeper table %s/%s at %s", self.table_ns, self.table_name, self.service.url)
            except bk_exceptions.StreamExistsError:
                pass

        def ensure() -> None:
            try:
                ns.get(stream_name=self.table_name)
            except bk_exceptions.NamespaceNotFoundError:
                try:
                    admin.namespaces().create(namespace=self.table_ns)
                    logger.info("created BookKeeper namespace %s at %s", self.table_ns, self.service.url)
                except bk_exceptions.NamespaceExistsError:
                    pass
                create_stream()
            except bk_exceptions.StreamNotFoundError:
                create_stream()

        self._call("create namespace/table", ensure)

    @property
    def stream_id(self) -> int:
        """The table's stream id in the table service."""
        return int(self._table.__stream_props__.stream_id)

    def put(self, key: bytes, value: bytes) -> None:
        """Store `value` under `key` (a key holding a counter cannot be overwritten: StateError)."""
        self._call(f"put {key!r}", lambda: self._table.put(key, value),
                   " (the key holds a counter; a table-service key holds either bytes or a counter)")

    def get(self, key: bytes) -> Optional[kv_pb2.KeyValue]:
        """The stored record for `key` (`.value`, `.is_number`, `.number_value`), or None."""
        return self._call(f"get {key!r}", lambda: self._table.get(key))

    def incr(self, key: bytes, amount: int) -> None:
        """Add `amount` to the counter `key` (a key holding bytes cannot be incremented: StateError)."""
        self._call(f"incr {key!r}", lambda: self._table.incr(key, amount),
                   " (the key holds bytes, not a counter)")

    def delete(self, key: bytes) -> None:
        """Remove `key`; a missing key is not an error."""
        self._call(f"delete {key!r}", lambda: self._table.delete(key))

    # -- routed calls: keys scoped by an explicit routing key ------------------------------------
    # The python client routes every key by itself (r_key == key). A Txn runs in the range of its
    # one routing key and its compares and operations see the keys under that routing key only,
    # so keys that must be changed together with a guard (a partition's lease and its index) are
    # all read and written under one shared routing key through these calls.
    def _routing(self, r_key: bytes) -> Tuple[kv_rpc_pb2.RoutingHeader, List[Tuple[str, bytes]]]:
        sid = self.stream_id
        return (kv_rpc_pb2.RoutingHeader(stream_id=sid, r_key=r_key),
                [("bk-rt-sid-bin", sid.to_bytes(8, "big")), ("bk-rt-key-bin", r_key)])

    def _service(self) -> Any:
        return self._table.__table_service__  # the client's TableServiceStub (not name-mangled)

    def routed_put(self, r_key: bytes, key: bytes, value: bytes) -> None:
        """put under routing key `r_key`."""
        header, md = self._routing(r_key)
        req = kv_rpc_pb2.PutRequest(key=key, value=value, header=header)
        self._call(f"put {key!r}", lambda: bk_exceptions.from_table_rpc_response(self._service().Put(req, metadata=md)),
                   " (the key holds a counter; a table-service key holds either bytes or a counter)")

    def routed_get(self, r_key: bytes, key: bytes) -> Optional[kv_pb2.KeyValue]:
        """get under routing key `r_key`."""
        header, md = self._routing(r_key)
        req = kv_rpc_pb2.RangeRequest(key=key, header=header)
        resp = self._call(f"get {key!r}",
                          lambda: bk_exceptions.from_table_rpc_response(self._service().Range(req, metadata=md)))
        return resp.kvs[0] if resp.count else None

    def routed_delete(self, r_key: bytes, key: bytes) -> None:
        """delete under routing key `r_key` (a missing key is not an error)."""
        header, md = self._routing(r_key)
        req = kv_rpc_pb2.DeleteRangeRequest(key=key, header=header)
        self._call(f"delete {key!r}",
                   lambda: bk_exceptions.from_table_rpc_response(self._service().Delete(req, metadata=md)))

    def routed_incr(self, r_key: bytes, key: bytes, amount: int) -> None:
        """incr under routing key `r_key`."""
        header, md = self._routing(r_key)
        req = kv_rpc_pb2.IncrementRequest(key=key, amount=amount, header=header)
        self._call(f"incr {key!r}",
                   lambda: bk_exceptions.from_table_rpc_response(self._service().Increment(req, metadata=md)),
                   " (the key holds bytes, not a counter)")

    def txn(self, r_key: bytes, guards: Sequence[Tuple[bytes, bytes]],
            puts: Sequence[Tuple[bytes, bytes]] = (), deletes: Sequence[bytes] = ()) -> bool:
        """Atomically: if every guard key's value equals the given bytes (b"" = the key is absent),
        apply `puts` and `deletes`; returns whether the guards held (nothing changed if not)."""
        header, md = self._routing(r_key)
        value_target = kv_rpc_pb2.Compare.CompareTarget.Value("VALUE")
        equal = kv_rpc_pb2.Compare.CompareResult.Value("EQUAL")
        req = kv_rpc_pb2.TxnRequest(
            header=header,
            compare=[kv_rpc_pb2.Compare(target=value_target, result=equal, key=k, value=v) for k, v in guards],
            success=[kv_rpc_pb2.RequestOp(request_put=kv_rpc_pb2.PutRequest(key=k, value=v, header=header))
                     for k, v in puts]
            + [kv_rpc_pb2.RequestOp(request_delete_range=kv_rpc_pb2.DeleteRangeRequest(key=k, header=header))
               for k in deletes])
        resp = self._call("txn", lambda: bk_exceptions.from_table_rpc_response(self._service().Txn(req, metadata=md)))
        return bool(resp.succeeded)

    def close(self) -> None:
        """Close the gRPC channel. Calls after close raise StateError."""
        self._raw_channel.close()


Value = Union[bytes, bytearray, memoryview, str]


def _key_bytes(key: str) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"state key must be str, not {type(key).__name__}")
    # Pulsar's put_str/get_str/incr_str encode the key as UTF-8.
    return key.encode("utf-8")


class BookKeeperStateStore:
    """A function's state table in BookKeeper's table service (`bk://host:port`).

    Keys and values are stored exactly as Pulsar's runtime stores them (UTF-8 keys; str values
    UTF-8 encoded; counters as table-service numbers), so Pulsar functions and this store see
    the same state. Like the table service itself, a key holds either bytes or a counter: `put`
    on a counter key or `incr` on a bytes key raises StateError; `get` on a counter key returns
    its raw 8-byte big-endian value (as Pulsar's `get_state` would) and `get_counter` on a bytes
    key returns None.
    """

    def __init__(
        self,
        service_url: str,
        tenant: str,
        namespace: str,
        table: str,
        *,
        create: bool = True,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
    ) -> None:
        # create=False: open an existing table only (read-only tools must not create one).
        self.table_ns = table_namespace(tenant, namespace)
        self.table_name = table
        self._table = BookKeeperTable(
            service_url,
            self.table_ns,
            table,
            create=create,
            connect_timeout=connect_timeout,
            op_timeout=op_timeout,
        )

    @property
    def url(self) -> str:
        """The service URL this store talks to."""
        return self._table.service.url

    def put(self, key: str, value: Value) -> None:
        """Store `value` (bytes, or str encoded as UTF-8) under `key`."""
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        else:
            raise TypeError(f"state value for key {key!r} must be bytes or str, not {type(value).__name__}")
        self._table.put(_key_bytes(key), data)

    def get(self, key: str) -> Optional[bytes]:
        """The bytes stored under `key`, or None."""
        kv = self._table.get(_key_bytes(key))
        return None if kv is None else bytes(kv.value)

    def incr(self, key: str, amount: int) -> None:
        """Add `amount` (may be negative) to the counter `key`, created at 0."""
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"counter amount for key {key!r} must be int, not {type(amount).__name__}")
        self._table.incr(_key_bytes(key), amount)

    def get_counter(self, key: str) -> Optional[int]:
        """The counter's value, or None when `key` was never incremented."""
        kv = self._table.get(_key_bytes(key))
        if kv is None or not kv.is_number:
            return None
        return int(kv.number_value)

    def delete(self, key: str) -> None:
        """Remove `key` (value or counter); a missing key is not an error."""
        self._table.delete(_key_bytes(key))

    def close(self) -> None:
        """Close the connection."""
        self._table.close()

    def __enter__(self) -> "BookKeeperStateStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
