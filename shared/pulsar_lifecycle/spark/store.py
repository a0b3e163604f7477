"""Opening a writer's snapshot store by URL, from the driver and from every executor.

On a cluster the executors write (seed) and read (verify) the store themselves, so it must be
one they all reach: a directory on a shared filesystem mounted at the same path on every node
(NFS, CephFS, ...), or the BookKeeper table service the writer uses (`snapshotStorage:
bookkeeper`). A local directory only works with a local master.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from ..bucket.storage import (
    BucketSnapshotStorage,
    SnapshotStorageError,
    SnapshotStoreUrl,
    lock_exclusively,
    open_snapshot_storage,
    parse_snapshot_url,
)
from .errors import SparkJobError


def _parse(url: str) -> SnapshotStoreUrl:
    try:
        return parse_snapshot_url(url)
    except SnapshotStorageError as exc:
        raise SparkJobError(str(exc)) from None


def open_store(url: str) -> BucketSnapshotStorage:
    """`/path` or `file:///path`: the directory store (snapshotDir); `bk://host:port/tenant/namespace/name`:
    the table-service store of that writer function (`bucket.storage.open_snapshot_storage`)."""
    _parse(url)
    return open_snapshot_storage(url)


def store_dir(url: str) -> Optional[Path]:
    """The directory of a directory store, None for other kinds."""
    return _parse(url).directory


@contextlib.contextmanager
def exclusive(url: str) -> Iterator[None]:
    """Hold the writer's lock of a directory store (no writer may run while seeding)."""
    path = store_dir(url)
    fh: Optional[IO[Any]] = None
    if path is not None:
        try:
            fh = lock_exclusively(path)
        except RuntimeError as exc:
            raise SparkJobError(f"{exc}: stop the writer before seeding its store") from exc
    try:
        yield
    finally:
        if fh is not None:
            fh.close()
