"""The checks `spark verify` runs on one bucket snapshot (executor side, no PySpark; called by executor.py).

Every rule is the engine's own: segments must be what cut_segments makes of the snapshot's
items (order, time step, size, maximal segments), each bitmap what the engine's
serialize_bitmap gives for the segment's entries, the metadata's min/max what the segment holds,
the bucket key what bucket_key gives for the items' ledgers; the manifest's count, length and
seen-set must agree with the snapshot.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from pyroaring import BitMap

from ...bucket.bitmap import LedgerBitmaps, deserialize_bitmap, entry_bitmap, pack_bitmap
from ...bucket.codec import CorruptRecordError, SnapshotMetadata, parse, parse_segment, segment_items
from ...bucket.config import BucketConfig
from ...bucket.keys import bucket_key
from ...bucket.segments import cut_segments
from ...bucket.storage import BucketSnapshotStorage, SnapshotNotFoundError, StorageError

MAX_EXAMPLES_PER_KIND = 3

# Violation kinds (the JSON report and the tests use these names).
CORRUPT = "corrupt"  # undecodable metadata/segment, or unreadable snapshot
ORDER = "order"  # release keys not strictly increasing (within or across segments)
TIME_STEP = "time_step"  # a segment spans more than the time step
SEGMENT_SIZE = "segment_size"  # a segment holds more than max indexes per segment
CUT_RULE = "cut_rule"  # segments are not the ones the engine's cutter makes (e.g. not maximal)
BITMAP = "bitmap"  # a segment's bitmap differs from its indexes
MIN_MAX = "min_max"  # metadata min/max schedule timestamps differ from the segment's
RANGE = "range"  # items outside the bucket's ledger range, or key/range not the items' ledgers
MANIFEST = "manifest"  # manifest count/length/seen-set disagree with the snapshot, bad manifest
OVERLAP = "overlap"  # two buckets' ledger ranges overlap
MISSING_SNAPSHOT = "missing_snapshot"  # listed in the manifest, absent from the store
DUPLICATE = "duplicate"  # a position indexed twice
MISSING = "missing"  # (--against) a source message in no snapshot, not cancelled, not released
NOT_IN_EXPORT = "not_in_export"  # (--against, seeded or --frozen store) an indexed message the export lacks


@dataclass
class Violation:
    """One broken rule, with where and what."""

    kind: str
    bucket_id: int
    detail: str


@dataclass
class BucketCheck:
    """What verify found in one bucket (small: goes back to the driver)."""

    bucket_id: int
    status: str = "ok"  # ok | gone (snapshot vanished: re-checked on the driver)
    items: int = 0
    length: int = 0
    segments: List[Tuple[int, int, int]] = field(default_factory=list)  # (min ts, max ts, count)
    violations: List[Violation] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)  # violations per kind (examples are capped)

    def add(self, kind: str, detail: str) -> None:
        """Record a violation (the first few of each kind keep their detail)."""
        n = self.counts.get(kind, 0)
        self.counts[kind] = n + 1
        if n < MAX_EXAMPLES_PER_KIND:
            self.violations.append(Violation(kind, self.bucket_id, detail))

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def check_bucket(storage: BucketSnapshotStorage, ref: Any, config: BucketConfig,
                 seen: Optional[LedgerBitmaps]) -> BucketCheck:
    """Check one snapshot against the engine's rules and its manifest entry `ref` (a BucketRef);
    `seen` = the manifest's seen-set for the bucket's ledgers (None: not checked)."""
    bid = ref.bucket_id
    out = BucketCheck(bucket_id=bid)
    try:
        meta = parse(SnapshotMetadata, storage.get_metadata(bid), f"bucket {bid} metadata")
        n = len(meta.metadata_list)
        datas = storage.get_segments(bid, 1, n) if n else []
        out.length = storage.get_length(bid)
    except SnapshotNotFoundError:
        out.status = "gone"
        return out
    except (StorageError, CorruptRecordError) as exc:
        out.add(CORRUPT, str(exc))
        return out
    items = []
    prev = None
    step = config.time_step_ms
    max_idx = config.delayed_delivery_max_indexes_per_bucket_snapshot_segment
    ledgers = LedgerBitmaps()
    seg_counts: List[int] = []
    for k, (sm, data) in enumerate(zip(meta.metadata_list, datas), start=1):
        try:
            seg = parse_segment(data, f"bucket {bid} segment {k}")
        except CorruptRecordError as exc:
            out.add(CORRUPT, str(exc))
            return out
        seg_items = segment_items(seg)
        seg_counts.append(len(seg_items))
        if not seg_items:
            out.add(CUT_RULE, f"segment {k} is empty")
            continue
        keys = [it[:3] for it in seg_items]
        for key in keys:
            if prev is not None and key <= prev:
                out.add(ORDER, f"segment {k}: key {key} does not follow {prev}")
            prev = key
        first, last = keys[0][0], keys[-1][0]
        out.segments.append((first, last, len(keys)))
        if last - first > step - 1:
            out.add(TIME_STEP, f"segment {k} spans {last - first} ms > time step {step} ms - 1")
        if max_idx != -1 and len(keys) > max_idx:
            out.add(SEGMENT_SIZE, f"segment {k} holds {len(keys)} indexes > {max_idx}")
        if (sm.min_schedule_timestamp, sm.max_schedule_timestamp) != (min(t for t, _, _ in keys), max(t for t, _, _ in keys)):
            out.add(MIN_MAX, f"segment {k}: metadata min/max {sm.min_schedule_timestamp}/{sm.max_schedule_timestamp}, "
                             f"indexes {min(t for t, _, _ in keys)}/{max(t for t, _, _ in keys)}")
        expected: Dict[int, List[int]] = {}
        for _, ledger, entry in keys:
            expected.setdefault(ledger, []).append(entry)
            if not ledgers.add(ledger, entry):
                out.add(DUPLICATE, f"position {ledger}:{entry} (index id) indexed twice in the bucket")
        _check_bitmaps(out, k, sm, expected)
        items.extend(seg_items)
    out.items = len(items)
    if len(datas) != len(meta.metadata_list):
        out.add(CORRUPT, f"metadata lists {len(meta.metadata_list)} segments, snapshot has {len(datas)}")
    _check_whole_bucket(out, meta, seg_counts, ledgers)
    _check_cut(out, items, config)
    _check_manifest(out, ref, items, ledgers, seen)
    return out


def _check_whole_bucket(out: BucketCheck, meta: Any, seg_counts: List[int], ledgers: LedgerBitmaps) -> None:
    """Our extension of the metadata (docs/bucket-format.md), when present: each segment's
    count, and the packed ids of the whole bucket, are what the segments hold (recovery reads
    them instead of the segments' bitmaps for a bucket nothing of which was released)."""
    if len(meta.segment_count) and list(meta.segment_count) != seg_counts:
        out.add(BITMAP, f"metadata segment_count (first {list(meta.segment_count)[:4]}, sum {sum(meta.segment_count)}) "
                        f"differs from the segments' indexes (first {seg_counts[:4]}, sum {sum(seg_counts)})")
    if len(meta.packed_index_bit_map):
        try:
            whole = LedgerBitmaps.from_proto_map(meta.packed_index_bit_map, "metadata packed_index_bit_map")
        except ValueError as exc:
            out.add(BITMAP, str(exc))
            return
        if len(whole) != len(ledgers) or len(whole.difference(ledgers)):
            out.add(BITMAP, f"metadata packed_index_bit_map holds {len(whole)} ids, not the {len(ledgers)} the "
                            "segments index")


def _check_bitmaps(out: BucketCheck, k: int, sm: Any, expected: Dict[int, List[int]]) -> None:
    """Layouts 2 and 3: delayed_index_bit_map = the real entry ids (entry_bitmap of the index
    ids), and the extension map = the index ids (layout 2: index_id_bit_map) or the packed
    index ids (layout 3: packed_index_bit_map); layout 1 (no extension map): index ids."""
    want_ids = {ledger: BitMap(ids) for ledger, ids in expected.items()}
    extension = [("packed_index_bit_map", sm.packed_index_bit_map, {l: pack_bitmap(b) for l, b in want_ids.items()}),
                 ("index_id_bit_map", sm.index_id_bit_map, want_ids)]
    extension = [e for e in extension if len(e[1])]
    maps = [("delayed_index_bit_map", sm.delayed_index_bit_map,
             {l: entry_bitmap(b) for l, b in want_ids.items()} if extension else want_ids)] + extension
    for name, stored, want_map in maps:
        for ledger in sorted(set(stored) | set(want_map)):
            if ledger not in stored:
                out.add(BITMAP, f"segment {k}: {name} has no bitmap for ledger {ledger}")
                continue
            try:
                have = deserialize_bitmap(stored[ledger])
            except ValueError as exc:
                out.add(BITMAP, f"segment {k} {name} ledger {ledger}: {exc}")
                continue
            want = want_map.get(ledger, BitMap())
            if have != want:
                out.add(BITMAP, f"segment {k} {name} ledger {ledger}: bitmap holds {len(have)} ids, the segment "
                                f"{len(want)}{'' if len(have) != len(want) else ' (different ids)'}")


def _check_cut(out: BucketCheck, items: List[Any], config: BucketConfig) -> None:
    """The segments must be exactly what the engine's cutter makes of these items."""
    if out.counts.get(ORDER) or not items:
        return  # the cutter needs ordered items; the order violation is already reported
    recut = cut_segments(items, config.time_step_ms, config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
    want = [(s.min_ts, s.max_ts, s.count) for s in recut]
    if want != out.segments:
        first = next((i for i, (a, b) in enumerate(zip(want, out.segments)) if a != b), min(len(want), len(out.segments)))
        out.add(CUT_RULE, f"{len(out.segments)} segments where the engine's cut gives {len(want)}; first difference "
                          f"at segment {first + 1}")


def _check_manifest(out: BucketCheck, ref: Any, items: List[Any], ledgers: LedgerBitmaps,
                    seen: Optional[LedgerBitmaps]) -> None:
    bid = ref.bucket_id
    if ref.index_count != len(items):
        out.add(MANIFEST, f"manifest says {ref.index_count} indexes, snapshot holds {len(items)}")
    if ref.snapshot_length and ref.snapshot_length != out.length:
        out.add(MANIFEST, f"manifest says {ref.snapshot_length} bytes, snapshot is {out.length}")
    if items:
        lo = min(ledgers.ledgers())
        hi = max(ledgers.ledgers())
        if lo < ref.start_ledger_id or hi > ref.end_ledger_id:
            out.add(RANGE, f"items of ledgers {lo}..{hi} outside the bucket's range "
                           f"{ref.start_ledger_id}..{ref.end_ledger_id}")
        try:
            key = bucket_key(ref.start_ledger_id, ref.end_ledger_id)
        except ValueError as exc:
            out.add(RANGE, f"bucket {bid}: {exc}")
        else:
            if ref.bucket_key != key:
                out.add(RANGE, f"bucket key {ref.bucket_key!r} does not name its range ({key!r})")
    if seen is not None:
        unseen = ledgers.difference(seen)
        if len(unseen):
            ledger, entry = next(unseen.items())
            out.add(MANIFEST, f"{len(unseen)} indexes missing from the manifest's seen-set, e.g. {ledger}:{entry}")


def overlapping(ranges: List[Tuple[int, int, int]]) -> List[Tuple[int, int]]:
    """Pairs of bucket ids whose (start, end) ledger ranges overlap; `ranges` = (id, start, end)."""
    ordered = sorted(ranges, key=lambda r: (r[1], r[2]))
    out = []
    reach_id, reach = None, -1
    for bid, start, end in ordered:
        if reach_id is not None and start <= reach:
            out.append((reach_id, bid))
        if end > reach:
            reach_id, reach = bid, end
    return out
