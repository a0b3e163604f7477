"""`LandedForwards`: where each recent forward of one delay-level partition landed. Pure.

The forward publisher reports every message the broker confirms (DedupPublisher.track_landed:
destination, sequence id, message id); a cancel of a parked message that was already forwarded
names the forward's position in the writer's cancel (`__pl_cancel__`) without reading the
scheduling topic. Kept in memory, bounded by count and by the forward horizon (a forward older
than that has been released and can no longer be cancelled); a cancel of a forward not in the
record (forwarded before a restart, or evicted) falls back to reading the topic
(follow.find_forward from a ForwardTrail checkpoint).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Optional, Tuple

__all__ = ["LandedForwards"]


class LandedForwards:
    """sequence id -> (destination, ledger, entry, batch index), oldest first."""

    def __init__(self, max_entries: int, horizon_s: float, accept: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.horizon_s = horizon_s
        self._accept = accept  # which destinations count (the near-term topic, not the dead-letter topic)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: "OrderedDict[int, Tuple[float, str, int, int, int]]" = OrderedDict()
        self.evicted = 0

    def add(self, dest: str, seq: int, msg_id: Any) -> None:
        """The publisher's sink (pulsar-client's I/O thread): record where `seq` landed."""
        if self.max_entries <= 0 or not self._accept(dest):
            return
        ledger, entry = msg_id.ledger_id(), msg_id.entry_id()
        if ledger < 0 and entry < 0:
            return  # -1:-1: the broker's de-duplication says it was stored earlier (position unknown)
        now = self._clock()
        with self._lock:
            entries = self._entries
            entries[seq] = (now, dest, ledger, entry, msg_id.batch_index())
            horizon = now - self.horizon_s
            while entries and (len(entries) > self.max_entries or next(iter(entries.values()))[0] < horizon):
                entries.popitem(last=False)
                self.evicted += 1

    def get(self, seq: int) -> Optional[Tuple[str, int, int, int]]:
        """(destination, ledger, entry, batch index) of the forward of `seq`, or None."""
        with self._lock:
            hit = self._entries.get(seq)
        return None if hit is None else hit[1:]

    def __len__(self) -> int:
        return len(self._entries)
