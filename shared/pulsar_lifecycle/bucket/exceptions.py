"""The errors the bucket index raises on purpose, under the package root PulsarLifecycleError.

The snapshot stores' own errors (SnapshotStorageError, SnapshotNotFoundError) live with the
storage contract in bucket/storage/base.py.
"""
from __future__ import annotations

from ..exceptions import PulsarLifecycleError

__all__ = ["CorruptRecordError", "EngineFailedError", "NotRecoveredError"]


class CorruptRecordError(PulsarLifecycleError, ValueError):
    """Stored bytes could not be decoded as the record they should hold."""


class EngineFailedError(PulsarLifecycleError, RuntimeError):
    """A durable write had an unknown outcome; this engine object must be dropped and a new
    one recovered from the storage (the storage holds the truth)."""


class NotRecoveredError(PulsarLifecycleError, RuntimeError):
    """recover() must be called (once) before the engine is used."""
