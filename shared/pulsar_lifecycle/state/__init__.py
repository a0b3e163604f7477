"""Function state backends: the embedded directory store and BookKeeper's table service.

`open_state_store(url, root_dir, tenant, namespace, table)` picks the backend from the state
URL the way Pulsar's runtime does from `--state-storage-service-url`, except that no URL means
the durable local directory store instead of Pulsar's silent no-op.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .base import StateError, StateStore, table_namespace
from .directory import DirectoryStateStore

if TYPE_CHECKING:  # pragma: no cover
    from .bk_table import BookKeeperStateStore

__all__ = [
    "BookKeeperStateStore",
    "DirectoryStateStore",
    "StateError",
    "StateStore",
    "open_state_store",
    "table_namespace",
]


def __getattr__(name: str) -> Any:
    # Importing bookkeeper/grpc costs ~0.2 s; load it only when the BookKeeper backend is used.
    if name == "BookKeeperStateStore":
        from .bk_table import BookKeeperStateStore

        return BookKeeperStateStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_state_store(
    url: Optional[str], root_dir: Path, tenant: str, namespace: str, table: str
) -> StateStore:
    """Open the state table `<tenant>_<namespace>/<table>`.

    `url` None or "" -> DirectoryStateStore under `root_dir`; "bk://host:port" ->
    BookKeeperStateStore (namespace and table created when missing). Any other URL raises
    StateError naming it.
    """
    if url is None or url == "":
        return DirectoryStateStore(Path(root_dir), tenant, namespace, table)
    if not isinstance(url, str):
        raise StateError(f"state storage URL must be a string, got {type(url).__name__}")
    if url.lower().startswith("bk://"):
        from .bk_table import BookKeeperStateStore

        return BookKeeperStateStore(url, tenant, namespace, table)
    raise StateError(
        f"unsupported state storage URL {url!r}: expected 'bk://host:port' (BookKeeper table service) "
        "or nothing for the local directory store"
    )
