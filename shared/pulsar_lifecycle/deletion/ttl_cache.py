"""A key -> value cache with expire-after-write, single-flight loading and a size bound.

One building block for every "ask a remote API at most once per TTL" rule: the deletion
worker's ledgersCache (topic -> in-use ledgers) and the delay-level syncer's admin view
(namespace -> topic names). Loads for one key are single-flight: concurrent lookups wait for
the one load in progress; a failed load caches nothing and propagates.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Generic, Hashable, Optional, Tuple, TypeVar

__all__ = ["CacheStats", "TtlCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class CacheStats:
    """Counters kept by the cache (metrics read them)."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    load_failures: int = 0


class TtlCache(Generic[K, V]):
    """`get(key)` returns (value, from_cache); entries expire `ttl_seconds` after they were written."""

    def __init__(self, loader: Callable[[K], V], ttl_seconds: float, *, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 100_000, stats: Optional[CacheStats] = None, name: str = "cache") -> None:
        if ttl_seconds < 0:  # 0: every lookup loads (nothing is cached)
            raise ValueError(f"{name} TTL must not be negative, got {ttl_seconds}")
        self.loader = loader
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.max_entries = max_entries
        self.stats = stats if stats is not None else CacheStats()
        self._entries: Dict[K, Tuple[V, float]] = {}
        self._loading: Dict[K, threading.Lock] = {}
        self._lock = threading.Lock()

    def _fresh(self, key: K, now: float) -> Optional[Tuple[V]]:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now - entry[1] >= self.ttl_seconds:
            del self._entries[key]
            return None
        return (entry[0],)

    def get(self, key: K) -> Tuple[V, bool]:
        """The value for `key` and whether it came from the cache; loader errors propagate."""
        with self._lock:
            hit = self._fresh(key, self.clock())
            if hit is not None:
                self.stats.hits += 1
                return hit[0], True
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                # Someone else may have loaded it while we waited.
                hit = self._fresh(key, self.clock())
                if hit is not None:
                    self.stats.hits += 1
                    return hit[0], True
                self.stats.misses += 1
            try:
                value = self.loader(key)
            except Exception:
                with self._lock:
                    self.stats.load_failures += 1
                raise
            with self._lock:
                self.stats.loads += 1
                self._entries[key] = (value, self.clock())
                self._evict()
                self._loading.pop(key, None)
            return value, False

    def _evict(self) -> None:
        if len(self._entries) <= self.max_entries:
            return
        now = self.clock()
        for k in [k for k, (_, at) in self._entries.items() if now - at >= self.ttl_seconds]:
            del self._entries[k]
        # Still too many live keys: drop the oldest; they are reloaded on demand.
        if len(self._entries) > self.max_entries:
            by_age = sorted(self._entries.items(), key=lambda kv: kv[1][1])
            for k, _ in by_age[: len(self._entries) - self.max_entries]:
                del self._entries[k]

    def invalidate(self, key: K) -> None:
        """Forget `key` (the next lookup reloads)."""
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
