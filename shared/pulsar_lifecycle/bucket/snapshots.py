"""The index's snapshot files in the storage: write a whole snapshot, read one segment, hand
obsolete snapshots to the deleter (Pulsar's Bucket.asyncSaveBucketSnapshot, asyncLoadNextBucketSnapshotEntry's read and
asyncDeleteBucketSnapshot).

It tracks which snapshot ids are being written (still "in use" for the two-phase deletion oracle)
and which wait to be handed to the deleter (retried until the hand-off succeeds; the ids are also
in the manifest's pending_delete, so a crash loses none).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Set

from .config import BucketConfig
from .immutable_bucket import ImmutableBucket
from .metrics import OpMetrics
from .segments import CutSegment
from .storage import BucketSnapshotStorage, SnapshotWriter

logger = logging.getLogger(__name__)

ObsoleteCallback = Callable[[int, str], None]


class BucketSnapshots:
    """Snapshot I/O of one index. `state_lock` is the index's lock for in-memory state: `writing`
    is read under it by the index's queries."""

    def __init__(self, storage: BucketSnapshotStorage, config: BucketConfig, metrics: OpMetrics,
                 state_lock: threading.Lock, on_obsolete: Optional[ObsoleteCallback] = None) -> None:
        self.storage = storage
        self._config = config
        self._metrics = metrics
        self._lock = state_lock
        self._on_obsolete = on_obsolete or self.delete_directly
        self.writing: Set[int] = set()  # ids of snapshots being written (guarded by state_lock)
        self.pending_delete: Dict[int, str] = {}  # id -> bucket key ("" when unknown), to hand off

    def delete_directly(self, bucket_id: int, key: str) -> None:
        """The default hand-off: delete the snapshot from the storage."""
        t0 = time.monotonic()
        ok = False
        try:
            self.storage.delete(bucket_id)
            ok = True
            logger.info("deleted bucket snapshot %d (%s)", bucket_id, key)
        finally:
            self._metrics.record("delete", ok, (time.monotonic() - t0) * 1000)

    def begin(self, key: str) -> SnapshotWriter:
        """Start writing a snapshot; its id counts as in use until finished() or abort()."""
        writer = self.storage.begin_snapshot(key, self._config.topic, self._config.cursor)
        with self._lock:
            self.writing.add(writer.bucket_id)
        return writer

    def finished(self, bucket_id: int) -> None:
        """The snapshot is in the index now (call with the state lock held)."""
        self.writing.discard(bucket_id)

    def abort(self, writer: Optional[SnapshotWriter], key: str) -> None:
        """Drop a half-written snapshot; its id is queued for deletion in case bytes reached storage."""
        if writer is None:
            return
        writer.abort()
        with self._lock:
            self.writing.discard(writer.bucket_id)
        self.pending_delete.setdefault(writer.bucket_id, key)

    def write(self, key: str, segments: Sequence[CutSegment], metadata: bytes, op: str) -> Optional[int]:
        """Write a whole snapshot; its id, or None (logged, counted as `op`) when the storage refused."""
        t0 = time.monotonic()
        writer = None
        try:
            writer = self.begin(key)
            for seg in segments:
                writer.add_segment(seg.data)
            bid = writer.finish(metadata)
        except Exception as exc:
            self._metrics.record(op, False, (time.monotonic() - t0) * 1000)
            logger.warning("creating bucket snapshot %s failed: %s", key, exc)
            self.abort(writer, key)
            return None
        self._metrics.record(op, True, (time.monotonic() - t0) * 1000)
        return bid

    def new_bucket(self, bid: int, key: str, start: int, end: int, segments: Sequence[CutSegment]) -> ImmutableBucket:
        """The in-memory bucket of a snapshot just written from `segments`."""
        try:
            length = self.storage.get_length(bid)
        except Exception as exc:
            logger.warning("bucket %d: could not read snapshot length: %s", bid, exc)
            length = sum(len(s.data) for s in segments)
        return ImmutableBucket.from_segments(bid, key, start, end, segments, length)

    def read_segment(self, bucket: ImmutableBucket, k: int) -> Optional[bytes]:
        """Segment k (0-based) of `bucket`; None (logged, counted) when the storage failed."""
        t0 = time.monotonic()
        try:
            data = self.storage.get_segments(bucket.bucket_id, k + 1, k + 1)[0]
        except Exception as exc:
            self._metrics.record("load", False, (time.monotonic() - t0) * 1000)
            logger.warning("loading segment %d of bucket %d failed (will retry): %s", k + 1, bucket.bucket_id, exc)
            return None
        self._metrics.record("load", True, (time.monotonic() - t0) * 1000)
        return data

    def hand_off_obsolete(self) -> None:
        """Give every snapshot waiting for deletion to the deleter; failures stay queued."""
        for bid, key in list(self.pending_delete.items()):
            try:
                self._on_obsolete(bid, key)
            except Exception as exc:
                logger.warning("handing obsolete bucket snapshot %d to the deleter failed (will retry): %s", bid, exc)
                continue
            self.pending_delete.pop(bid, None)
