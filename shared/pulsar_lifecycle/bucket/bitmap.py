"""Per-ledger RoaringBitmaps of entry ids in Pulsar's on-disk format.

Pulsar stores one 32-bit `org.roaringbitmap.RoaringBitmap` per ledger, `runOptimize()`d and
written with the standard portable serialization. pyroaring (CRoaring) writes byte-identical
portable bytes, so these bitmaps are readable by Pulsar and vice versa.

Packed index ids. An index id is `entry << 10 | batch_index` (records.py): unbatched messages
have ids 1,024 apart, which a RoaringBitmap keeps one container per 64 ids (~2 bytes per id plus
a container each; 10M unbatched ids: ~27 MB per set in memory, a second to decode). `pack`
rotates the batch index into the top 10 bits (`entry | batch << 22`, a bijection of 32-bit
values): unbatched ids become the entry ids themselves (dense runs: a few bytes per ledger),
batched ones dense runs per batch index. The item sets (LedgerBitmaps) hold packed ids, the
manifest (format 2) stores them packed and snapshots carry packed_index_bit_map.
"""
from __future__ import annotations

from array import array
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from pyroaring import BitMap

from .records import BATCH_BITS, MAX_BATCH_INDEX

PACK_SHIFT = 32 - BATCH_BITS  # the batch index's place in a packed id
_ENTRY_MASK = (1 << PACK_SHIFT) - 1


def pack(index_id: int) -> int:
    """The packed id of an index id: `entry | batch_index << 22`."""
    return (index_id >> BATCH_BITS) | ((index_id & MAX_BATCH_INDEX) << PACK_SHIFT)


def unpack(packed: int) -> int:
    """The index id of a packed id (inverse of pack)."""
    return ((packed & _ENTRY_MASK) << BATCH_BITS) | (packed >> PACK_SHIFT)


_NUMPY_FROM = 64  # below this many ids the plain loop is as fast as the numpy round trip


def pack_bitmap(index_ids: BitMap) -> BitMap:
    """A bitmap of index ids as packed ids. Large ones (an old store's seen-set or segment
    bitmaps, converted at every recovery until merged away) go through numpy when it is
    installed: ~20x faster than the loop, which stays the path without numpy."""
    if len(index_ids) >= _NUMPY_FROM:
        try:
            import numpy as np  # optional (not a core dependency); only for large conversions
        except ImportError:
            return pack_ids(index_ids)
        ids = np.frombuffer(index_ids.to_array(), dtype=np.uint32)
        packed = (ids >> BATCH_BITS) | ((ids & MAX_BATCH_INDEX) << PACK_SHIFT)
        out = array("I")
        out.frombytes(packed.astype(np.uint32).tobytes())
        return BitMap(out)
    return pack_ids(index_ids)


def pack_ids(index_ids: Iterable[int]) -> BitMap:
    """A bitmap of the packed ids of `index_ids`, without numpy: for the bitmaps of every seal
    and merge, where loading numpy (about 15 MB of RSS) would cost more than the loop."""
    shift, mask, place = BATCH_BITS, MAX_BATCH_INDEX, PACK_SHIFT
    return BitMap([(v >> shift) | ((v & mask) << place) for v in index_ids])


def unpack_bitmap(packed: BitMap) -> BitMap:
    """A bitmap of packed ids as index ids."""
    return BitMap(unpack(v) for v in packed)


def entry_bitmap(index_ids: Iterable[int]) -> BitMap:
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


# The multi-way union turns every container it touches into a bitset (8 KB) before repairing it:
# fastest when the segments' ids share a few containers (messages outside batches: ids are entry
# ids), 3x slower than in-place |= when they spread over many (batched entries: a bucket's ids span
# ~1,000 containers; 1M pending in 64 buckets of ~270 segments, 230 vs 78 ms).
MULTI_WAY_MAX_CONTAINERS = 64


def union_bitmaps(bms: List[BitMap]) -> BitMap:
    """The union of `bms` (a single non-empty one itself, not a copy): a multi-way union when
    their ids share a few containers, in-place |= when they spread over many."""
    bms = [bm for bm in bms if bm]
    if len(bms) <= 1:
        return bms[0] if bms else BitMap()
    lo = min(bm.min() for bm in bms) >> 16
    hi = max(bm.max() for bm in bms) >> 16
    if hi - lo < MULTI_WAY_MAX_CONTAINERS:
        return BitMap.union(*bms)
    union = BitMap(bms[0])
    for bm in bms[1:]:
        union |= bm
    return union


class LedgerBitmaps:
    """A set of (ledger_id, index id) kept as ledger -> RoaringBitmap of packed ids (see pack:
    unbatched ids are dense that way). The API takes and returns index ids; `*_packed`
    methods and the proto maps (manifest format 2) deal in packed ids.

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
        e = item[1]
        return bm is not None and ((e >> BATCH_BITS) | ((e & MAX_BATCH_INDEX) << PACK_SHIFT)) in bm

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """True when (ledger_id, entry_id) is in the set."""
        bm = self._maps.get(ledger_id)
        # pack() inlined: this is the writer's per-message duplicate check
        return bm is not None and ((entry_id >> BATCH_BITS) | ((entry_id & MAX_BATCH_INDEX) << PACK_SHIFT)) in bm

    def add(self, ledger_id: int, entry_id: int) -> bool:
        """Add; True when it was not there before."""
        bm = self._maps.get(ledger_id)
        if bm is None:
            bm = self._maps[ledger_id] = BitMap()
        p = (entry_id >> BATCH_BITS) | ((entry_id & MAX_BATCH_INDEX) << PACK_SHIFT)
        if p in bm:
            return False
        bm.add(p)
        self._count += 1
        return True

    def add_many(self, ledger_id: int, entry_ids: List[int]) -> None:
        """Add several entries of one ledger."""
        bm = self._maps.get(ledger_id)
        if bm is None:
            bm = self._maps[ledger_id] = BitMap()
        before = len(bm)
        bm.update([(e >> BATCH_BITS) | ((e & MAX_BATCH_INDEX) << PACK_SHIFT) for e in entry_ids])
        self._count += len(bm) - before

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove; True when it was there."""
        bm = self._maps.get(ledger_id)
        p = (entry_id >> BATCH_BITS) | ((entry_id & MAX_BATCH_INDEX) << PACK_SHIFT)
        if bm is None or p not in bm:
            return False
        bm.discard(p)
        self._count -= 1
        if not bm:
            del self._maps[ledger_id]
        return True

    def update_ledger(self, ledger_id: int, bitmap: BitMap) -> None:
        """Union `bitmap` (index ids) into the ledger's entries."""
        if bitmap:
            self.update_ledger_packed(ledger_id, pack_bitmap(bitmap))

    def update_ledger_packed(self, ledger_id: int, packed: BitMap) -> None:
        """Union `packed` (packed ids; not kept, copied when needed) into the ledger's entries."""
        if not packed:
            return
        bm = self._maps.get(ledger_id)
        if bm is None:
            self._maps[ledger_id] = BitMap(packed)
            self._count += len(packed)
        else:
            before = len(bm)
            bm |= packed
            self._count += len(bm) - before

    def optimize(self, first_ledger: int, last_ledger: int) -> None:
        """Compress the bitmaps of ledgers first_ledger..last_ledger into runs where that is
        smaller (CRoaring's run_optimize). The ids added to a ledger are mostly consecutive
        entries per batch index, which array containers keep at 2 bytes each: a ledger of 50,000
        messages in batches of 1,000 drops from about 95 KB to about 20 KB. Same set."""
        if last_ledger - first_ledger < len(self._maps):
            for ledger in range(first_ledger, last_ledger + 1):
                bm = self._maps.get(ledger)
                if bm is not None:
                    bm.run_optimize()
        else:
            for ledger, bm in self._maps.items():
                if first_ledger <= ledger <= last_ledger:
                    bm.run_optimize()

    def intersection(self, other: "LedgerBitmaps") -> "LedgerBitmaps":
        """A new set with the items in both."""
        out = LedgerBitmaps()
        for ledger, bm in self._maps.items():
            o = other._maps.get(ledger)
            if o is not None:
                out.update_ledger_packed(ledger, bm & o)
        return out

    def difference(self, other: "LedgerBitmaps") -> "LedgerBitmaps":
        """A new set with the items of this one that are not in `other`."""
        out = LedgerBitmaps()
        for ledger, bm in self._maps.items():
            o = other._maps.get(ledger)
            out.update_ledger_packed(ledger, bm - o if o is not None else bm)
        return out

    def union(self, other: "LedgerBitmaps") -> "LedgerBitmaps":
        """A new set with the items of either."""
        out = LedgerBitmaps()
        for src in (self, other):
            for ledger, bm in src._maps.items():
                out.update_ledger_packed(ledger, bm)
        return out

    def items(self) -> Iterator[Tuple[int, int]]:
        """Every (ledger_id, entry_id), in order."""
        for ledger in sorted(self._maps):
            for entry in sorted(unpack(p) for p in self._maps[ledger]):
                yield ledger, entry

    def ledgers(self) -> Iterable[int]:
        """The ledger ids present."""
        return self._maps.keys()

    def last_entry(self) -> Optional[Tuple[int, int]]:
        """(ledger, entry id) of the furthest entry whose first item (batch index 0, or the entry's
        only message) is in the set; None when there is none. An entry whose first item is missing
        is not counted, so the answer never lies beyond the set's last entry."""
        for ledger in sorted(self._maps, reverse=True):
            bm = self._maps[ledger]
            first_items = bm.rank(_ENTRY_MASK)  # packed ids with batch index 0 are the lowest ones
            if first_items:
                return ledger, bm[first_items - 1]
        return None

    def to_proto_map(self) -> Dict[int, bytes]:
        """ledger -> portable bytes of the packed ids, for a protobuf map<uint64, bytes>
        (manifest format 2)."""
        return {ledger: serialize_bitmap(bm) for ledger, bm in self._maps.items() if bm}

    @classmethod
    def from_proto_map(cls, data: Mapping[int, bytes], what: str = "bitmap map", *,
                       packed: bool = True) -> "LedgerBitmaps":
        """Inverse of to_proto_map (`packed=False`: bitmaps of index ids, manifest format 1);
        ValueError naming `what` and the ledger on bad bytes."""
        out = cls()
        for ledger, raw in data.items():
            try:
                bm = deserialize_bitmap(raw)
            except ValueError as exc:
                raise ValueError(f"{what}: ledger {ledger}: {exc}") from exc
            out.update_ledger_packed(int(ledger), bm if packed else pack_bitmap(bm))
        return out

    def size_in_bytes(self) -> int:
        """Serialized size (an estimate of the memory the bitmaps hold)."""
        total = 0
        for bm in self._maps.values():  # pyroaring 1.x has no get_serialized_size_in_bytes
            stats = bm.get_statistics()
            total += (stats["n_bytes_array_containers"] + stats["n_bytes_run_containers"]
                      + stats["n_bytes_bitset_containers"])
        return total
