"""The state-store contract behind Context.put_state/get_state/incr_counter.

It mirrors what Pulsar's Python runtime does with BookKeeper's table service
(`state_context.py`): values are bytes on the way out, counters are 64-bit
integers kept apart from values, and a missing key reads as None.
"""
from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

from ..exceptions import PulsarLifecycleError


class StateError(PulsarLifecycleError, RuntimeError):
    """A state backend could not be reached or answered with an error."""


@runtime_checkable
class StateStore(Protocol):
    """Key/value plus counters for one function (one Pulsar state table)."""

    def put(self, key: str, value: bytes) -> None:
        """Store `value` under `key`, durably, replacing what was there."""

    def get(self, key: str) -> Optional[bytes]:
        """The bytes stored under `key`, or None."""

    def incr(self, key: str, amount: int) -> None:
        """Add `amount` to the counter `key` (created at 0)."""

    def get_counter(self, key: str) -> Optional[int]:
        """The counter's value, or None when it was never incremented."""

    def delete(self, key: str) -> None:
        """Remove `key` (value or counter). Removing a missing key is not an error."""

    def close(self) -> None:
        """Release connections and file handles."""


def table_namespace(tenant: str, namespace: str) -> str:
    """Pulsar's table namespace for a function: `<tenant>_<namespace>` with '-' -> '_'."""
    return f"{tenant}_{namespace}".replace("-", "_")
