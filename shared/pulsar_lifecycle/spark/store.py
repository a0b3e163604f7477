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
from urllib.parse import urlparse

from ..bucket.storage import BucketSnapshotStorage
from ..bucket.storage_dir import DirectorySnapshotStorage
from ..scheduler.factory import bookkeeper_snapshot_storage, lock_exclusively
from .errors import SparkJobError


def _parse(url: str) -> tuple:
    if url.startswith("bk://"):
        u = urlparse(url)
        parts = [p for p in u.path.split("/") if p]
        if len(parts) != 3 or not u.hostname:
            raise SparkJobError(f"snapshot store {url!r}: expected bk://host:port/<tenant>/<namespace>/<function name>")
        return "bk", f"bk://{u.hostname}:{u.port or 4181}", parts
    if url.startswith("file://"):
        return "dir", Path(urlparse(url).path), None
    if "://" in url:
        raise SparkJobError(f"snapshot store {url!r}: use a directory path, file:///path or bk://host:port/tenant/ns/name")
    return "dir", Path(url), None


def open_store(url: str) -> BucketSnapshotStorage:
    """`/path` or `file:///path`: the directory store (snapshotDir); `bk://host:port/tenant/namespace/name`:
    the table-service store of that writer function."""
    kind, where, parts = _parse(url)
    if kind == "bk":
        return bookkeeper_snapshot_storage(where, *parts)
    return DirectorySnapshotStorage(where)


def store_dir(url: str) -> Optional[Path]:
    """The directory of a directory store, None for other kinds."""
    kind, where, _ = _parse(url)
    return where if kind == "dir" else None


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
