"""Per-ledger RoaringBitmaps of entry ids in Pulsar's on-disk format.

Pulsar stores one 32-bit `org.roaringbitmap.RoaringBitmap` per ledger, `runOptimize()`d and
written with the standard portable serialization. pyroaring (CRoaring) writes byte-identical
portable bytes, so these bitmaps are readable by Pulsar and vice versa.
"""
from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Mapping, Tuple

from pyroaring import BitMap

from .records import BATCH_BITS


def entry_bitmap(index_ids: BitMap) -> BitMap:
    """The real entry ids (`id >> BATCH_BITS`) of a bitmap of index ids: the bitmap Pulsar's
    containsMessage(ledgerId, entryId) reads."""
    return BitMap(v >> BATCH_BITS for v in index_ids)


def serialize_bitmap(bitmap: BitMap) -> bytes:
    """Portable bytes of `bitmap` after run_optimize (Pulsar: runOptimize + serialize)."""
    bitmap.run_optimize()
    return bitmap.serialize()


def deserialize_bitmap(data: bytes) -> BitMap:
    """Parse portable RoaringBitmap bytes; ValueError when they are not a valid bitmap."""
    try:
        return BitMap.deserialize(bytes(data))
    except Exception as exc:  # pyroaring raises ValueError/RuntimeError depending on the damage
        raise ValueError(f"invalid portable RoaringBitmap ({len(data)} bytes): {exc}") from exc


class LedgerBitmaps:
    """A set of (ledger_id, entry_id) kept as ledger -> RoaringBitmap of entry ids.

    Not thread-safe: the engine guards it with its lock.
    """

    __slots__ = ("_maps", "_count")

    def __init__(self) -> None:
        self._maps: Dict[int, BitMap] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, item: Tuple[int, int]) -> bool:
        bm = self._maps.get(item[0])
        return bm is not None and item[1] in bm

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """True when (ledger_id, entry_id) is in the set."""
        bm = self._maps.get(ledger_id)
        return bm is not None and entry_id in bm

    def add(self, ledger_id: int, entry_id: int) -> bool:
        """Add; True when it was not there before."""
        bm = self._maps.get(ledger_id)
        if bm is None:
            bm = self._maps[ledger_id] = BitMap()
        if entry_id in bm:
            return False
        bm.add(entry_id)
        self._count += 1
        return True

    def add_many(self, ledger_id: int, entry_ids: List[int]) -> None:
        """Add several entries of one ledger."""
        bm = self._maps.get(ledger_id)
        if bm is None:
            bm = self._maps[ledger_id] = BitMap()
        before = len(bm)
        bm.update(entry_ids)
        self._count += len(bm) - before

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove; True when it was there."""
        bm = self._maps.get(ledger_id)
        if bm is None or entry_id not in bm:
            return False
        bm.discard(entry_id)
        self._count -= 1
        if not bm:
            del self._maps[ledger_id]
        return True

    def update_ledger(self, ledger_id: int, bitmap: BitMap) -> None:
        """Union `bitmap` into the ledger's entries."""
        if not bitmap:
            return
        bm = self._maps.get(ledger_id)
        if bm is None:
            self._maps[ledger_id] = BitMap(bitmap)
            self._count += len(bitmap)
        else:
            before = len(bm)
            bm |= bitmap
            self._count += len(bm) - before

    def intersection(self, other: "LedgerBitmaps") -> "LedgerBitmaps":
        """A new set with the items in both."""
        out = LedgerBitmaps()
        for ledger, bm in self._maps.items():
            o = other._maps.get(ledger)
            if o is not None:
                out.update_ledger(ledger, bm & o)
        return out

    def difference(self, other: "LedgerBitmaps") -> "LedgerBitmaps":
        """A new set with the items of this one that are not in `other`."""
        out = LedgerBitmaps()
        for ledger, bm in self._maps.items():
            o = other._maps.get(ledger)
            out.update_ledger(ledger, bm - o if o is not None else bm)
        return out

    def union(self, other: "LedgerBitmaps") -> "LedgerBitmaps":
        """A new set with the items of either."""
        out = LedgerBitmaps()
        for src in (self, other):
            for ledger, bm in src._maps.items():
                out.update_ledger(ledger, bm)
        return out

    def items(self) -> Iterator[Tuple[int, int]]:
        """Every (ledger_id, entry_id), in order."""
        for ledger in sorted(self._maps):
            for entry in self._maps[ledger]:
                yield ledger, entry

    def ledgers(self) -> Iterable[int]:
        """The ledger ids present."""
        return self._maps.keys()

    def to_proto_map(self) -> Dict[int, bytes]:
        """ledger -> portable bytes, for a protobuf map<uint64, bytes>."""
        return {ledger: serialize_bitmap(bm) for ledger, bm in self._maps.items() if bm}

    @classmethod
    def from_proto_map(cls, data: Mapping[int, bytes], what: str = "bitmap map") -> "LedgerBitmaps":
        """Inverse of to_proto_map; ValueError naming `what` and the ledger on bad bytes."""
        out = cls()
        for ledger, raw in data.items():
            try:
                out.update_ledger(int(ledger), deserialize_bitmap(raw))
            except ValueError as exc:
                raise ValueError(f"{what}: ledger {ledger}: {exc}") from exc
        return out

    def size_in_bytes(self) -> int:
        """Serialized size (an estimate of the memory the bitmaps hold)."""
        total = 0
        for bm in self._maps.values():  # pyroaring 1.x has no get_serialized_size_in_bytes
            stats = bm.get_statistics()
            total += (stats["n_bytes_array_containers"] + stats["n_bytes_run_containers"]
                      + stats["n_bytes_bitset_containers"])
        return total
