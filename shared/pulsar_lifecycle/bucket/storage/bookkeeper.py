"""Bucket snapshot storage in a BookKeeper table-service table (`bk://host:port`).

The table is opened like Pulsar's Python runtime opens function state (namespace
`<tenant>_<namespace>`, one stream), through `pulsar_lifecycle.state.bk_table.BookKeeperTable`
(deadlines on every call, errors naming the service). The table service only offers single-key
put/get/delete/increment here, so everything is laid out on point keys under a prefix:

    <p>ids                       counter: the last bucket id handed out (table-service number)
    <p>snap/<id>/info            JSON {"state": "writing"|"complete", "entries", "length",
                                 "bucket_key", "topic", "cursor"}; a snapshot exists for
                                 readers only once its info says "complete"
    <p>snap/<id>/<entry>         entry 0 = SnapshotMetadata, 1..N = SnapshotSegments
    <p>journal/meta              "<first live id>,<gc from>"
    <p>journal/<id>              journal records (20-digit ids: ids first..next-1 are contiguous)
    <p>manifest, <p>cursor       replaced atomically

Values above `chunk_size` are split: the table service writes each put (or Txn) as one record of
its own log, and refuses a record above `TABLE_SERVICE_MAX_RECORD` (DistributedLog's
MAX_LOGRECORD_SIZE, 1 MB - 8 KB, key and request included; the refused put comes back as error 500
and the stock client retries it for a minute). The key then holds a small header naming a fresh
version, and the chunks live under `<key>#<version>/<i>`; the header put is the atomic switch, old
chunks are deleted after it.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import threading
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

from ...state.base import StateError, table_namespace
from ...state.bk_table import DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, BookKeeperTable
from .base import (
    SnapshotNotFoundError,
    StorageError,
    check_bucket_id,
    check_entry_range,
    write_whole,
)
from .lease import LeaseLostError

logger = logging.getLogger(__name__)

TABLE_SERVICE_MAX_RECORD = 1024 * 1024 - 8 * 1024
# Room under the record limit for the key, the lease fence's compare and the request's framing.
MAX_CHUNK_SIZE = TABLE_SERVICE_MAX_RECORD - 16 * 1024
DEFAULT_CHUNK_SIZE = 512 * 1024
_INLINE = b"\x00"
_CHUNKED = b"\x01"
_CHUNK_HEADER = struct.Struct("<QIQI")  # version, chunks, total length, crc32


class _BkWriter:
    def __init__(self, owner: "BookKeeperTableSnapshotStorage", bucket_id: int, info: Dict[str, object]) -> None:
        self.bucket_id = bucket_id
        self._owner = owner
        self._info = info
        self._next_entry = 1
        self._length = 0

    def add_segment(self, data: bytes) -> None:
        self._owner._put_value(self._owner._entry_key(self.bucket_id, self._next_entry), bytes(data))
        self._next_entry += 1
        self._length += len(data)

    def finish(self, metadata: bytes) -> int:
        o = self._owner
        o._put_value(o._entry_key(self.bucket_id, 0), bytes(metadata))
        info = dict(self._info, state="complete", entries=self._next_entry,
                    length=self._length + len(metadata))
        o._put_value(o._info_key(self.bucket_id), json.dumps(info).encode(), replace=True)
        return self.bucket_id

    def abort(self) -> None:
        try:
            self._owner.delete(self.bucket_id)
        except Exception as exc:  # best effort: recovery finds it again through list_snapshots
            logger.warning("could not remove aborted bucket snapshot %d: %s", self.bucket_id, exc)


class BookKeeperTableSnapshotStorage:
    """BucketSnapshotStorage on BookKeeper's table service.

    `table` may be an open BookKeeperTable (shared connection); otherwise one is opened on
    `service_url` for `<tenant>_<namespace>/<table_name>`. `prefix` separates several indexes
    in one table.
    """

    def __init__(
        self,
        service_url: Optional[str] = None,
        tenant: str = "public",
        namespace: str = "default",
        table_name: str = "bucket_snapshots",
        *,
        prefix: str = "bucket/",
        table: Optional[BookKeeperTable] = None,
        routing_key: Optional[bytes] = None,
        fence: Optional[Tuple[bytes, bytes]] = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        create: bool = True,
    ) -> None:
        if not 1024 <= chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be within 1024..{MAX_CHUNK_SIZE} bytes (the table service "
                             f"refuses a record above {TABLE_SERVICE_MAX_RECORD}), got {chunk_size}")
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a str, got {prefix!r}")
        self._prefix = prefix.encode("utf-8")
        # routing_key: every key of this index under one routing key (one range), so a Txn can
        # guard its writes; fence: (key, value) every put and delete is conditioned on (the
        # partition lease's epoch record, bookkeeper_lease.py): a stale owner's write is refused.
        if fence is not None and routing_key is None:
            raise ValueError("a fenced BookKeeperTableSnapshotStorage needs a routing_key")
        self._rkey = routing_key
        self._fence = fence
        self._chunk = chunk_size
        self._own_table = table is None
        if table is None:
            if not service_url:
                raise ValueError("BookKeeperTableSnapshotStorage needs a service_url ('bk://host:port') or a table")
            try:
                # create=False: open an existing table only (read-only tools must not create one).
                table = BookKeeperTable(service_url, table_namespace(tenant, namespace), table_name, create=create,
                                        connect_timeout=connect_timeout, op_timeout=op_timeout)
            except StateError as exc:
                raise StorageError(str(exc)) from exc
        self._table = table
        self._jlock = threading.Lock()
        self._jfirst: Optional[int] = None
        self._jnext = 1

    def __repr__(self) -> str:
        return f"BookKeeperTableSnapshotStorage({self._table.service.url!r}, prefix={self._prefix.decode()!r})"

    # -- raw key helpers ----------------------------------------------------------------------
    def _k(self, name: str) -> bytes:
        return self._prefix + name.encode("utf-8")

    def _info_key(self, bucket_id: int) -> bytes:
        return self._k(f"snap/{bucket_id:020d}/info")

    def _entry_key(self, bucket_id: int, entry: int) -> bytes:
        return self._k(f"snap/{bucket_id:020d}/{entry}")

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except StateError as exc:
            raise StorageError(str(exc)) from exc

    def _tget(self, key: bytes):
        if self._rkey is None:
            return self._call(self._table.get, key)
        return self._call(self._table.routed_get, self._rkey, key)

    def _tput(self, key: bytes, value: bytes) -> None:
        if self._fence is not None:
            self._fenced(key, puts=[(key, value)])
        elif self._rkey is None:
            self._call(self._table.put, key, value)
        else:
            self._call(self._table.routed_put, self._rkey, key, value)

    def _tdelete(self, key: bytes) -> None:
        if self._fence is not None:
            self._fenced(key, deletes=[key])
        elif self._rkey is None:
            self._call(self._table.delete, key)
        else:
            self._call(self._table.routed_delete, self._rkey, key)

    def _tincr(self, key: bytes, amount: int) -> None:
        # Not fenced (a Txn has no increment): a stale owner's increment only skips bucket ids;
        # every write under an id it then got is fenced.
        if self._rkey is None:
            self._call(self._table.incr, key, amount)
        else:
            self._call(self._table.routed_incr, self._rkey, key, amount)

    def _fenced(self, key: bytes, puts=(), deletes=()) -> None:
        assert self._fence is not None and self._rkey is not None
        if not self._call(self._table.txn, self._rkey, [self._fence], puts, deletes):
            raise LeaseLostError(f"{self!r}: write of {key!r} refused: the partition lease "
                                 f"{self._fence[1].decode('utf-8', 'replace')} was taken over (this owner is fenced)")

    def _get_raw(self, key: bytes) -> Optional[bytes]:
        kv = self._tget(key)
        if kv is None:
            return None
        if kv.is_number:
            raise StorageError(f"{self!r}: key {key!r} holds a counter, expected bytes")
        return bytes(kv.value)

    def _put_value(self, key: bytes, data: bytes, replace: bool = False) -> None:
        """Put `data` under `key`; `replace` when an older (maybe chunked) value may exist."""
        old = self._get_raw(key) if replace else None
        if len(data) <= self._chunk:
            self._tput(key, _INLINE + data)
        else:
            version = int.from_bytes(os.urandom(8), "little")
            chunks = [data[i:i + self._chunk] for i in range(0, len(data), self._chunk)]
            for i, chunk in enumerate(chunks):
                self._tput(self._chunk_key(key, version, i), chunk)
            header = _CHUNK_HEADER.pack(version, len(chunks), len(data), zlib.crc32(data))
            self._tput(key, _CHUNKED + header)
        if old is not None and old[:1] == _CHUNKED:
            self._delete_chunks(key, old)

    @staticmethod
    def _chunk_key(key: bytes, version: int, i: int) -> bytes:
        return key + f"#{version:016x}/{i}".encode()

    def _delete_chunks(self, key: bytes, header_value: bytes) -> None:
        version, n, _, _ = _CHUNK_HEADER.unpack(header_value[1:])
        for i in range(n):
            self._tdelete(self._chunk_key(key, version, i))

    def _get_value(self, key: bytes) -> Optional[bytes]:
        raw = self._get_raw(key)
        if raw is None:
            return None
        if raw[:1] == _INLINE:
            return raw[1:]
        if raw[:1] != _CHUNKED or len(raw) != 1 + _CHUNK_HEADER.size:
            raise StorageError(f"{self!r}: key {key!r} holds an unknown value encoding")
        version, n, total, crc = _CHUNK_HEADER.unpack(raw[1:])
        parts = []
        for i in range(n):
            part = self._get_raw(self._chunk_key(key, version, i))
            if part is None:
                raise StorageError(f"{self!r}: key {key!r} chunk {i}/{n} is missing")
            parts.append(part)
        data = b"".join(parts)
        if len(data) != total or zlib.crc32(data) != crc:
            raise StorageError(f"{self!r}: key {key!r} chunks do not match their header")
        return data

    def _delete_value(self, key: bytes) -> None:
        raw = self._get_raw(key)
        if raw is None:
            return
        self._tdelete(key)
        if raw[:1] == _CHUNKED:
            self._delete_chunks(key, raw)

    # -- snapshots ----------------------------------------------------------------------------
    def _counter(self) -> int:
        kv = self._tget(self._k("ids"))
        if kv is None:
            return 0
        if not kv.is_number:
            raise StorageError(f"{self!r}: bucket id counter key holds bytes, expected a counter")
        return int(kv.number_value)

    def reserve_bucket_ids(self, count: int) -> int:
        """Reserve `count` consecutive ids for begin_snapshot(bucket_id=...); returns the first.
        Call it from one process (the seeder's driver): increment then read is not atomic."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise StorageError(f"{self!r}: reserve count must be a positive int, got {count!r}")
        self._tincr(self._k("ids"), count)
        return self._counter() - count + 1

    def begin_snapshot(self, bucket_key: str, topic: str, cursor: str,
                       bucket_id: Optional[int] = None) -> _BkWriter:
        if bucket_id is None:
            # Single writer per index: increment then read gives the id we allocated.
            self._tincr(self._k("ids"), 1)
            bid = self._counter()
        else:
            bid = check_bucket_id(bucket_id)
        info: Dict[str, object] = {"bucket_key": bucket_key, "topic": topic, "cursor": cursor}
        self._put_value(self._info_key(bid), json.dumps(dict(info, state="writing")).encode())
        return _BkWriter(self, bid, info)

    def create_snapshot(self, metadata: bytes, segments: Sequence[bytes], bucket_key: str,
                        topic: str, cursor: str) -> int:
        return write_whole(self, metadata, segments, bucket_key, topic, cursor)

    def _info(self, bucket_id: int) -> Dict[str, object]:
        check_bucket_id(bucket_id)
        raw = self._get_value(self._info_key(bucket_id))
        if raw is None:
            raise SnapshotNotFoundError(f"{self!r}: bucket snapshot {bucket_id} does not exist")
        info = json.loads(raw)
        if info.get("state") != "complete":
            raise SnapshotNotFoundError(f"{self!r}: bucket snapshot {bucket_id} was never completed")
        return info

    def snapshot_info(self, bucket_id: int) -> Dict[str, object]:
        """The custom metadata (bucket_key, topic, cursor) and sizes of a snapshot."""
        return dict(self._info(bucket_id))

    def _entry(self, bucket_id: int, entry: int) -> bytes:
        data = self._get_value(self._entry_key(bucket_id, entry))
        if data is None:
            raise StorageError(f"{self!r}: bucket snapshot {bucket_id} entry {entry} is missing")
        return data

    def get_metadata(self, bucket_id: int) -> bytes:
        self._info(bucket_id)
        return self._entry(bucket_id, 0)

    def get_segments(self, bucket_id: int, first: int, last: int) -> List[bytes]:
        info = self._info(bucket_id)
        check_entry_range(bucket_id, first, last, int(str(info["entries"])) - 1)
        return [self._entry(bucket_id, i) for i in range(first, last + 1)]

    def get_length(self, bucket_id: int) -> int:
        return int(str(self._info(bucket_id)["length"]))

    def delete(self, bucket_id: int) -> None:
        check_bucket_id(bucket_id)
        raw = self._get_value(self._info_key(bucket_id))
        if raw is None:
            return
        info = json.loads(raw)
        if info.get("state") == "complete":
            count = int(info["entries"])
            for i in range(count):
                self._delete_value(self._entry_key(bucket_id, i))
        else:
            # A crash (or abort) while writing: entries 1..k exist contiguously, maybe entry 0.
            self._delete_value(self._entry_key(bucket_id, 0))
            i = 1
            while self._get_raw(self._entry_key(bucket_id, i)) is not None:
                self._delete_value(self._entry_key(bucket_id, i))
                i += 1
        # The info goes last: until then the snapshot stays findable for a retry.
        self._delete_value(self._info_key(bucket_id))

    def list_snapshots(self, after_id: int = 0) -> List[int]:
        # Ids come from a counter: probe the ids above `after_id` (callers pass the highest id
        # they already know, so this is a handful of gets).
        top = self._counter()
        return [bid for bid in range(max(after_id, 0) + 1, top + 1)
                if self._get_raw(self._info_key(bid)) is not None]

    # -- journal ------------------------------------------------------------------------------
    def _jkey(self, rid: int) -> bytes:
        return self._k(f"journal/{rid:020d}")

    def _jmeta(self) -> Tuple[int, int]:
        raw = self._get_value(self._k("journal/meta"))
        if raw is None:
            return 1, 1
        try:
            first, gc_from = (int(x) for x in raw.decode().split(","))
        except ValueError:
            raise StorageError(f"{self!r}: journal meta {raw!r} is malformed") from None
        return first, gc_from

    def _jopen(self) -> int:
        """Load the journal's bounds once; returns the first record id."""
        if self._jfirst is not None:
            return self._jfirst
        first, gc_from = self._jmeta()
        for rid in range(gc_from, first):  # finish a truncation interrupted by a crash
            self._delete_value(self._jkey(rid))
        if gc_from < first:
            self._put_value(self._k("journal/meta"), f"{first},{first}".encode(), replace=True)
        nxt = first
        while self._get_raw(self._jkey(nxt)) is not None:
            nxt += 1
        self._jfirst, self._jnext = first, nxt
        return first

    def journal_append(self, record: bytes) -> int:
        with self._jlock:
            self._jopen()
            rid = self._jnext
            self._put_value(self._jkey(rid), bytes(record))
            self._jnext = rid + 1
            return rid

    def journal_read(self) -> List[Tuple[int, bytes]]:
        with self._jlock:
            self._jfirst = None  # re-read from the table
            first = self._jopen()
            out = []
            for rid in range(first, self._jnext):
                data = self._get_value(self._jkey(rid))
                if data is None:
                    break
                out.append((rid, data))
            return out

    def journal_peek(self) -> List[Tuple[int, bytes]]:
        """journal_read without finishing an interrupted truncation (which writes): records from
        the journal's first id on, until the first missing one."""
        first, _ = self._jmeta()
        out: List[Tuple[int, bytes]] = []
        rid = first
        while True:
            data = self._get_value(self._jkey(rid))
            if data is None:
                return out
            out.append((rid, data))
            rid += 1

    def journal_truncate(self, upto: int) -> None:
        with self._jlock:
            first = self._jopen()
            new_first = max(first, upto + 1)
            if new_first == first:
                return
            # Move the start first: a crash part-way leaves only garbage below it (gc_from).
            self._put_value(self._k("journal/meta"), f"{new_first},{first}".encode(), replace=True)
            for rid in range(first, min(new_first, self._jnext)):
                self._delete_value(self._jkey(rid))
            self._put_value(self._k("journal/meta"), f"{new_first},{new_first}".encode(), replace=True)
            self._jfirst = new_first
            self._jnext = max(self._jnext, new_first)

    # -- manifest / cursor --------------------------------------------------------------------
    def get_manifest(self) -> Optional[bytes]:
        return self._get_value(self._k("manifest"))

    def put_manifest(self, data: bytes) -> None:
        self._put_value(self._k("manifest"), bytes(data), replace=True)

    def get_cursor(self) -> Optional[bytes]:
        return self._get_value(self._k("cursor"))

    def put_cursor(self, data: bytes) -> None:
        self._put_value(self._k("cursor"), bytes(data), replace=True)

    def get_index_id(self) -> Optional[str]:
        """The id of the index this store holds (see scheduler/index_identity.py), or None."""
        raw = self._get_value(self._k("index-id"))
        return raw.decode("ascii", "replace").strip() if raw is not None else None

    def put_index_id(self, index_id: str) -> None:
        self._put_value(self._k("index-id"), index_id.encode("ascii"), replace=True)

    def describe(self) -> str:
        """Where this store lives, for messages to operators."""
        return f"BookKeeper table {self!r}"

    def close(self) -> None:
        if self._own_table:
            self._table.close()
