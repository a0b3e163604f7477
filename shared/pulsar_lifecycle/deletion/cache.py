"""ledgersCache: per-topic in-use ledger ids with a TTL (seed 000), at most one load per TTL.

The seed's rules:
- entries expire `ttl` after they were written (expireAfterWrite), which bounds memory to topics
  that still have deletions and bounds admin calls to one per topic per TTL;
- a ledger id above the cached maximum means the entry predates the ledger: do not trust it,
  retry later (by then the entry has expired and is reloaded).
Loads for one topic are single-flight: concurrent lookups wait for the one load in progress.
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Iterable, Optional, Tuple


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


@dataclass
class _Entry:
    snapshot: InUseSnapshot
    written_at: float


@dataclass
class CacheStats:
    """Counters kept by the cache (the metrics layer reads them)."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    load_failures: int = 0


@dataclass
class LedgersCache:
    """Topic -> InUseSnapshot with expire-after-write `ttl_seconds` and single-flight loading."""

    loader: Callable[[str], InUseSnapshot]
    ttl_seconds: float = 600.0
    clock: Callable[[], float] = time.monotonic
    max_topics: int = 100_000
    stats: CacheStats = field(default_factory=CacheStats)
    _entries: Dict[str, _Entry] = field(default_factory=dict, init=False, repr=False)
    _loading: Dict[str, threading.Lock] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.ttl_seconds <= 0:
            raise ValueError(f"ledgersCache TTL must be positive, got {self.ttl_seconds}")

    def _fresh(self, topic: str, now: float) -> Optional[InUseSnapshot]:
        entry = self._entries.get(topic)
        if entry is None:
            return None
        if now - entry.written_at >= self.ttl_seconds:
            del self._entries[topic]
            return None
        return entry.snapshot

    def get(self, topic: str) -> Tuple[InUseSnapshot, bool]:
        """The snapshot for `topic` and whether it came from the cache; loader errors propagate."""
        with self._lock:
            snap = self._fresh(topic, self.clock())
            if snap is not None:
                self.stats.hits += 1
                return snap, True
            topic_lock = self._loading.setdefault(topic, threading.Lock())
        with topic_lock:
            with self._lock:
                # Someone else may have loaded it while we waited.
                snap = self._fresh(topic, self.clock())
                if snap is not None:
                    self.stats.hits += 1
                    return snap, True
                self.stats.misses += 1
            try:
                snap = self.loader(topic)
            except Exception:
                with self._lock:
                    self.stats.load_failures += 1
                raise
            with self._lock:
                self.stats.loads += 1
                self._entries[topic] = _Entry(snap, self.clock())
                self._evict_expired()
                self._loading.pop(topic, None)
            return snap, False

    def _evict_expired(self) -> None:
        if len(self._entries) <= self.max_topics:
            return
        now = self.clock()
        for t in [t for t, e in self._entries.items() if now - e.written_at >= self.ttl_seconds]:
            del self._entries[t]
        # Still too many live topics: drop the oldest; they are reloaded on demand.
        if len(self._entries) > self.max_topics:
            by_age = sorted(self._entries.items(), key=lambda kv: kv[1].written_at)
            for t, _ in by_age[: len(self._entries) - self.max_topics]:
                del self._entries[t]

    def invalidate(self, topic: str) -> None:
        """Forget `topic` (next lookup reloads)."""
        with self._lock:
            self._entries.pop(topic, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

