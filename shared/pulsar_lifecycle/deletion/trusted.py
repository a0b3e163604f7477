"""Ledger ids this process appended itself (seed 001): their ownership fetch may be skipped.

Bounded (oldest dropped first) and emptied as deletions complete, answering the review
remark on the PIP's implementation that its believed-deleted id set grew without bound.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class TrustedLedgerRegistry:
    """A bounded, thread-safe set of deletion keys produced by this process's service."""

    max_size: int = 100_000
    _keys: "OrderedDict[Hashable, None]" = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError(f"trusted registry size must be >= 1, got {self.max_size}")

    def add(self, key: Hashable) -> None:
        """Remember `key`; the oldest key is forgotten when full."""
        with self._lock:
            self._keys[key] = None
            self._keys.move_to_end(key)
            while len(self._keys) > self.max_size:
                self._keys.popitem(last=False)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._keys

    def discard(self, key: Hashable) -> None:
        """Forget `key` (its deletion is done)."""
        with self._lock:
            self._keys.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)
