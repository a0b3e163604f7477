"""`OrderGate`: a partition's parked messages are handled strictly in position order. Pure.

Why (issue 11): a forward's sequence id is its source position, and the forward publisher
drops an id at or below the highest it already forwarded as a duplicate (PIP-6). That is exact
only if nothing below the highest forwarded position is still waiting to be forwarded. A Shared
subscription does not promise that order: a message another consumer of the subscription holds
(a killed predecessor the broker has not dropped yet, a probe consumer) is handed to the live
consumer only after later ones, and was then dropped as a "duplicate" and acked: lost.

So a received message enters the ordered stream (the forwarder's `_held`) only when it is the
next position after the last one admitted (the *frontier*):

* the next batch index of the same entry, or index 0 of the next entry once the frontier was
  the last message of its batch (its batch size is known from its message id); or
* the position a Reader finds right after the frontier (`resolve`): the partition holds nothing
  between them.

A message at or below the frontier was handled before (forwarded, dead-lettered or cancelled):
it is a redelivery and may be acked once its forward is confirmed. A message beyond a gap waits
in `ahead` (bounded by `cap`) until the gap is filled by the missing message, which nobody but
the syncer acks, so it does come back. Everything here is positions; no Pulsar I/O.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

from ..bucket.codec import read_varint

__all__ = ["OrderGate", "Pos", "batch_size_of"]

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class Pos:
    """A message position; `batch` is the batch index (0 for a message outside a batch) and
    `size` the number of messages in its entry (1 outside a batch; 0 = unknown)."""

    ledger: int
    entry: int
    batch: int
    size: int = field(default=0, compare=False)

    @property
    def key(self) -> Tuple[int, int, int]:
        """(ledger, entry, batch index): the order of the partition."""
        return (self.ledger, self.entry, self.batch)

    def followed_by(self, other: "Pos") -> bool:
        """True when `other` is provably the very next message of the partition after this one.
        A ledger change is never provable from the ids alone (a Reader decides)."""
        if other.ledger != self.ledger:
            return False
        if other.entry == self.entry:
            return other.batch == self.batch + 1
        return (other.entry == self.entry + 1 and other.batch == 0
                and self.size > 0 and self.batch == self.size - 1)


def batch_size_of(serialized: bytes) -> int:
    """The batch size in a serialized MessageIdData (field 6; pulsar-client writes it for a
    message of a batch); 1 when absent (a message outside a batch), 0 when unreadable."""
    i, n = 0, len(serialized)
    try:
        while i < n:
            tag, i = read_varint(serialized, i)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                value, i = read_varint(serialized, i)
                if number == 6:
                    return value
            elif wire == 2:
                length, i = read_varint(serialized, i)
                i += length
            elif wire in (1, 5):
                i += 8 if wire == 1 else 4
            else:
                return 0
    except IndexError:
        return 0
    return 1


class OrderGate(Generic[T]):
    """Admits items (received messages) in strict position order; see the module docstring.

    The frontier is kept as plain ints (`frontier` builds its Pos on demand): `offer_next` and
    `handled_at`, the per-message path of the forwarder, allocate nothing."""

    def __init__(self, frontier: Optional[Pos], cap: int, sizer: Optional[Callable[[T], int]] = None) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        # The last position admitted (None: nothing yet, e.g. a new partition) and its batch size
        # (0: unknown).
        self._key: Optional[Tuple[int, int, int]] = frontier.key if frontier is not None else None
        self._size = frontier.size if frontier is not None else 0
        self.cap = cap
        # The batch size of an admitted item, read only when the next entry starts (it costs a
        # serialization of the message id); None: positions carry their size.
        self._sizer = sizer
        self._frontier_item: Optional[T] = None
        self._ahead: List[Tuple[Tuple[int, int, int], int, Pos, T]] = []  # heap by position
        self._tie = itertools.count()

    @property
    def frontier(self) -> Optional[Pos]:
        """The last position admitted (None: nothing yet)."""
        k = self._key
        return None if k is None else Pos(k[0], k[1], k[2], self._size)

    def __len__(self) -> int:
        return len(self._ahead)

    @property
    def full(self) -> bool:
        """True when `cap` items wait beyond a gap (the caller stops receiving)."""
        return len(self._ahead) >= self.cap

    def first_waiting(self) -> Optional[Pos]:
        """The lowest position waiting beyond the gap, or None."""
        return self._ahead[0][2] if self._ahead else None

    def handled(self, pos: Pos) -> bool:
        """True when `pos` is at or below the frontier: admitted before (a redelivery)."""
        return self._key is not None and pos.key <= self._key

    def handled_at(self, ledger: int, entry: int, batch: int) -> bool:
        """`handled` for a message id's (ledger, entry, batch index); index -1 (outside a batch) counts as 0."""
        return self._key is not None and (ledger, entry, batch if batch > 0 else 0) <= self._key

    def offer_next(self, ledger: int, entry: int, batch: int, item: T) -> bool:
        """The per-message fast path of `offer`, for a message id's (ledger, entry, batch index;
        -1 outside a batch): when nothing waits beyond a gap and the position provably follows
        the frontier, admit `item` and return True. Otherwise change nothing and return False
        (the caller goes on with `handled` and `offer`)."""
        if self._ahead:
            return False
        if batch < 0:  # a message outside a batch: index 0 of a one-message entry
            if not self._follows(ledger, entry, 0):
                return False
            self._key, self._size, self._frontier_item = (ledger, entry, 0), 1, item
            return True
        if not self._follows(ledger, entry, batch):
            return False
        self._key, self._size, self._frontier_item = (ledger, entry, batch), 0, item
        return True

    def offer(self, pos: Pos, item: T) -> List[T]:
        """Offer a received item above the frontier; returns the items admitted now, in order
        (`item` and any that waited behind it), or [] when it waits beyond a gap."""
        if self._follows(pos.ledger, pos.entry, pos.batch):
            self._advance(pos, item)
            return [item] + self._release()
        heapq.heappush(self._ahead, (pos.key, next(self._tie), pos, item))
        return []

    def resolve(self, next_existing: Optional[Pos]) -> List[T]:
        """A Reader found `next_existing` as the first message after the frontier (None: it
        found nothing). If that is the lowest waiting position, the gap holds nothing: admit."""
        if next_existing is None or not self._ahead or self._ahead[0][0] != next_existing.key:
            return []
        _, _, pos, item = heapq.heappop(self._ahead)
        self._advance(pos if pos.size else next_existing, item)  # the Reader's id carries the batch size
        return [item] + self._release()

    def admit_read(self, read: Sequence[Tuple[Pos, T]]) -> List[T]:
        """Items a Reader read in order from just after the frontier, skipping nothing: the first
        follows the frontier and each the one before, so all are admitted, then whatever waited
        behind them. Positions at or below the frontier are left out."""
        out: List[T] = []
        for pos, item in read:
            if self._key is not None and pos.key <= self._key:
                continue
            self._advance(pos, item)
            out.append(item)
        return out + self._release()

    def clear(self) -> List[T]:
        """Forget the waiting items (their consumer is being replaced; they come back)."""
        items = [it for _, _, _, it in self._ahead]
        self._ahead.clear()
        return items

    def _release(self) -> List[T]:
        out: List[T] = []
        while self._ahead:
            pos = self._ahead[0][2]
            assert self._key is not None
            if pos.key <= self._key:
                heapq.heappop(self._ahead)  # another copy of an admitted position (acked with it)
                continue
            if not self._follows(pos.ledger, pos.entry, pos.batch):
                break
            item = heapq.heappop(self._ahead)[3]
            self._advance(pos, item)
            out.append(item)
        return out

    def _advance(self, pos: Pos, item: T) -> None:
        self._key, self._size, self._frontier_item = pos.key, pos.size, item

    def _follows(self, ledger: int, entry: int, batch: int) -> bool:
        """True when (ledger, entry, batch) is provably the very next message after the frontier:
        the next batch index of the same entry, or index 0 of the next entry once the frontier
        was the last message of its batch (its size read with `sizer` when unknown). A ledger
        change is never provable from the ids alone (a Reader decides)."""
        f = self._key
        if f is None or ledger != f[0]:
            return False
        if entry == f[1]:
            return batch == f[2] + 1
        if entry != f[1] + 1 or batch != 0:
            return False
        size = self._size
        if size == 0:
            if self._sizer is None or self._frontier_item is None:
                return False
            # The next entry starts: was the frontier the last message of its batch?
            size = self._size = self._sizer(self._frontier_item)
        return size > 0 and f[2] == size - 1
