"""Building one bucket snapshot from exported rows: the executor side of `spark seed`.

No PySpark here (the Spark job in seed.py calls these functions inside applyInPandas), and no
format of its own: rows go through the writer's classifier, items through the engine's
make_item/release_ts, segments through the engine's cut_segments, the snapshot through the
storage interface. A fresh index gives an item added before anything was released the
release-key timestamp release_ts(deliver_at, FRESH_FLOOR), which is what the engine would write.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Sequence, Tuple

from ..bucket.bitmap import LedgerBitmaps
from ..bucket.codec import Item, make_item, release_ts
from ..bucket.config import BucketConfig
from ..bucket.keys import bucket_key
from ..bucket.records import DelayedMessage
from ..bucket.segments import CutSegment, cut_segments, snapshot_metadata_bytes
from ..bucket.storage import BucketSnapshotStorage, write_whole
from ..scheduler.intake import Cancel, Invalid
from .backlog import ClassifyOptions, classify_row

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


def build_bucket(rows: Iterable[Tuple[Any, ...]], config: BucketConfig, opts: ClassifyOptions,
                 tombstones: LedgerBitmaps) -> BucketBuild:
    """Classify, de-duplicate, order and cut one bucket's rows.

    `rows` are tuples (ledger_id, entry_id, batch_index, partition, payload, properties, key,
    event_time). Cancel requests are not items (the driver turned all of them into `tombstones`);
    an item whose position is tombstoned is dropped and stays out of the seen-set, as the engine
    does with an add whose cancel came first. A position seen twice is indexed once.
    """
    out = BucketBuild()
    items: List[Item] = []
    seen = out.seen
    nrows = 0
    for ledger, entry, batch, partition, payload, props, key, event_time in rows:
        nrows += 1
        # Arrow hands over ints, bytes and lists of pairs; NaN/None for null keys and times.
        res = classify_row(ledger, entry, batch, partition, payload if type(payload) is bytes else bytes(payload),
                           dict(props) if props is not None else {}, key if type(key) is str else None,
                           event_time if type(event_time) is int else 0, opts)
        if type(res) is DelayedMessage:
            if tombstones.contains(res.ledger_id, res.entry_id):
                out.cancelled += 1
                continue
            if not seen.add(res.ledger_id, res.entry_id):
                out.duplicates += 1
                continue
            res.validate()
            items.append(make_item(res, release_ts(res.deliver_at, FRESH_FLOOR)))
        elif isinstance(res, Cancel):
            out.cancels += 1
        else:
            out.invalid += 1
            if len(out.invalid_examples) < MAX_EXAMPLES:
                reason = res.reason if isinstance(res, Invalid) else repr(res)
                out.invalid_examples.append(f"{ledger}:{entry}:{batch} (partition {partition}): {reason}")
    out.rows = nrows
    if not items:
        return out
    items.sort()
    out.items = len(items)
    ledgers = list(seen.ledgers())
    out.start_ledger, out.end_ledger = min(ledgers), max(ledgers)
    out.segments = cut_segments(items, config.time_step_ms,
                                config.delayed_delivery_max_indexes_per_bucket_snapshot_segment)
    out.metadata = snapshot_metadata_bytes(out.segments)
    return out


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
