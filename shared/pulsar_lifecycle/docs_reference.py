"""Renders the userConfig reference tables of docs/configuration.md from the code's own key lists."""
from __future__ import annotations

from dataclasses import fields
from typing import List

from .bucket.config import BucketConfig
from .delaylevel.config import SYNCER_KEYS
from .scheduler.config import WRITER_KEYS, bucket_keys

BUCKET_MEANINGS = {
    "delayed_delivery_min_index_count_per_bucket": "Pulsar's seal rule: seal the mutable bucket at a ledger boundary once it holds this many indexes.",
    "delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds": "Segment cut rule: a segment spans at most this many seconds of deliver-at times.",
    "delayed_delivery_max_indexes_per_bucket_snapshot_segment": "Segment cut rule: at most this many indexes per segment (-1 = unlimited).",
    "delayed_delivery_max_num_buckets": "Merge adjacent buckets above this many (Pulsar's default -1 never merges; ours is 64, see bucket-format.md).",
    "max_unacked_per_bucket": "Ours: also seal when the mutable bucket holds this many items (stays under Pulsar's 50,000 unacked-per-consumer cap).",
    "max_seal_delay_millis": "Ours: also seal when the mutable bucket's oldest item is older than this.",
}


def _md(value: object) -> str:
    return f"`{value}`" if value not in ("", None) else "(empty)"


def writer_table() -> str:
    """The BucketSnapshotWriter userConfig table (Markdown)."""
    rows: List[str] = ["| key | default | meaning |", "|---|---|---|"]
    for key, (_attr, default, meaning) in WRITER_KEYS.items():
        rows.append(f"| `{key}` | {_md(default)} | {meaning} |")
    defaults = {f.name: f.default for f in fields(BucketConfig)}
    for key, attr in bucket_keys().items():
        rows.append(f"| `{key}` | {_md(defaults[attr])} | {BUCKET_MEANINGS.get(attr, '')} |")
    return "\n".join(rows)


def syncer_table() -> str:
    """The DelayLevelSyncer userConfig table (Markdown)."""
    rows: List[str] = ["| key | default | meaning |", "|---|---|---|"]
    for key, (_attr, default, meaning) in SYNCER_KEYS.items():
        rows.append(f"| `{key}` | {_md(default)} | {meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - `python -m pulsar_lifecycle.docs_reference`
    print(writer_table())
    print()
    print(syncer_table())
