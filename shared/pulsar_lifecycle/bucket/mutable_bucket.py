"""The last mutable bucket (Pulsar's MutableBucket): recent items in memory until they are sealed.

Unlike Pulsar's it is durable: every item is in the journal before it is here, and sealing writes
it out as an immutable bucket's snapshot. Items released before the seal stay until the seal,
because an uncommitted release must be in the snapshot (it is released again after a crash).

Items are rows of packed columns (packed.PackedItems), never removed before the seal. The release
order is kept in sorted runs of row numbers (`array('I')`): each added batch is one run, and runs
of similar size are merged (the unreleased rows re-sorted), so at most about log2(items) runs
exist and each row is re-sorted that many times. A small heap of the runs' heads gives the next
item. No Python object is held per item.

Pure and not thread-safe: the index guards it with its state lock.
"""
from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from .codec import Item
from .packed import PackedItems, key_int
from .records import ReleaseKey
from .segments import CutSegment, cut_packed

# A run head in the heap: the release key of the run's next row, then the run's number.
RunHead = Tuple[int, int, int, int]


@dataclass(eq=False)
class _Run:
    """Row numbers in release-key order; rows before `pos` are released."""

    order: array
    pos: int = 0

    @property
    def remaining(self) -> int:
        return len(self.order) - self.pos


class MutableBucket:
    """Pending and released items in columns, the ledger range covered and when the oldest item
    arrived (for the age-based seal rule)."""

    def __init__(self) -> None:
        self.rows = PackedItems()
        self._runs: List[_Run] = []
        self._heads: List[RunHead] = []
        self._unreleased = 0
        self.start = -1  # lowest ledger id of its items; -1 when empty
        self.end = -1  # highest ledger id of its items; -1 when empty
        self.oldest_ms: Optional[int] = None  # when the oldest item arrived (clock ms)

    def __len__(self) -> int:
        """Items held, released ones included (they count toward the seal rules)."""
        return len(self.rows)

    @property
    def pending(self) -> int:
        """Items not released yet."""
        return self._unreleased

    @property
    def empty(self) -> bool:
        return len(self.rows) == 0

    def head(self) -> Optional[RunHead]:
        """The next item to release: (ts, ledger, index id, run), or None."""
        return self._heads[0] if self._heads else None

    def head_ts(self) -> Optional[int]:
        """Release timestamp of the next item, or None."""
        return self._heads[0][0] if self._heads else None

    def add_encoded(self, ts: Sequence[int], ledgers: Sequence[int], entries: Sequence[int], data: bytes,
                    offsets: Sequence[int], lo: int, hi: int, now_ms: int) -> None:
        """Add journaled items (framed bytes `data` cut at `offsets`, codec.encode_batch) whose
        ledgers span [lo, hi]."""
        first = len(self.rows)
        self.rows.append_encoded(ts, ledgers, entries, data, offsets)
        self._note(first, lo, hi, now_ms)

    def add(self, items: Sequence[Item], lo: int, hi: int, now_ms: int) -> None:
        """Add journaled engine items (ts, ledger, index id, framed bytes) whose ledgers span [lo, hi]."""
        first = len(self.rows)
        self.rows.append_items(items)
        self._note(first, lo, hi, now_ms)

    def restore(self, items: Iterable[Item], lo: int, hi: int, clock: Callable[[], int]) -> None:
        """Load the items replayed from the journal at recovery (the bucket is empty); their
        ledgers span [lo, hi] (lo < 0: none pending). Their age counts from now."""
        self.rows.append_items(list(items))
        if len(self.rows):
            self._new_run(0)
            self.oldest_ms = clock()
        if lo >= 0:
            self.start, self.end = lo, hi

    def _note(self, first: int, lo: int, hi: int, now_ms: int) -> None:
        if len(self.rows) > first:
            self._new_run(first)
        self.start = lo if self.start < 0 else min(self.start, lo)
        self.end = max(self.end, hi)
        if self.oldest_ms is None:
            self.oldest_ms = now_ms

    def _sorted_rows(self, rows: Iterable[int]) -> array:
        rk = self.rows.key_int
        return array("I", sorted(rows, key=rk))

    def _new_run(self, first: int) -> None:
        """Rows `first`.. become a run; merge the last runs while the one before is not more than
        twice as large (keeps the runs few; each row takes part in about log2(items) merges)."""
        self._unreleased += len(self.rows) - first
        runs = [r for r in self._runs if r.remaining]
        runs.append(_Run(self._sorted_rows(range(first, len(self.rows)))))
        while len(runs) >= 2 and runs[-2].remaining <= 2 * runs[-1].remaining:
            b, a = runs.pop(), runs.pop()
            runs.append(_Run(self._sorted_rows(list(a.order[a.pos:]) + list(b.order[b.pos:]))))
        self._runs = runs
        rows = self.rows
        self._heads = [(*rows.key(r.order[r.pos]), n) for n, r in enumerate(runs)]
        heapq.heapify(self._heads)

    def pop(self) -> Item:
        """Take the head for release (ts, ledger, index id, framed bytes); it is kept until the seal."""
        ts, ledger, entry, n = self._heads[0]
        run = self._runs[n]
        row = run.order[run.pos]
        run.pos += 1
        if run.pos < len(run.order):
            heapq.heapreplace(self._heads, (*self.rows.key(run.order[run.pos]), n))
        else:
            heapq.heappop(self._heads)
        self._unreleased -= 1
        return (ts, ledger, entry, self.rows.framed(row))

    def rows_after(self, watermark: Optional[ReleaseKey]) -> array:
        """What a seal must write: the rows of every item (released or not) after the committed
        watermark, in release-key order."""
        rk = self.rows.key_int
        n = len(self.rows)
        if watermark is None:
            return self._sorted_rows(range(n))
        w = key_int(*watermark)
        return self._sorted_rows(r for r in range(n) if rk(r) > w)

    def items_after(self, watermark: Optional[ReleaseKey]) -> List[Item]:
        """rows_after as engine items (ts, ledger, index id, framed bytes)."""
        rows = self.rows
        return [(*rows.key(r), rows.framed(r)) for r in self.rows_after(watermark)]

    def segments_after(self, watermark: Optional[ReleaseKey], time_step_ms: int,
                       max_indexes: int) -> Tuple[List[CutSegment], int, int]:
        """The snapshot segments of a seal (rows_after, cut by Pulsar's rule) and the ledger
        range of their items ([-1, -1] when none)."""
        order = self.rows_after(watermark)
        if not order:
            return [], -1, -1
        ledger = self.rows.ledger
        return (cut_packed(self.rows, order, time_step_ms, max_indexes),
                min(ledger[r] for r in order), max(ledger[r] for r in order))

    def clear(self) -> None:
        """Forget everything (the items are now in an immutable bucket or committed)."""
        self.rows = PackedItems()
        self._runs = []
        self._heads = []
        self._unreleased = 0
        self.start = self.end = -1
        self.oldest_ms = None
