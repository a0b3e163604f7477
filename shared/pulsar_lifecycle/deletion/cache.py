"""ledgersCache: per-topic in-use ledger ids with a TTL (seed 000), at most one load per TTL.

The seed's rules:
- entries expire `ttl` after they were written (expireAfterWrite), which bounds memory to topics
  that still have deletions and bounds admin calls to one per topic per TTL;
- a ledger id above the cached maximum means the entry predates the ledger: do not trust it,
  retry later (by then the entry has expired and is reloaded).
Loads for one topic are single-flight (the shared `ttl_cache.TtlCache`).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Callable, FrozenSet, Iterable, Optional

from .ttl_cache import CacheStats, TtlCache

__all__ = ["CacheStats", "InUseSnapshot", "InUseState", "LedgersCache"]


class InUseState(enum.Enum):
    """Answer of an in-use check."""

    IN_USE = "IN_USE"
    NOT_IN_USE = "NOT_IN_USE"
    STALE = "STALE"  # cannot tell from what we know; retry later


@dataclass(frozen=True)
class InUseSnapshot:
    """What one internalStats load says about a topic."""

    topic_exists: bool
    ledger_ids: FrozenSet[int] = frozenset()

    @classmethod
    def of(cls, ids: Iterable[int]) -> "InUseSnapshot":
        """A snapshot for an existing topic using `ids` (negative ids such as -1 are dropped)."""
        return cls(True, frozenset(i for i in ids if i is not None and i >= 0))

    @property
    def max_id(self) -> Optional[int]:
        """The largest in-use id, or None."""
        return max(self.ledger_ids) if self.ledger_ids else None

    def verdict(self, ledger_id: int) -> InUseState:
        """The seed's rule applied to one ledger id."""
        if not self.topic_exists:
            # The topic is gone, so nothing of it is in use (seed 001: the consumer deletes directly).
            return InUseState.NOT_IN_USE
        top = self.max_id
        if top is None or ledger_id > top:
            return InUseState.STALE
        return InUseState.IN_USE if ledger_id in self.ledger_ids else InUseState.NOT_IN_USE


class LedgersCache(TtlCache[str, InUseSnapshot]):
    """Topic -> InUseSnapshot with expire-after-write `ttl_seconds` and single-flight loading."""

    def __init__(self, loader: Callable[[str], InUseSnapshot], ttl_seconds: float = 600.0,
                 clock: Callable[[], float] = time.monotonic, max_topics: int = 100_000,
                 stats: Optional[CacheStats] = None) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"ledgersCache TTL must be positive, got {ttl_seconds}")
        super().__init__(loader, ttl_seconds, clock=clock, max_entries=max_topics, stats=stats, name="ledgersCache")
