"""In-memory BucketSnapshotStorage (tests and benchmarks; nothing survives the process)."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from .base import SnapshotNotFoundError, StorageError, check_bucket_id, check_entry_range, write_whole


class _MemoryWriter:
    def __init__(self, owner: "MemorySnapshotStorage", bucket_id: int, info: Dict[str, str]) -> None:
        self.bucket_id = bucket_id
        self._owner = owner
        self._info = info
        self._segments: List[bytes] = []

    def add_segment(self, data: bytes) -> None:
        self._segments.append(bytes(data))

    def finish(self, metadata: bytes) -> int:
        with self._owner._lock:
            self._owner._snapshots[self.bucket_id] = [bytes(metadata)] + self._segments
            self._owner._info[self.bucket_id] = self._info
        return self.bucket_id

    def abort(self) -> None:
        self._segments = []


class MemorySnapshotStorage:
    """Everything in process memory: for tests and benchmarks only (not durable).

    An engine dropped and recovered against the same object sees what a restarted process
    would see with a durable backend.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: Dict[int, List[bytes]] = {}
        self._info: Dict[int, Dict[str, str]] = {}
        self._next_id = 0
        self._journal: List[Tuple[int, bytes]] = []
        self._journal_next = 1
        self._manifest: Optional[bytes] = None
        self._cursor: Optional[bytes] = None
        self._index_id: Optional[str] = None

    def get_index_id(self) -> Optional[str]:
        return self._index_id

    def put_index_id(self, index_id: str) -> None:
        self._index_id = index_id

    def describe(self) -> str:
        return "memory snapshot storage"

    def reserve_bucket_ids(self, count: int) -> int:
        """Reserve `count` consecutive ids for begin_snapshot(bucket_id=...); returns the first."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise StorageError(f"memory storage: reserve count must be a positive int, got {count!r}")
        with self._lock:
            self._next_id += count
            return self._next_id - count + 1

    def begin_snapshot(self, bucket_key: str, topic: str, cursor: str,
                       bucket_id: Optional[int] = None) -> _MemoryWriter:
        if bucket_id is None:
            bid = self.reserve_bucket_ids(1)
        else:
            bid = check_bucket_id(bucket_id)
        return _MemoryWriter(self, bid, {"bucket_key": bucket_key, "topic": topic, "cursor": cursor})

    def create_snapshot(self, metadata: bytes, segments: Sequence[bytes], bucket_key: str,
                        topic: str, cursor: str) -> int:
        return write_whole(self, metadata, segments, bucket_key, topic, cursor)

    def _entries(self, bucket_id: int) -> List[bytes]:
        check_bucket_id(bucket_id)
        entries = self._snapshots.get(bucket_id)
        if entries is None:
            raise SnapshotNotFoundError(f"memory storage: bucket snapshot {bucket_id} does not exist")
        return entries

    def get_metadata(self, bucket_id: int) -> bytes:
        with self._lock:
            return self._entries(bucket_id)[0]

    def get_segments(self, bucket_id: int, first: int, last: int) -> List[bytes]:
        with self._lock:
            entries = self._entries(bucket_id)
            check_entry_range(bucket_id, first, last, len(entries) - 1)
            return entries[first:last + 1]

    def get_length(self, bucket_id: int) -> int:
        with self._lock:
            return sum(len(e) for e in self._entries(bucket_id))

    def delete(self, bucket_id: int) -> None:
        check_bucket_id(bucket_id)
        with self._lock:
            self._snapshots.pop(bucket_id, None)
            self._info.pop(bucket_id, None)

    def list_snapshots(self, after_id: int = 0) -> List[int]:
        with self._lock:
            return sorted(b for b in self._snapshots if b > after_id)

    def snapshot_info(self, bucket_id: int) -> Dict[str, str]:
        """The custom metadata (bucket_key, topic, cursor) of a snapshot."""
        with self._lock:
            self._entries(bucket_id)
            return dict(self._info[bucket_id])

    def journal_append(self, record: bytes) -> int:
        with self._lock:
            rid = self._journal_next
            self._journal_next += 1
            self._journal.append((rid, bytes(record)))
            return rid

    def journal_read(self) -> List[Tuple[int, bytes]]:
        with self._lock:
            return list(self._journal)

    def journal_peek(self) -> List[Tuple[int, bytes]]:
        """The same as journal_read (a memory store has nothing to repair)."""
        return self.journal_read()

    def journal_truncate(self, upto: int) -> None:
        with self._lock:
            self._journal = [(i, r) for i, r in self._journal if i > upto]
            self._journal_next = max(self._journal_next, upto + 1)

    def get_manifest(self) -> Optional[bytes]:
        with self._lock:
            return self._manifest

    def put_manifest(self, data: bytes) -> None:
        with self._lock:
            self._manifest = bytes(data)

    def get_cursor(self) -> Optional[bytes]:
        with self._lock:
            return self._cursor

    def put_cursor(self, data: bytes) -> None:
        with self._lock:
            self._cursor = bytes(data)

    def close(self) -> None:
        pass
