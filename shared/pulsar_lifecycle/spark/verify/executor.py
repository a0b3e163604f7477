"""The executor side of `spark verify`: the mapInPandas functions its Spark tasks run.

No PySpark here: the job (driver.py) hands these functions to mapInPandas; the checks of one
bucket are executor_checks.py.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator

from ...bucket.bitmap import LedgerBitmaps
from ...bucket.codec import BucketRef, CorruptRecordError, Manifest, SnapshotMetadata, index_id_of, parse, parse_segment
from ...bucket.config import BucketConfig
from ...bucket.manifest import sets_are_packed
from ...bucket.records import DelayedMessage
from ...bucket.storage import StorageError
from ...scheduler.intake import Cancel
from ..backlog import ROW_COLUMNS, ClassifyOptions, as_properties, classify_row
from ..store import open_store
from .executor_checks import check_bucket


def check_partition(url: str, config: BucketConfig, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInPandas: check the buckets of each batch (rows: bucket_id, ref, seen)."""
    import pandas as pd  # executor side

    storage = open_store(url)
    try:
        for pdf in batches:
            out = []
            for bid, ref_raw, seen_raw in zip(pdf["bucket_id"], pdf["ref"], pdf["seen"]):
                ref = BucketRef.FromString(bytes(ref_raw))
                part = Manifest.FromString(bytes(seen_raw))
                seen = LedgerBitmaps.from_proto_map(part.seen, "seen-set", packed=sets_are_packed(part))
                out.append({"bucket_id": int(bid), "result": json.dumps(check_bucket(storage, ref, config, seen).to_dict())})
            yield pd.DataFrame(out, columns=["bucket_id", "result"])
    finally:
        storage.close()



def positions_partition(url: str, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInPandas: every index position of the batch's buckets (ledger, entry, ts, bucket)."""
    import pandas as pd  # executor side

    storage = open_store(url)
    try:
        for pdf in batches:
            for bid in pdf["bucket_id"]:
                bid = int(bid)
                try:
                    n = len(parse(SnapshotMetadata, storage.get_metadata(bid), "metadata").metadata_list)
                    datas = storage.get_segments(bid, 1, n) if n else []
                except (StorageError, CorruptRecordError):
                    continue  # reported by the check pass
                for data in datas:
                    try:
                        idx = parse_segment(data).indexes
                    except CorruptRecordError:
                        continue
                    yield pd.DataFrame({"ledger_id": [i.ledger_id for i in idx], "entry_id": [index_id_of(i) for i in idx],
                                        "ts": [i.timestamp for i in idx], "bucket_id": [bid] * len(idx)})
    finally:
        storage.close()



def expected_partition(opts: ClassifyOptions, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInPandas: what the writer indexes for each exported row: (ledger, entry, deliver_at, kind)."""
    import pandas as pd  # executor side

    for pdf in batches:
        out: Dict[str, list] = {"ledger_id": [], "entry_id": [], "deliver_at": [], "kind": []}
        for ledger, entry, batch, part, payload, props, key, evt in zip(*(pdf[c].tolist() for c in ROW_COLUMNS)):
            res = classify_row(int(ledger), int(entry), int(batch), int(part), bytes(payload), as_properties(props),
                               key if isinstance(key, str) else None, int(evt or 0), opts)
            if isinstance(res, Cancel):
                out["ledger_id"].append(res.ledger_id)
                out["entry_id"].append(res.entry_id)
                out["deliver_at"].append(0)
                out["kind"].append("cancel")
            elif isinstance(res, DelayedMessage):
                out["ledger_id"].append(res.ledger_id)
                out["entry_id"].append(res.entry_id)
                out["deliver_at"].append(res.deliver_at)
                out["kind"].append("item")
        yield pd.DataFrame(out)
