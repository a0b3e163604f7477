"""Bucket snapshot stores: the contract (`base`), one module per backend, one URL factory.

`open_snapshot_storage(url)` picks the backend from a URL the way `state.open_state_store` does:
a path or `file:///path` -> DirectorySnapshotStorage (the writer's `snapshotDir`);
`bk://host:port/<tenant>/<namespace>/<function name>` -> the BookKeeper table-service store of
that writer. The BookKeeper backend (bookkeeper/grpc, ~0.2 s to import) is loaded only when used.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Tuple
from urllib.parse import urlparse

from .base import (
    BucketSnapshotStorage,
    JournalPeek,
    SnapshotNotFoundError,
    SnapshotStorageError,
    SnapshotWriter,
    StorageError,
    check_bucket_id,
    check_entry_range,
    write_whole,
)
from .directory import DirectorySnapshotStorage, lock_exclusively
from .memory import MemorySnapshotStorage

if TYPE_CHECKING:  # pragma: no cover
    from .bookkeeper import BookKeeperTableSnapshotStorage

__all__ = [
    "BookKeeperTableSnapshotStorage",
    "BucketSnapshotStorage",
    "DirectorySnapshotStorage",
    "JournalPeek",
    "MemorySnapshotStorage",
    "SnapshotNotFoundError",
    "SnapshotStorageError",
    "SnapshotStoreUrl",
    "SnapshotWriter",
    "StorageError",
    "bookkeeper_partition_storage",
    "bookkeeper_snapshot_reader",
    "bookkeeper_snapshot_storage",
    "check_bucket_id",
    "check_entry_range",
    "lock_exclusively",
    "open_snapshot_storage",
    "parse_snapshot_url",
    "write_whole",
]


def __getattr__(name: str) -> Any:
    # Importing bookkeeper/grpc costs ~0.2 s; load it only when the BookKeeper backend is used.
    if name == "BookKeeperTableSnapshotStorage":
        from .bookkeeper import BookKeeperTableSnapshotStorage

        return BookKeeperTableSnapshotStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class SnapshotStoreUrl:
    """A parsed snapshot-store URL: `directory` (a path) or `bookkeeper` (service URL + writer name)."""

    kind: str  # "directory" | "bookkeeper"
    directory: Optional[Path] = None
    service_url: str = ""
    writer: Tuple[str, str, str] = ("", "", "")  # tenant, namespace, function name


def parse_snapshot_url(url: str) -> SnapshotStoreUrl:
    """Parse a snapshot-store URL (see the module docstring); SnapshotStorageError names a bad one."""
    if url.startswith("bk://"):
        u = urlparse(url)
        parts = [p for p in u.path.split("/") if p]
        if len(parts) != 3 or not u.hostname:
            raise SnapshotStorageError(
                f"snapshot store {url!r}: expected bk://host:port/<tenant>/<namespace>/<function name>")
        return SnapshotStoreUrl("bookkeeper", service_url=f"bk://{u.hostname}:{u.port or 4181}",
                                writer=(parts[0], parts[1], parts[2]))
    if url.startswith("file://"):
        return SnapshotStoreUrl("directory", directory=Path(urlparse(url).path))
    if "://" in url:
        raise SnapshotStorageError(
            f"snapshot store {url!r}: use a directory path, file:///path or bk://host:port/tenant/ns/name")
    return SnapshotStoreUrl("directory", directory=Path(url))


def bookkeeper_snapshot_storage(service_url: str, tenant: str, namespace: str, name: str) -> "BookKeeperTableSnapshotStorage":
    """The BookKeeper table-service snapshot store of the writer `tenant/namespace/name`."""
    from .bookkeeper import BookKeeperTableSnapshotStorage

    return BookKeeperTableSnapshotStorage(service_url, tenant, namespace, _bk_table_name(name))


def bookkeeper_snapshot_reader(service_url: str, tenant: str, namespace: str, name: str,
                               label: Optional[str] = None) -> "BookKeeperTableSnapshotStorage":
    """The table-service store of the writer `tenant/namespace/name` opened for reading: the
    table must exist (nothing is created), no lease is taken. `label` (`partition-<k>`) opens
    one partition's index, whose keys are routed by their prefix as the writer routes them."""
    from .bookkeeper import BookKeeperTableSnapshotStorage

    if label is None:
        return BookKeeperTableSnapshotStorage(service_url, tenant, namespace, _bk_table_name(name), create=False)
    prefix = f"bucket/{label}/"
    return BookKeeperTableSnapshotStorage(service_url, tenant, namespace, _bk_table_name(name), prefix=prefix,
                                          routing_key=prefix.encode("utf-8"), create=False)


def _bk_table_name(name: str) -> str:
    # The table service allows letters, digits and '_' only; function names may also hold '-' and '.'.
    return re.sub(r"[^A-Za-z0-9_]", "_", f"{name}_buckets")


def bookkeeper_partition_storage(service_url: str, tenant: str, namespace: str, name: str, label: str,
                                 owner: str, ttl_ms: int, clock: Optional[Any] = None) -> Tuple[BucketSnapshotStorage, Any, Any]:
    """(fenced store, lease store, lease) of one scheduling partition of the writer
    `tenant/namespace/name` on the table service: its keys under `bucket/<label>/`, all routed
    by that prefix; the lease is taken first (LeaseBusyError while another owner holds it).
    `clock` (ms) decides lease expiry; tests pass a FakeClock."""
    from ...state.base import StateError, table_namespace
    from ...state.bk_table import BookKeeperTable
    from .bookkeeper import BookKeeperTableSnapshotStorage
    from .bookkeeper_lease import BookKeeperLease

    prefix = f"bucket/{label}/"
    try:
        table = BookKeeperTable(service_url, table_namespace(tenant, namespace), _bk_table_name(name))
    except StateError as exc:
        raise SnapshotStorageError(str(exc)) from exc
    leases = (BookKeeperLease(table, prefix, own_table=True) if clock is None
              else BookKeeperLease(table, prefix, own_table=True, clock=clock))
    try:
        lease = leases.acquire(owner, ttl_ms)
    except BaseException:
        leases.close()
        raise
    storage = BookKeeperTableSnapshotStorage(table=table, prefix=prefix, routing_key=leases.routing_key,
                                             fence=leases.guard(lease))
    return storage, leases, lease


def open_snapshot_storage(url: str) -> BucketSnapshotStorage:
    """`/path` or `file:///path`: the directory store (a writer's snapshotDir);
    `bk://host:port/tenant/namespace/name`: the table-service store of that writer function."""
    parsed = parse_snapshot_url(url)
    if parsed.kind == "bookkeeper":
        return bookkeeper_snapshot_storage(parsed.service_url, *parsed.writer)
    assert parsed.directory is not None
    return DirectorySnapshotStorage(parsed.directory)
