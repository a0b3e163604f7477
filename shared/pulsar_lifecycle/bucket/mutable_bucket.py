"""The last mutable bucket (Pulsar's MutableBucket): recent items in memory until they are sealed.

Unlike Pulsar's it is durable: every item is in the journal before it is here, and sealing writes
it out as an immutable bucket's snapshot. Items released before the seal stay (in `released`)
until the seal, because an uncommitted release must be in the snapshot (it is released again
after a crash).

Pure and not thread-safe: the index guards it with its state lock.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable, List, Optional

from .codec import Item
from .records import ReleaseKey


class MutableBucket:
    """A heap of pending items in release-key order, the released ones, the ledger range covered
    and when the oldest item arrived (for the age-based seal rule)."""

    def __init__(self) -> None:
        self.heap: List[Item] = []
        self.released: List[Item] = []
        self.start = -1  # lowest ledger id of its items; -1 when empty
        self.end = -1  # highest ledger id of its items; -1 when empty
        self.oldest_ms: Optional[int] = None  # when the oldest item arrived (clock ms)

    def __len__(self) -> int:
        """Items held, released ones included (they count toward the seal rules)."""
        return len(self.heap) + len(self.released)

    @property
    def empty(self) -> bool:
        return not self.heap and not self.released

    def head(self) -> Optional[Item]:
        """The next item to release, or None."""
        return self.heap[0] if self.heap else None

    def head_ts(self) -> Optional[int]:
        """Release timestamp of the next item, or None."""
        return self.heap[0][0] if self.heap else None

    def add(self, items: List[Item], lo: int, hi: int, now_ms: int) -> None:
        """Add journaled items whose ledgers span [lo, hi]."""
        heap = self.heap
        if heap:
            for it in items:
                heapq.heappush(heap, it)
        else:
            heap.extend(items)
            heapq.heapify(heap)
        self.start = lo if self.start < 0 else min(self.start, lo)
        self.end = max(self.end, hi)
        if self.oldest_ms is None:
            self.oldest_ms = now_ms

    def restore(self, items: Iterable[Item], lo: int, hi: int, clock: Callable[[], int]) -> None:
        """Load the items replayed from the journal at recovery (the bucket is empty); their
        ledgers span [lo, hi] (lo < 0: none pending). Their age counts from now."""
        self.heap.extend(items)
        heapq.heapify(self.heap)
        if lo >= 0:
            self.start, self.end = lo, hi
        if self.heap:
            self.oldest_ms = clock()

    def pop(self) -> Item:
        """Take the head for release; it is kept until the seal."""
        item = heapq.heappop(self.heap)
        self.released.append(item)
        return item

    def items_after(self, watermark: Optional[ReleaseKey]) -> List[Item]:
        """What a seal must write: every item (released or not) after the committed watermark."""
        w = watermark
        items = [it for it in self.heap if w is None or it[:3] > w]
        items += [it for it in self.released if w is None or it[:3] > w]
        return items

    def clear(self) -> None:
        """Forget everything (the items are now in an immutable bucket or committed)."""
        self.heap = []
        self.released = []
        self.start = self.end = -1
        self.oldest_ms = None
