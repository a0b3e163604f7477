"""The exported backlog: one row per scheduling-topic message, as `export-backlog` writes it.

Rows keep the message as the broker delivered it (position, payload, key, properties, event
time); `deliver_at` and `target` are copies of the protocol properties for people and queries.
The seeder turns a row into an index item with the writer's own classifier
(scheduler/intake.classify), so a seeded store holds exactly what the writer would have indexed.

External datasets of scheduled jobs (no Pulsar positions) get positions from a reserved range
of ledger ids that BookKeeper does not hand out in practice: EXTERNAL_LEDGER_BASE = 2**62 and
up (BookKeeper ledger ids count up from 0; the range is 2**61 ids wide per dataset id),
EXTERNAL_ENTRIES_PER_LEDGER entries per synthetic ledger, partition -1, no batch index.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pyarrow as pa

from ..scheduler.intake import Intake, classify
from ..scheduling_protocol import CANCEL_PROP, DELIVER_AT_PROP, TARGET_PROP, ProtocolError, parse_deliver_at
from .errors import SparkJobError
from .failures import spark_step
from .paths import JobPath, resolve

EXPORT_SCHEMA = pa.schema([
    pa.field("ledger_id", pa.int64(), nullable=False),
    pa.field("entry_id", pa.int64(), nullable=False),
    pa.field("batch_index", pa.int32(), nullable=False),  # -1: not batched
    pa.field("partition", pa.int32(), nullable=False),  # -1: not partitioned
    pa.field("deliver_at", pa.int64()),  # __pl_deliver_at__ parsed; null when absent or malformed
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("key", pa.string()),
    pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
    pa.field("event_time", pa.int64(), nullable=False),  # 0: none
    pa.field("target", pa.string()),  # __pl_target__; null = the writer's output topic
    pa.field("publish_time", pa.int64(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
])
COLUMNS = tuple(EXPORT_SCHEMA.names)
# The columns the seeder and verify read (the rest are copies for people and queries).
ROW_COLUMNS = ("ledger_id", "entry_id", "batch_index", "partition", "payload", "properties", "key", "event_time")
AVRO_FORMAT = "org.apache.spark.sql.avro.AvroFileFormat"  # built into Spark 4 without the spark-avro module

EXTERNAL_LEDGER_BASE = 1 << 62
EXTERNAL_DATASET_SPAN = 1 << 40  # synthetic ledgers per dataset id
EXTERNAL_ENTRIES_PER_LEDGER = 50_000  # Pulsar's default managedLedgerMaxEntriesPerLedger
MAX_EXTERNAL_DATASET_ID = (1 << 21) - 1


@dataclass(frozen=True)
class ClassifyOptions:
    """The writer's intake checks applied when seeding: now, maxDelaySeconds, target prefixes."""

    now_ms: int
    max_delay_ms: int
    allowed_target_prefixes: Tuple[str, ...]


def as_properties(value: Any) -> Dict[str, str]:
    """A map column's value as a dict (Arrow/pandas hand maps over as lists of pairs)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    return dict(value)


def classify_row(ledger_id: int, entry_id: int, batch_index: int, partition: int, payload: bytes,
                 properties: Dict[str, str], key: Optional[str], event_time: int, opts: ClassifyOptions) -> Intake:
    """What the writer's intake makes of this exported message (item, cancel, or invalid)."""
    return classify(payload=payload, properties=properties, key=key, event_time=event_time,
                    position=(ledger_id, entry_id, partition, batch_index), now_ms=opts.now_ms,
                    max_delay_ms=opts.max_delay_ms, allowed_target_prefixes=opts.allowed_target_prefixes)


def protocol_columns(properties: Mapping[str, str]) -> Tuple[Optional[int], Optional[str]]:
    """(deliver_at, target) copied from the protocol properties (None when absent/malformed)."""
    deliver_at: Optional[int] = None
    if DELIVER_AT_PROP in properties:
        try:
            deliver_at = parse_deliver_at(properties[DELIVER_AT_PROP])
        except ProtocolError:
            deliver_at = None
    return deliver_at, properties.get(TARGET_PROP) or None


def is_cancel(properties: Mapping[str, str]) -> bool:
    """True for a cancel request (`__pl_cancel__`)."""
    return CANCEL_PROP in properties


def external_position(dataset_id: int, row_number: int) -> Tuple[int, int]:
    """(ledger id, entry id) of row `row_number` of external dataset `dataset_id`: from the reserved
    range, never a ledger id BookKeeper hands out to a topic."""
    if not 0 <= dataset_id <= MAX_EXTERNAL_DATASET_ID:
        raise ValueError(f"dataset id must be in [0, {MAX_EXTERNAL_DATASET_ID}], got {dataset_id}")
    if not 0 <= row_number < EXTERNAL_DATASET_SPAN * EXTERNAL_ENTRIES_PER_LEDGER:
        raise ValueError(f"row number {row_number} is outside the dataset's position range")
    ledger, entry = divmod(row_number, EXTERNAL_ENTRIES_PER_LEDGER)
    return EXTERNAL_LEDGER_BASE + dataset_id * EXTERNAL_DATASET_SPAN + ledger, entry


def external_rows(jobs: Iterable[Mapping[str, Any]], dataset_id: int, topic: str,
                  first_row: int = 0) -> List[Dict[str, Any]]:
    """Export rows for external scheduled jobs: each job has `deliver_at` (ms) and `payload`
    (bytes or str), optionally `key`, `target`, `properties`, `event_time`. The protocol
    properties are set from deliver_at/target so the seeder classifies them like real messages."""
    rows = []
    for i, job in enumerate(jobs, start=first_row):
        if "deliver_at" not in job or "payload" not in job:
            raise ValueError(f"external job {i}: needs deliver_at and payload, got keys {sorted(job)}")
        props = {str(k): str(v) for k, v in (job.get("properties") or {}).items()}
        props[DELIVER_AT_PROP] = str(int(job["deliver_at"]))
        if job.get("target"):
            props[TARGET_PROP] = str(job["target"])
        payload = job["payload"]
        ledger, entry = external_position(dataset_id, i)
        rows.append({
            "ledger_id": ledger, "entry_id": entry, "batch_index": -1, "partition": -1,
            "deliver_at": int(job["deliver_at"]),
            "payload": payload.encode() if isinstance(payload, str) else bytes(payload),
            "key": job.get("key"), "properties": list(props.items()),
            "event_time": int(job.get("event_time") or 0), "target": job.get("target") or None,
            "publish_time": 0, "topic": topic,
        })
    return rows


def joined_names(paths: Sequence[Any]) -> str:
    """Paths or URLs as one comma-separated list, for messages."""
    return ", ".join(str(p) for p in paths)


def read_backlog(spark: Any, inputs: Sequence[Any], fmt: str = "parquet") -> Any:
    """The exported rows as a DataFrame (Parquet, or Avro through Spark's built-in Avro format);
    `inputs` are resolved paths (JobPath) or paths/URLs, each resolved here."""
    if not inputs:
        raise SparkJobError("no input files given")
    urls = [p.url if isinstance(p, JobPath) else resolve(p).url for p in inputs]
    reader = spark.read.format(AVRO_FORMAT if fmt == "avro" else "parquet")
    with spark_step(f"cannot read backlog {joined_names(urls)} as {fmt}"):  # a missing path, a damaged footer, ...
        df = reader.load(urls)
    missing = [c for c in ROW_COLUMNS if c not in df.columns]
    if missing:
        raise SparkJobError(f"backlog {joined_names(urls)} lacks columns {missing} (export-backlog writes {list(COLUMNS)})")
    return df
