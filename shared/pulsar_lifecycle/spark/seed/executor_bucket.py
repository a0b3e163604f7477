"""Building one bucket snapshot from exported rows: the executor side of `spark seed`.

No PySpark here (the task entry points in executor.py call it), and no
format of its own: rows go through the writer's classifier in its column form
(scheduler/intake_columns.py), items through the engine's item encoding in its column form
(bucket/item_columns.py; both are tested equal to the per-message functions), segments through
the engine's cutting rule (cut_bounds) and segment builder (make_segment), the snapshot through
the storage interface. A fresh index gives an item added before anything was released the
release-key timestamp release_ts(deliver_at, FRESH_FLOOR), which is what the engine would write.
"""
from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np
from pyroaring import BitMap

from ...bucket.bitmap import PACK_SHIFT, LedgerBitmaps
from ...bucket.codec import Item, make_item, release_ts
from ...bucket.config import BucketConfig
from ...bucket.item_columns import encode_framed_columns, release_ts_columns, validate_columns
from ...bucket.keys import bucket_key
from ...bucket.records import BATCH_BITS, MAX_BATCH_INDEX, DelayedMessage
from ...bucket.segments import CutSegment, cut_bounds, make_segment, snapshot_metadata_bytes
from ...bucket.storage import BucketSnapshotStorage, write_whole
from ...scheduler.intake import Cancel, Invalid
from ...scheduler.intake_columns import classify_columns
from ..backlog import ClassifyOptions

log = logging.getLogger(__name__)

FRESH_FLOOR = 1  # the engine's ts floor on a fresh index: _ts_floor (0) + 1
MAX_EXAMPLES = 5


@dataclass
class BucketBuild:
    """One bucket's snapshot content and what the manifest and the report need of it."""

    items: int = 0
    start_ledger: int = -1
    end_ledger: int = -1
    segments: List[CutSegment] = field(default_factory=list)
    metadata: bytes = b""
    seen: LedgerBitmaps = field(default_factory=LedgerBitmaps)
    rows: int = 0
    duplicates: int = 0
    cancelled: int = 0
    cancels: int = 0
    invalid: int = 0
    invalid_examples: List[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The bucket key (#pulsar.internal.delayed.bucket_<start>_<end>) of the items' ledgers."""
        return bucket_key(self.start_ledger, self.end_ledger)


def build_bucket(table: Any, config: BucketConfig, opts: ClassifyOptions, tombstones: LedgerBitmaps) -> BucketBuild:
    """Classify, de-duplicate, order and cut one bucket's rows.

    `table` is a pyarrow Table (or RecordBatch) with the export columns ledger_id, entry_id,
    batch_index, partition, payload, properties, key, event_time. Cancel requests are not items
    (the driver turned all of them into `tombstones`); an item whose position is tombstoned is
    dropped and stays out of the seen-set, as the engine does with an add whose cancel came
    first. A position seen twice is indexed once.

    Everything runs on whole columns: the writer's classifier (classify_columns: classify's rule
    column-wise, classify itself for unusual rows), de-duplication, DelayedMessage.validate
    (validate_columns), the key sort, the engine's cutting rule (cut_bounds), the item encoding
    (encode_framed_columns: encode_framed's bytes) and the per-ledger bitmaps; the engine's
    make_segment closes each segment.
    """
    out = BucketBuild()
    out.rows = table.num_rows
    intake = classify_columns(table, opts.now_ms, opts.max_delay_ms, opts.allowed_target_prefixes)
    for row, res in intake.others:
        if isinstance(res, Cancel):
            out.cancels += 1
            continue
        out.invalid += 1
        if len(out.invalid_examples) < MAX_EXAMPLES:
            reason = res.reason if isinstance(res, Invalid) else repr(res)
            ledger, entry, batch, partition = (table.column(c)[row].as_py() for c in
                                               ("ledger_id", "entry_id", "batch_index", "partition"))
            out.invalid_examples.append(f"{ledger}:{entry}:{batch} (partition {partition}): {reason}")
    items = intake.items
    k = len(items)
    if not k:
        return out
    ledgers = items.ledger.astype(np.uint64)
    ids = items.index_id.astype(np.uint64)
    keep = np.ones(k, dtype=bool)
    if len(tombstones):
        for j in np.flatnonzero(np.isin(ledgers, np.array(list(tombstones.ledgers()), dtype=np.uint64))).tolist():
            if tombstones.contains(int(ledgers[j]), int(ids[j])):
                keep[j] = False
        out.cancelled = int(k - keep.sum())
    # Duplicates: the first of equal positions stays (lexsort is stable).
    by_pos = np.lexsort((ids, ledgers))
    by_pos = by_pos[keep[by_pos]]
    first = np.ones(len(by_pos), dtype=bool)
    first[1:] = (ledgers[by_pos][1:] != ledgers[by_pos][:-1]) | (ids[by_pos][1:] != ids[by_pos][:-1])
    out.duplicates = int(len(by_pos) - first.sum())
    chosen = by_pos[first]  # unique kept positions, ordered by (ledger, index id)
    if not len(chosen):
        return out
    _add_seen(out.seen, ledgers[chosen], ids[chosen])
    validate_columns(items.take(chosen))
    ts = release_ts_columns(items.deliver_at[chosen], FRESH_FLOOR)
    order = np.lexsort((ids[chosen], ledgers[chosen], ts))
    rows = chosen[order]
    ts, lids, iids = ts[order], ledgers[rows], ids[rows]
    data, offsets = encode_framed_columns(items.take(rows), ts)
    ts_list = ts.tolist()
    out.items = len(rows)
    out.start_ledger, out.end_ledger = int(lids.min()), int(lids.max())
    out.segments = [_segment(data[offsets[s]:offsets[e]].tobytes(), ts_list, lids, iids, s, e)
                    for s, e in cut_bounds(ts, config.time_step_ms,  # type: ignore[arg-type]  # numpy: indexes like a sequence
                                           config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)]
    out.metadata = snapshot_metadata_bytes(out.segments)
    return out


def _bitmap(values: Any) -> BitMap:
    """A BitMap of a uint array: through array('I'), pyroaring's bulk path (a numpy array is
    iterated value by value, ~10x slower)."""
    return BitMap(array("I", values.astype(np.uint32).tobytes()))


def _by_ledger(ledgers: Any, ids: Any) -> Iterable[Tuple[int, Any]]:
    """(ledger, its ids) for parallel arrays."""
    if ledgers[0] == ledgers[-1] and (len(ledgers) < 3 or (ledgers == ledgers[0]).all()):
        yield int(ledgers[0]), ids
        return
    order = np.argsort(ledgers, kind="stable")
    sl, si = ledgers[order], ids[order]
    uniq, starts = np.unique(sl, return_index=True)
    ends = list(starts[1:]) + [len(sl)]
    for ledger, a, b in zip(uniq.tolist(), starts.tolist(), ends):
        yield ledger, si[a:b]


def _packed(ids: Any) -> Any:
    """bitmap.pack over an array of index ids."""
    return (ids >> np.uint64(BATCH_BITS)) | ((ids & np.uint64(MAX_BATCH_INDEX)) << np.uint64(PACK_SHIFT))


def _add_seen(seen: LedgerBitmaps, ledgers: Any, ids: Any) -> None:
    for ledger, lids in _by_ledger(ledgers, ids):
        seen.update_ledger_packed(ledger, _bitmap(_packed(lids)))


def _segment(data: bytes, ts: List[int], ledgers: Any, ids: Any, s: int, e: int) -> CutSegment:
    """Segment [s, e) of the sorted items (`data`: their framed items), closed by the engine's
    make_segment."""
    index_ids: Dict[int, Any] = {}
    entry_ids: Dict[int, BitMap] = {}
    packed_ids: Dict[int, BitMap] = {}
    for ledger, lids in _by_ledger(ledgers[s:e], ids[s:e]):
        index_ids[ledger] = None  # make_segment takes the ledgers from here, the bitmaps from below
        entry_ids[ledger] = _bitmap(lids >> np.uint64(BATCH_BITS))  # = entry_bitmap(index ids), columnar
        packed_ids[ledger] = _bitmap(_packed(lids))  # = pack_bitmap(index ids), columnar
    first = (ts[s], int(ledgers[s]), int(ids[s]))
    last = (ts[e - 1], int(ledgers[e - 1]), int(ids[e - 1]))
    return make_segment(data, e - s, first, last, index_ids, entry_ids, packed_ids)


def write_bucket(storage: BucketSnapshotStorage, bucket_id: int, build: BucketBuild, config: BucketConfig) -> int:
    """Write the snapshot under the reserved `bucket_id` through the storage interface; returns
    its length in bytes (for the manifest's BucketRef)."""
    write_whole(storage, build.metadata, [s.data for s in build.segments], build.key, config.topic,
                config.cursor, bucket_id=bucket_id)
    length = storage.get_length(bucket_id)
    log.info("event=seed_bucket_written bucket=%d key=%s items=%d segments=%d bytes=%d",
             bucket_id, build.key, build.items, len(build.segments), length)
    return length


def items_of(messages: Sequence[DelayedMessage]) -> List[Item]:
    """Engine items of messages added to a fresh index (for tests and the baseline benchmark)."""
    return sorted(make_item(m, release_ts(m.deliver_at, FRESH_FLOOR)) for m in messages)


def tombstones_of(cancels: Iterable[Cancel]) -> LedgerBitmaps:
    """The positions cancel requests name, as the manifest's tombstones."""
    out = LedgerBitmaps()
    for c in cancels:
        out.add(c.ledger_id, c.entry_id)
    return out
