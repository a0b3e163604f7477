"""A small in-process BookKeeper table-service server for tests (gRPC on 127.0.0.1).

It implements the services of BookKeeper's stream storage with the protos shipped inside the
PyPI `apache-bookkeeper-client` package (`bookkeeper.proto.*_pb2_grpc`), keeping data in memory:

* RootRangeService: Create/Get/Delete Namespace and Stream, with the real server's name rules
  (letters, digits, '_'), ids (namespaces from 0, streams from 1024) and its habit of answering
  INTERNAL_SERVER_ERROR when the namespace/stream already exists (the client turns that into
  *ExistsError).
* TableService: Range, Put, Delete, Increment, Txn with the semantics of BookKeeper's MVCC store
  (`MVCCStoreImpl`/`TableStoreImpl`): keys live under the routing key (`r_key`), a key holds
  either bytes or a number (put on a number / incr on bytes -> BAD_REQUEST, which is where the
  real server maps ILLEGAL_OP), a range end is inclusive, a delete without `prev_kv` reports
  `deleted=0` (blind delete), revisions/versions advance like the real store.
* MetaRangeService.GetActiveRanges and StorageContainerService.GetStorageContainerEndpoint, which
  the Java client uses for routing.

Routing is checked like a real bookie: root-range calls must carry the `bk-rt-sc-id-bin`
metadata (container 0) and table calls `bk-rt-sid-bin` (the stream id, 8 bytes big-endian)
matching the request's RoutingHeader; otherwise the call fails with FAILED_PRECONDITION.

Usage::

    with start_table_server() as server:
        store = BookKeeperStateStore(server.url, "public", "default", "fn")
"""
from __future__ import annotations

import collections
import logging
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import grpc
from bookkeeper.proto import (
    common_pb2,
    kv_pb2,
    kv_rpc_pb2,
    kv_rpc_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
    stream_pb2,
)

logger = logging.getLogger(__name__)

MIN_DATA_STREAM_ID = 1024
NUM_STORAGE_CONTAINERS = 32
_SC_ID_KEY = "bk-rt-sc-id-bin"
_SID_KEY = "bk-rt-sid-bin"
_RKEY_KEY = "bk-rt-key-bin"

SUCCESS = storage_pb2.SUCCESS
BAD_REQUEST = storage_pb2.BAD_REQUEST
KEY_NOT_FOUND = storage_pb2.KEY_NOT_FOUND
# DistributedLog's MAX_LOGRECORD_SIZE (1 MB - 8 KB): the largest record the table service's store
# writes to its log; a put (or a Txn) above it is refused (the request's framing is not counted here).
MAX_RECORD = 1024 * 1024 - 8 * 1024


def _valid_name(name: str) -> bool:
    """BookKeeper's ProtoUtils.validateStreamName, which validateNamespaceName also uses: the
    distributedlog rule ("follow the rules that dlog uses"), checked per UTF-16 unit as Java's
    `charAt` sees it — not empty; no NUL, space, '<' or '>'; no unit strictly inside
    (0x0000, 0x001f), (0x007f, 0x009f), (0xd800, 0xf8ff) or (0xfff0, 0xffff). So '-' and '.'
    are fine (Pulsar function names such as `bucket-snapshot-writer`)."""
    if not name:
        return False
    raw = name.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(raw), 2):
        c = raw[i] | (raw[i + 1] << 8)
        if (c in (0, 0x20, 0x3C, 0x3E) or 0 < c < 0x1F or 0x7F < c < 0x9F or 0xD800 < c < 0xF8FF
                or 0xFFF0 < c < 0xFFFF):
            return False
    return True


def _store_key(r_key: bytes, key: bytes) -> bytes:
    # TableStoreUtils.newStoreKey: keys are scoped by their routing key.
    if r_key:
        return b"\x01" + r_key + b"\x00" + key
    return b"\x00" + key


def _display_key(store_key: bytes) -> bytes:
    # The python client routes every key by itself (r_key == key): 0x01 k 0x00 k.
    if store_key[:1] == b"\x01":
        n = (len(store_key) - 2) // 2
        if len(store_key) == 2 * n + 2 and store_key[1:n + 1] == store_key[n + 2:]:
            return store_key[n + 2:]
        return store_key[1:].partition(b"\x00")[2]
    return store_key[1:]


def _local_key(store_key: bytes, r_key: bytes) -> bytes:
    return store_key[len(r_key) + 2:] if r_key else store_key[1:]


@dataclass
class _Record:
    value: bytes
    is_number: bool
    number: int
    create_rev: int
    mod_rev: int
    version: int

    def to_kv(self, key: bytes, keys_only: bool = False) -> kv_pb2.KeyValue:
        return kv_pb2.KeyValue(
            key=key,
            value=b"" if keys_only else self.value,
            create_revision=self.create_rev,
            mod_revision=self.mod_rev,
            version=self.version,
            is_number=self.is_number,
            number_value=self.number if self.is_number else -1,  # what the real store sends for bytes
        )


class _TxnFailed(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Storage:
    """All namespaces, streams and table data; every method runs under the one lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.namespaces: Dict[str, stream_pb2.NamespaceProperties] = {}
        self.next_ns_id = 0
        self.streams: Dict[Tuple[str, str], stream_pb2.StreamProperties] = {}
        self.stream_ids: Dict[int, Tuple[str, str]] = {}
        self.next_stream_id = MIN_DATA_STREAM_ID
        self.tables: Dict[int, Dict[bytes, _Record]] = {}
        self.revision = 0

    def next_revision(self) -> int:
        self.revision += 1
        return self.revision

    # -- table ops on one stream's data (revision given by the caller) -------------------------

    def range(self, data: Dict[bytes, _Record], r_key: bytes, req: kv_rpc_pb2.RangeRequest
              ) -> kv_rpc_pb2.RangeResponse:
        start = _store_key(r_key, req.key)
        if req.range_end:
            end = _store_key(r_key, req.range_end)
            keys = sorted(k for k in data if start <= k <= end)
        else:
            keys = [start] if start in data else []
        more = False
        if req.limit > 0 and len(keys) > req.limit:
            keys, more = keys[: req.limit], True
        kvs = [] if req.count_only else [
            data[k].to_kv(_local_key(k, r_key), keys_only=req.keys_only) for k in keys
        ]
        return kv_rpc_pb2.RangeResponse(kvs=kvs, count=len(keys), more=more)

    def put(self, data: Dict[bytes, _Record], r_key: bytes, req: kv_rpc_pb2.PutRequest, rev: int
            ) -> Tuple[int, kv_rpc_pb2.PutResponse]:
        if len(req.key) + len(req.value) > MAX_RECORD:
            # The real store writes the put as one log record and fails it with
            # LogRecordTooLongException, which reaches the client as INTERNAL_SERVER_ERROR.
            return storage_pb2.INTERNAL_SERVER_ERROR, kv_rpc_pb2.PutResponse()
        key = _store_key(r_key, req.key)
        old = data.get(key)
        resp = kv_rpc_pb2.PutResponse()
        if old is not None:
            if old.is_number:
                return BAD_REQUEST, resp
            if req.prev_kv:
                resp.prev_kv.CopyFrom(old.to_kv(req.key))
            data[key] = _Record(bytes(req.value), False, 0, old.create_rev, rev, old.version + 1)
        else:
            data[key] = _Record(bytes(req.value), False, 0, rev, rev, 0)
        return SUCCESS, resp

    def delete(self, data: Dict[bytes, _Record], r_key: bytes, req: kv_rpc_pb2.DeleteRangeRequest
               ) -> Tuple[int, kv_rpc_pb2.DeleteRangeResponse]:
        start = _store_key(r_key, req.key)
        if req.range_end:
            end = _store_key(r_key, req.range_end)
            keys = sorted(k for k in data if start <= k <= end)
        else:
            keys = [start] if start in data else []
        resp = kv_rpc_pb2.DeleteRangeResponse()
        if req.prev_kv:
            resp.prev_kvs.extend(data[k].to_kv(_local_key(k, r_key)) for k in keys)
            resp.deleted = len(keys)
        # Without prev_kv the real store deletes blindly and reports 0 deleted.
        for k in keys:
            del data[k]
        return SUCCESS, resp

    def increment(self, data: Dict[bytes, _Record], r_key: bytes, req: kv_rpc_pb2.IncrementRequest,
                  rev: int) -> Tuple[int, kv_rpc_pb2.IncrementResponse]:
        key = _store_key(r_key, req.key)
        old = data.get(key)
        resp = kv_rpc_pb2.IncrementResponse()
        if old is not None and not old.is_number:
            return BAD_REQUEST, resp
        # Java long arithmetic: wraps around on overflow.
        total = ((old.number if old else 0) + req.amount + 2 ** 63) % 2 ** 64 - 2 ** 63
        raw = total.to_bytes(8, "big", signed=True)
        if old is None:
            data[key] = _Record(raw, True, total, rev, rev, 0)
        else:
            data[key] = _Record(raw, True, total, old.create_rev, rev, old.version + 1)
        if req.get_total:
            resp.total_amount = total
        return SUCCESS, resp

    def compare(self, data: Dict[bytes, _Record], r_key: bytes, cmp: kv_rpc_pb2.Compare) -> bool:
        # MVCCStoreImpl.processCompareOp.
        rec = data.get(_store_key(r_key, cmp.key))
        target = kv_rpc_pb2.Compare.CompareTarget.Name(cmp.target)
        result = kv_rpc_pb2.Compare.CompareResult.Name(cmp.result)
        expected: Optional[bytes] = bytes(cmp.value) if cmp.value else None
        if rec is None and target != "VALUE":
            raise _TxnFailed(KEY_NOT_FOUND)
        if target == "VALUE":
            if rec is None:
                if result == "EQUAL":
                    return expected is None
                if result == "NOT_EQUAL":
                    return expected is not None
                return False
            if expected is None:
                return result not in ("EQUAL", "LESS")
            diff = (rec.value > expected) - (rec.value < expected)
        else:
            assert rec is not None
            mine = {"VERSION": rec.version, "CREATE": rec.create_rev, "MOD": rec.mod_rev}[target]
            theirs = {"VERSION": cmp.version, "CREATE": cmp.create_revision, "MOD": cmp.mod_revision}[target]
            diff = (mine > theirs) - (mine < theirs)
        return {"LESS": diff < 0, "EQUAL": diff == 0, "GREATER": diff > 0, "NOT_EQUAL": diff != 0}[result]


def _metadata(context: grpc.ServicerContext) -> Dict[str, Any]:
    return {k: v for k, v in (context.invocation_metadata() or ())}


class _Base:
    def __init__(self, server: "TableServer") -> None:
        self._server = server
        self._st = server._storage

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        self._server._count(method)
        self._server._maybe_stall()

    def _require_root_routing(self, context: grpc.ServicerContext) -> None:
        sc = _metadata(context).get(_SC_ID_KEY)
        if sc is None or len(sc) != 8 or int.from_bytes(sc, "big") != 0:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"root range call without routing metadata {_SC_ID_KEY}=0 (got {sc!r})")


class _RootRange(_Base, storage_pb2_grpc.RootRangeServiceServicer):
    def CreateNamespace(self, request: storage_pb2.CreateNamespaceRequest, context: grpc.ServicerContext
                        ) -> storage_pb2.CreateNamespaceResponse:
        self._enter("CreateNamespace", context)
        self._require_root_routing(context)
        if not _valid_name(request.name):
            return storage_pb2.CreateNamespaceResponse(code=storage_pb2.INVALID_NAMESPACE_NAME)
        with self._st.lock:
            if request.name in self._st.namespaces:
                # RootRangeStoreImpl's txn fails -> INTERNAL_SERVER_ERROR ("TODO: differentiate").
                return storage_pb2.CreateNamespaceResponse(code=storage_pb2.INTERNAL_SERVER_ERROR)
            props = stream_pb2.NamespaceProperties(
                namespace_id=self._st.next_ns_id,
                namespace_name=request.name,
                default_stream_conf=request.ns_conf.default_stream_conf,
            )
            self._st.next_ns_id += 1
            self._st.next_revision()
            self._st.namespaces[request.name] = props
        logger.info("created namespace %s", request.name)
        return storage_pb2.CreateNamespaceResponse(code=SUCCESS, ns_props=props)

    def GetNamespace(self, request: storage_pb2.GetNamespaceRequest, context: grpc.ServicerContext
                     ) -> storage_pb2.GetNamespaceResponse:
        self._enter("GetNamespace", context)
        self._require_root_routing(context)
        if not _valid_name(request.name):
            return storage_pb2.GetNamespaceResponse(code=storage_pb2.INVALID_NAMESPACE_NAME)
        with self._st.lock:
            props = self._st.namespaces.get(request.name)
        if props is None:
            return storage_pb2.GetNamespaceResponse(code=storage_pb2.NAMESPACE_NOT_FOUND)
        return storage_pb2.GetNamespaceResponse(code=SUCCESS, ns_props=props)

    def DeleteNamespace(self, request: storage_pb2.DeleteNamespaceRequest, context: grpc.ServicerContext
                        ) -> storage_pb2.DeleteNamespaceResponse:
        self._enter("DeleteNamespace", context)
        self._require_root_routing(context)
        if not _valid_name(request.name):
            return storage_pb2.DeleteNamespaceResponse(code=storage_pb2.INVALID_NAMESPACE_NAME)
        with self._st.lock:
            if self._st.namespaces.pop(request.name, None) is None:
                return storage_pb2.DeleteNamespaceResponse(code=storage_pb2.NAMESPACE_NOT_FOUND)
            # The real store deletes the namespace's whole id range, streams included.
            for key in [k for k in self._st.streams if k[0] == request.name]:
                props = self._st.streams.pop(key)
                self._st.stream_ids.pop(props.stream_id, None)
                self._st.tables.pop(props.stream_id, None)
            self._st.next_revision()
        return storage_pb2.DeleteNamespaceResponse(code=SUCCESS)

    def _verify_stream(self, ns: str, name: str) -> int:
        if not _valid_name(ns):
            return storage_pb2.INVALID_NAMESPACE_NAME
        if not _valid_name(name):
            return storage_pb2.INVALID_STREAM_NAME
        return SUCCESS

    def CreateStream(self, request: storage_pb2.CreateStreamRequest, context: grpc.ServicerContext
                     ) -> storage_pb2.CreateStreamResponse:
        self._enter("CreateStream", context)
        self._require_root_routing(context)
        code = self._verify_stream(request.ns_name, request.name)
        if code != SUCCESS:
            return storage_pb2.CreateStreamResponse(code=code)
        with self._st.lock:
            if request.ns_name not in self._st.namespaces:
                return storage_pb2.CreateStreamResponse(code=storage_pb2.NAMESPACE_NOT_FOUND)
            if (request.ns_name, request.name) in self._st.streams:
                return storage_pb2.CreateStreamResponse(code=storage_pb2.INTERNAL_SERVER_ERROR)
            stream_id = self._st.next_stream_id
            self._st.next_stream_id += 1
            props = stream_pb2.StreamProperties(
                stream_id=stream_id,
                storage_container_id=stream_id % NUM_STORAGE_CONTAINERS,
                stream_name=request.name,
                stream_conf=request.stream_conf,
            )
            self._st.streams[(request.ns_name, request.name)] = props
            self._st.stream_ids[stream_id] = (request.ns_name, request.name)
            self._st.tables[stream_id] = {}
            self._st.next_revision()
        logger.info("created stream %s/%s id=%d", request.ns_name, request.name, stream_id)
        return storage_pb2.CreateStreamResponse(code=SUCCESS, stream_props=props)

    def GetStream(self, request: storage_pb2.GetStreamRequest, context: grpc.ServicerContext
                  ) -> storage_pb2.GetStreamResponse:
        self._enter("GetStream", context)
        self._require_root_routing(context)
        ns, name = request.stream_name.namespace_name, request.stream_name.stream_name
        code = self._verify_stream(ns, name)
        if code != SUCCESS:
            return storage_pb2.GetStreamResponse(code=code)
        with self._st.lock:
            if ns not in self._st.namespaces:
                return storage_pb2.GetStreamResponse(code=storage_pb2.NAMESPACE_NOT_FOUND)
            props = self._st.streams.get((ns, name))
        if props is None:
            return storage_pb2.GetStreamResponse(code=storage_pb2.STREAM_NOT_FOUND)
        return storage_pb2.GetStreamResponse(code=SUCCESS, stream_props=props)

    def DeleteStream(self, request: storage_pb2.DeleteStreamRequest, context: grpc.ServicerContext
                     ) -> storage_pb2.DeleteStreamResponse:
        self._enter("DeleteStream", context)
        self._require_root_routing(context)
        code = self._verify_stream(request.ns_name, request.name)
        if code != SUCCESS:
            return storage_pb2.DeleteStreamResponse(code=code)
        with self._st.lock:
            if request.ns_name not in self._st.namespaces:
                return storage_pb2.DeleteStreamResponse(code=storage_pb2.NAMESPACE_NOT_FOUND)
            props = self._st.streams.pop((request.ns_name, request.name), None)
            if props is None:
                return storage_pb2.DeleteStreamResponse(code=storage_pb2.STREAM_NOT_FOUND)
            self._st.stream_ids.pop(props.stream_id, None)
            self._st.tables.pop(props.stream_id, None)
            self._st.next_revision()
        return storage_pb2.DeleteStreamResponse(code=SUCCESS)


class _Table(_Base, kv_rpc_pb2_grpc.TableServiceServicer):
    def _route(self, header: kv_rpc_pb2.RoutingHeader, context: grpc.ServicerContext
               ) -> Optional[Dict[bytes, _Record]]:
        """Check the routing metadata; the stream's data, or None if the stream is unknown."""
        md = _metadata(context)
        sid = md.get(_SID_KEY)
        if sid is None or len(sid) != 8 or int.from_bytes(sid, "big") != header.stream_id:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"table call without routing metadata {_SID_KEY} matching stream id "
                          f"{header.stream_id} (got {sid!r})")
        rkey = md.get(_RKEY_KEY)
        if rkey is not None and bytes(rkey) != header.r_key:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"routing metadata {_RKEY_KEY}={rkey!r} differs from header r_key {header.r_key!r}")
        return self._st.tables.get(header.stream_id)

    @staticmethod
    def _header(code: int, routing: kv_rpc_pb2.RoutingHeader) -> kv_rpc_pb2.ResponseHeader:
        return kv_rpc_pb2.ResponseHeader(code=code, routing_header=routing)

    def Range(self, request: kv_rpc_pb2.RangeRequest, context: grpc.ServicerContext) -> kv_rpc_pb2.RangeResponse:
        self._enter("Range", context)
        with self._st.lock:
            data = self._route(request.header, context)
            if data is None:
                return kv_rpc_pb2.RangeResponse(header=self._header(storage_pb2.STREAM_NOT_FOUND, request.header))
            resp = self._st.range(data, request.header.r_key, request)
        resp.header.CopyFrom(self._header(SUCCESS, request.header))
        return resp

    def Put(self, request: kv_rpc_pb2.PutRequest, context: grpc.ServicerContext) -> kv_rpc_pb2.PutResponse:
        self._enter("Put", context)
        with self._st.lock:
            data = self._route(request.header, context)
            if data is None:
                return kv_rpc_pb2.PutResponse(header=self._header(storage_pb2.STREAM_NOT_FOUND, request.header))
            code, resp = self._st.put(data, request.header.r_key, request, self._st.next_revision())
        resp.header.CopyFrom(self._header(code, request.header))
        return resp

    def Delete(self, request: kv_rpc_pb2.DeleteRangeRequest, context: grpc.ServicerContext
               ) -> kv_rpc_pb2.DeleteRangeResponse:
        self._enter("Delete", context)
        with self._st.lock:
            data = self._route(request.header, context)
            if data is None:
                return kv_rpc_pb2.DeleteRangeResponse(
                    header=self._header(storage_pb2.STREAM_NOT_FOUND, request.header))
            self._st.next_revision()
            code, resp = self._st.delete(data, request.header.r_key, request)
        resp.header.CopyFrom(self._header(code, request.header))
        return resp

    def Increment(self, request: kv_rpc_pb2.IncrementRequest, context: grpc.ServicerContext
                  ) -> kv_rpc_pb2.IncrementResponse:
        self._enter("Increment", context)
        with self._st.lock:
            data = self._route(request.header, context)
            if data is None:
                return kv_rpc_pb2.IncrementResponse(
                    header=self._header(storage_pb2.STREAM_NOT_FOUND, request.header))
            code, resp = self._st.increment(data, request.header.r_key, request, self._st.next_revision())
        resp.header.CopyFrom(self._header(code, request.header))
        return resp

    def Txn(self, request: kv_rpc_pb2.TxnRequest, context: grpc.ServicerContext) -> kv_rpc_pb2.TxnResponse:
        self._enter("Txn", context)
        r_key = request.header.r_key
        with self._st.lock:
            data = self._route(request.header, context)
            if data is None:
                return kv_rpc_pb2.TxnResponse(header=self._header(storage_pb2.STREAM_NOT_FOUND, request.header))
            try:
                ok = all(self._st.compare(data, r_key, c) for c in request.compare)
            except _TxnFailed as failed:
                return kv_rpc_pb2.TxnResponse(header=self._header(failed.code, request.header))
            ops = request.success if ok else request.failure
            rev = self._st.next_revision()
            # Apply to a copy so a failing op leaves the table untouched, like one write batch.
            work = dict(data)
            responses: List[kv_rpc_pb2.ResponseOp] = []
            for op in ops:
                kind = op.WhichOneof("request")
                if kind == "request_put":
                    code, r = self._st.put(work, r_key, op.request_put, rev)
                    if code == storage_pb2.INTERNAL_SERVER_ERROR:  # one record: the whole Txn fails
                        return kv_rpc_pb2.TxnResponse(header=self._header(code, request.header))
                    r.header.CopyFrom(self._header(code, request.header))
                    responses.append(kv_rpc_pb2.ResponseOp(response_put=r))
                elif kind == "request_delete_range":
                    code, r = self._st.delete(work, r_key, op.request_delete_range)
                    r.header.CopyFrom(self._header(code, request.header))
                    responses.append(kv_rpc_pb2.ResponseOp(response_delete_range=r))
                elif kind == "request_range":
                    r = self._st.range(work, r_key, op.request_range)
                    r.header.CopyFrom(self._header(SUCCESS, request.header))
                    responses.append(kv_rpc_pb2.ResponseOp(response_range=r))
                else:
                    return kv_rpc_pb2.TxnResponse(header=self._header(BAD_REQUEST, request.header))
            data.clear()
            data.update(work)
        return kv_rpc_pb2.TxnResponse(header=self._header(SUCCESS, request.header), succeeded=ok,
                                      responses=responses)


class _MetaRange(_Base, storage_pb2_grpc.MetaRangeServiceServicer):
    def GetActiveRanges(self, request: storage_pb2.GetActiveRangesRequest, context: grpc.ServicerContext
                        ) -> storage_pb2.GetActiveRangesResponse:
        self._enter("GetActiveRanges", context)
        with self._st.lock:
            key = self._st.stream_ids.get(request.stream_id)
            props = self._st.streams.get(key) if key else None
        if props is None:
            return storage_pb2.GetActiveRangesResponse(code=storage_pb2.STREAM_NOT_FOUND)
        # ProtoUtils.split: an even number of ranges (at least 2) covering the hash space.
        n = max(2, props.stream_conf.initial_num_ranges)
        n += n % 2
        size = (2 ** 63 - 1) // (n // 2)
        start = -(2 ** 63)
        ranges = []
        for idx in range(n):
            end = 2 ** 63 - 1 if idx == n - 1 else start + size
            ranges.append(storage_pb2.RelatedRanges(
                props=stream_pb2.RangeProperties(
                    start_hash_key=start, end_hash_key=end, range_id=idx,
                    storage_container_id=props.storage_container_id),
                type=storage_pb2.CHILDREN,
            ))
            start = end
        return storage_pb2.GetActiveRangesResponse(code=SUCCESS, ranges=ranges)


class _StorageContainer(_Base, storage_pb2_grpc.StorageContainerServiceServicer):
    def GetStorageContainerEndpoint(self, request: storage_pb2.GetStorageContainerEndpointRequest,
                                    context: grpc.ServicerContext
                                    ) -> storage_pb2.GetStorageContainerEndpointResponse:
        self._enter("GetStorageContainerEndpoint", context)
        endpoint = common_pb2.Endpoint(hostname=self._server.host, port=self._server.port)
        return storage_pb2.GetStorageContainerEndpointResponse(
            status_code=SUCCESS,
            responses=[
                storage_pb2.OneStorageContainerEndpointResponse(
                    status_code=SUCCESS,
                    endpoint=storage_pb2.StorageContainerEndpoint(
                        storage_container_id=r.storage_container, revision=r.revision,
                        rw_endpoint=endpoint, ro_endpoint=[endpoint]),
                )
                for r in request.requests
            ],
        )


class TableServer:
    """A running in-memory table-service server; `.url` is `bk://127.0.0.1:PORT`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_workers: int = 16) -> None:
        self.host = host
        self._storage = _Storage()
        self._stop_event = threading.Event()
        self._stall_seconds = 0.0
        self._calls: "collections.Counter[str]" = collections.Counter()
        self._calls_lock = threading.Lock()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers,
                                                            thread_name_prefix="bk-table-server"))
        storage_pb2_grpc.add_RootRangeServiceServicer_to_server(_RootRange(self), self._grpc)
        storage_pb2_grpc.add_MetaRangeServiceServicer_to_server(_MetaRange(self), self._grpc)
        storage_pb2_grpc.add_StorageContainerServiceServicer_to_server(_StorageContainer(self), self._grpc)
        kv_rpc_pb2_grpc.add_TableServiceServicer_to_server(_Table(self), self._grpc)
        bound = self._grpc.add_insecure_port(f"{host}:{port}")
        if not bound:
            raise RuntimeError(f"bk table server could not bind {host}:{port}")
        self.port = bound
        self._grpc.start()
        logger.info("bk table server listening on %s", self.url)

    @property
    def url(self) -> str:
        """The service URL clients use: `bk://host:port`."""
        return f"bk://{self.host}:{self.port}"

    # -- test hooks -------------------------------------------------------------------------------

    def stall(self, seconds: float) -> None:
        """Make every following call wait `seconds` before answering (0 to stop); stop() cuts it short."""
        self._stall_seconds = max(0.0, float(seconds))

    def _maybe_stall(self) -> None:
        if self._stall_seconds > 0:
            self._stop_event.wait(self._stall_seconds)

    def _count(self, method: str) -> None:
        with self._calls_lock:
            self._calls[method] += 1

    def calls(self) -> Dict[str, int]:
        """How many calls of each gRPC method the server received."""
        with self._calls_lock:
            return dict(self._calls)

    def namespaces(self) -> List[str]:
        """Names of the namespaces that exist."""
        with self._storage.lock:
            return sorted(self._storage.namespaces)

    def stream(self, namespace: str, name: str) -> Optional[stream_pb2.StreamProperties]:
        """The stream's properties (id, configuration), or None."""
        with self._storage.lock:
            props = self._storage.streams.get((namespace, name))
            return None if props is None else stream_pb2.StreamProperties().FromString(props.SerializeToString())

    def items(self, namespace: str, name: str) -> Dict[bytes, Any]:
        """The table's contents as {key: bytes value or int counter} (keys without routing prefix)."""
        with self._storage.lock:
            props = self._storage.streams.get((namespace, name))
            if props is None:
                return {}
            out: Dict[bytes, Any] = {}
            for store_key, rec in self._storage.tables.get(props.stream_id, {}).items():
                key = _display_key(store_key)
                out[key] = rec.number if rec.is_number else rec.value
            return out

    # -- lifecycle --------------------------------------------------------------------------------

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (idempotent); in-flight calls are cancelled."""
        self._stop_event.set()
        self._grpc.stop(grace=0).wait(timeout)

    def __enter__(self) -> "TableServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_table_server(host: str = "127.0.0.1", port: int = 0) -> TableServer:
    """Start a table-service server on `host:port` (0 = a free port) and return it."""
    return TableServer(host, port)
