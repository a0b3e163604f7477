"""Snapshot storage for the bucket index (PIP-195's BucketSnapshotStorage, plus what we need).

A bucket snapshot is what Pulsar writes into one BookKeeper ledger: entry 0 is the serialized
SnapshotMetadata, entries 1..N the serialized SnapshotSegments. Bucket ids are positive and
strictly increasing (Pulsar: the ledger id). Besides snapshots a storage keeps
* the journal of the last mutable bucket (append-only records with increasing ids),
* the manifest (Pulsar keeps the bucket list in cursor properties) and
* the release cursor (the watermark; Pulsar's mark-delete position),
the last two each replaced atomically.

Every method may be called from any thread. Errors are StorageError naming the storage and
the bucket/record; a missing snapshot is SnapshotNotFoundError.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

from ...exceptions import PulsarLifecycleError


class SnapshotStorageError(PulsarLifecycleError, RuntimeError):
    """The snapshot storage could not do what was asked."""


# The name the engine and older callers use; one class, two names.
StorageError = SnapshotStorageError


class SnapshotNotFoundError(SnapshotStorageError):
    """The bucket snapshot does not exist (Pulsar: BucketNotExistException)."""


@runtime_checkable
class SnapshotWriter(Protocol):
    """A snapshot being written segment by segment (merges stream their output)."""

    bucket_id: int

    def add_segment(self, data: bytes) -> None:
        """Append the next segment (entry 1, 2, ...)."""

    def finish(self, metadata: bytes) -> int:
        """Write entry 0, make the snapshot durable and visible; returns bucket_id."""

    def abort(self) -> None:
        """Drop everything written so far (best effort, never raises)."""


@runtime_checkable
class BucketSnapshotStorage(Protocol):
    """What the bucket engine needs from a storage backend."""

    # -- PIP-195 BucketSnapshotStorage --------------------------------------------------------
    def create_snapshot(self, metadata: bytes, segments: Sequence[bytes], bucket_key: str,
                        topic: str, cursor: str) -> int:
        """Write a whole snapshot durably; returns its bucket id."""

    def begin_snapshot(self, bucket_key: str, topic: str, cursor: str,
                       bucket_id: Optional[int] = None) -> SnapshotWriter:
        """Start a snapshot to be written segment by segment: under a new bucket id, or under
        `bucket_id` from `reserve_bucket_ids(count)` (the offline seeder writes snapshots from
        several processes under ids its driver reserved)."""

    def reserve_bucket_ids(self, count: int) -> int:
        """Durably reserve `count` consecutive bucket ids for begin_snapshot(bucket_id=...); returns the first."""

    def get_metadata(self, bucket_id: int) -> bytes:
        """Entry 0 (SnapshotMetadata bytes)."""

    def get_segments(self, bucket_id: int, first: int, last: int) -> List[bytes]:
        """Entries first..last inclusive (1-based segment entry ids)."""

    def get_length(self, bucket_id: int) -> int:
        """Total bytes of the snapshot."""

    def delete(self, bucket_id: int) -> None:
        """Delete the snapshot; a missing one is success."""

    def list_snapshots(self, after_id: int = 0) -> List[int]:
        """Ids of existing snapshots greater than `after_id`, ascending (finds orphans)."""

    # -- journal ------------------------------------------------------------------------------
    def journal_append(self, record: bytes) -> int:
        """Durably append a record; returns its id (greater than every id before)."""

    def journal_read(self) -> List[Tuple[int, bytes]]:
        """Every record not truncated, in id order."""

    def journal_truncate(self, upto: int) -> None:
        """Drop records with id <= upto; later appends still get ids > upto."""

    def snapshot_info(self, bucket_id: int) -> Mapping[str, object]:
        """What was recorded with the snapshot (bucket key, topic, cursor); SnapshotNotFoundError if absent."""

    # -- index identity (scheduler/index_identity.py) -------------------------------------------
    def get_index_id(self) -> Optional[str]:
        """The id of the index this store holds, or None before the first put."""

    def put_index_id(self, index_id: str) -> None:
        """Record the index id."""

    # -- manifest and cursor ------------------------------------------------------------------
    def get_manifest(self) -> Optional[bytes]:
        """The manifest, or None before the first put."""

    def put_manifest(self, data: bytes) -> None:
        """Atomically replace the manifest."""

    def get_cursor(self) -> Optional[bytes]:
        """The release cursor, or None before the first put."""

    def put_cursor(self, data: bytes) -> None:
        """Atomically replace the release cursor."""

    def close(self) -> None:
        """Release resources."""


@runtime_checkable
class JournalPeek(Protocol):
    """A store whose journal can be read without changing anything (inspection while a writer runs)."""

    def journal_peek(self) -> List[Tuple[int, bytes]]:
        """Every complete record not truncated, in id order; never repairs, creates or truncates
        anything (a torn tail of an append in progress is left out, not cut off)."""


def check_bucket_id(bucket_id: int) -> int:
    """Validate a bucket id (positive int)."""
    if isinstance(bucket_id, bool) or not isinstance(bucket_id, int) or bucket_id <= 0:
        raise StorageError(f"bucket id must be a positive int, got {bucket_id!r}")
    return bucket_id


def check_entry_range(bucket_id: int, first: int, last: int, segments: int) -> None:
    """Validate a 1-based segment entry range against a snapshot with `segments` segments."""
    if not (isinstance(first, int) and isinstance(last, int)) or first < 1 or last < first or last > segments:
        raise StorageError(
            f"bucket {bucket_id}: segment entries {first}..{last} out of range (snapshot has 1..{segments})"
        )


def write_whole(storage: BucketSnapshotStorage, metadata: bytes, segments: Sequence[bytes],
                bucket_key: str, topic: str, cursor: str, bucket_id: Optional[int] = None) -> int:
    """create_snapshot in terms of begin_snapshot (shared by the backends); `bucket_id` = an id
    reserved with reserve_bucket_ids (None = allocate one)."""
    writer = (storage.begin_snapshot(bucket_key, topic, cursor) if bucket_id is None
              else storage.begin_snapshot(bucket_key, topic, cursor, bucket_id=bucket_id))
    try:
        for seg in segments:
            writer.add_segment(seg)
        return writer.finish(metadata)
    except BaseException:
        writer.abort()
        raise
