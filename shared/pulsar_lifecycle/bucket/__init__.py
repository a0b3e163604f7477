"""PIP-195 bucket-based delayed-message index with snapshots (pure: no Pulsar I/O).

Public API: BucketIndex (the engine), BucketConfig, DelayedMessage, Release, CancelResult,
RecoveryReport, BucketStats, the storage protocol and its backends (memory, directory; the
BookKeeper table-service backend lives in `pulsar_lifecycle.bucket.storage.bookkeeper`).
"""
from .config import BucketConfig
from .engine import BucketIndex
from .exceptions import CorruptRecordError, EngineFailedError, NotRecoveredError
from .keys import bucket_key, parse_bucket_key
from .records import BucketStats, CancelResult, DelayedMessage, RecoveryReport, Release
from .storage import (
    BucketSnapshotStorage,
    MemorySnapshotStorage,
    SnapshotNotFoundError,
    SnapshotWriter,
    StorageError,
)
from .storage.directory import DirectorySnapshotStorage

__all__ = [
    "BucketConfig",
    "BucketIndex",
    "BucketSnapshotStorage",
    "BucketStats",
    "CancelResult",
    "CorruptRecordError",
    "DelayedMessage",
    "DirectorySnapshotStorage",
    "EngineFailedError",
    "MemorySnapshotStorage",
    "NotRecoveredError",
    "RecoveryReport",
    "Release",
    "SnapshotNotFoundError",
    "SnapshotWriter",
    "StorageError",
    "bucket_key",
    "parse_bucket_key",
]
