"""What the inspect views share: their error, read-only state access, counting a topic."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, Tuple

import pulsar

from ..exceptions import PulsarLifecycleError
from ..pulsar_io.readers import has_more, reader_at
from ..state import StateStore, open_state_store
from ..state.base import table_namespace

__all__ = ["InspectError", "StateReader", "count_stored", "has_more", "open_state_reader"]


class InspectError(PulsarLifecycleError):
    """What was asked for cannot be inspected (no such store, no such state, a bad config)."""


class StateReader:
    """The one Context method ContextStateStore.get calls, over a StateStore, so the views read
    function state through the functions' own encoding (scheduler/context_state.py)."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def get_state(self, key: str) -> Optional[bytes]:
        """The raw value of `key` (what the runtime's get_state returns)."""
        return self._store.get(key)


def open_state_reader(spec: Any, data_dir: Path, state_url: Optional[str]) -> Optional[StateStore]:
    """The state table of the function `spec`, opened without creating anything: on the table
    service of `state_url` (bk://), or `localrun`'s directory store under `data_dir`; None when
    the directory store does not exist."""
    if state_url:
        from ..state.bk_table import BookKeeperStateStore

        return BookKeeperStateStore(state_url, spec.tenant, spec.namespace, spec.name, create=False)
    path = Path(data_dir) / "state" / table_namespace(spec.tenant, spec.namespace) / spec.name
    if not path.is_dir():
        return None
    return open_state_store(None, Path(data_dir) / "state", spec.tenant, spec.namespace, spec.name)


def count_stored(client: pulsar.Client, topic: str, limit: int, timeout_s: float) -> Tuple[int, bool]:
    """(messages stored on `topic`, stopped at `limit`?), counted with a non-durable Reader from the
    earliest message to the last one the broker reports; acknowledges nothing."""
    reader = reader_at(client, topic, None)
    count = 0
    deadline = time.monotonic() + timeout_s
    try:
        while count < limit and time.monotonic() < deadline and has_more(reader):
            try:
                reader.read_next(1000)
            except pulsar.Timeout:
                continue
            count += 1
    finally:
        reader.close()
    return count, count >= limit
