"""`export-backlog`: drain a stopped writer's scheduling subscription into Parquet files.

Each batch of received messages becomes one Parquet file, written whole to a temporary name,
fsynced, renamed into place and the directory fsynced (state/directory.atomic_write); only then
are the batch's messages acked. A crash before the rename loses nothing (nothing was acked; the
temporary file is ignored by readers and removed at the next start). A crash after the rename
but before the acks redelivers messages that are already in a file: at start the exporter reads
the positions of every file in the output directory and acks such messages without writing
them again, so the export never holds a message twice and a seed never indexes one twice.
Messages are exported as received (cancel requests and malformed ones too): the seeder applies
the writer's own checks.
"""
from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import pulsar
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from ...pulsar_io.readers import Entry
from ...pulsar_io.subscribe import random_skip, skip_consumer_ids, subscribe_promptly
from ...state.directory import atomic_write
from ..backlog import EXPORT_SCHEMA, external_rows, protocol_columns
from ..errors import SparkJobError
from .held import raise_floor, read_held_all

log = logging.getLogger(__name__)

PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
_BATCH_BITS = 16  # position key in a per-ledger 64-bit bitmap: entry << 16 | (batch index + 1)


class ExportedPositions:
    """The positions already in the export's files: per ledger, a 64-bit RoaringBitmap of
    entry << 16 | (batch index + 1) (a few bytes per message). `floors`: per topic (full name),
    the furthest (ledger, entry) the files held when they were loaded (held.py)."""

    def __init__(self) -> None:
        self._maps: Dict[int, BitMap64] = {}
        self.floors: Dict[str, Entry] = {}

    @staticmethod
    def _key(entry_id: int, batch_index: int) -> int:
        return (entry_id << _BATCH_BITS) | (batch_index + 1)

    def add(self, ledger_id: int, entry_id: int, batch_index: int) -> bool:
        """Add; False when already present."""
        bm = self._maps.setdefault(ledger_id, BitMap64())
        key = self._key(entry_id, batch_index)
        if key in bm:
            return False
        bm.add(key)
        return True

    def __contains__(self, pos: tuple) -> bool:
        bm = self._maps.get(pos[0])
        return bm is not None and self._key(pos[1], pos[2]) in bm

    def __len__(self) -> int:
        return sum(len(b) for b in self._maps.values())


@dataclass
class ExportReport:
    """What an export run did."""

    out_dir: str
    files_before: int = 0
    files_written: int = 0
    rows_written: int = 0
    redelivered_skipped: int = 0
    held_exported: int = 0  # read with a Reader from a killed exporter's consumer, not acked (held.py)
    seconds: float = 0.0
    files: List[str] = field(default_factory=list)


def part_files(out_dir: Path) -> List[Path]:
    """The export's completed files, in name order."""
    return sorted(p for p in out_dir.glob(f"{PART_PREFIX}*{PART_SUFFIX}") if p.is_file())


def load_positions(out_dir: Path) -> ExportedPositions:
    """Positions of every completed file, and each topic's floor (a damaged file is an error
    naming it: never guess)."""
    seen = ExportedPositions()
    for path in part_files(out_dir):
        try:
            table = pq.read_table(path, columns=["topic", "ledger_id", "entry_id", "batch_index"])
        except Exception as exc:  # pyarrow raises several types for damaged files
            raise SparkJobError(f"export file {path} cannot be read ({exc}); move it away and re-run") from exc
        for topic, ledger, entry, batch in zip(*(table.column(i).to_pylist() for i in range(4))):
            seen.add(ledger, entry, batch)
            raise_floor(seen.floors, topic, (ledger, entry))
    return seen


def message_row(msg: "pulsar.Message", topic: str) -> Dict[str, Any]:
    """One export row of a received message."""
    mid = msg.message_id()
    props = msg.properties()
    deliver_at, target = protocol_columns(props)
    return {
        "ledger_id": mid.ledger_id(), "entry_id": mid.entry_id(), "batch_index": mid.batch_index(),
        "partition": mid.partition(), "deliver_at": deliver_at, "payload": msg.data(),
        "key": msg.partition_key() or None, "properties": list(props.items()),
        "event_time": msg.event_timestamp() or 0, "target": target,
        "publish_time": msg.publish_timestamp(), "topic": msg.topic_name() or topic,
    }


def write_part(out_dir: Path, rows: Sequence[Dict[str, Any]], seq: int) -> Path:
    """Write rows durably as the next part file (temporary name, fsync, rename, fsync dir)."""
    table = pa.Table.from_pylist(list(rows), schema=EXPORT_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    path = out_dir / f"{PART_PREFIX}{seq:06d}-{uuid.uuid4().hex[:8]}{PART_SUFFIX}"
    try:
        atomic_write(path, sink.getvalue().to_pybytes())
    except OSError as exc:
        raise SparkJobError(f"cannot write export file {path}: {exc} (nothing of this batch was acked)") from exc
    return path


def _clean_temporaries(out_dir: Path) -> None:
    for tmp in out_dir.glob(f".{PART_PREFIX}*.tmp"):
        log.warning("event=export_drop_temporary file=%s", tmp)
        tmp.unlink(missing_ok=True)


class ExportDir:
    """An export directory being appended to: what it already holds, and the next part file."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _clean_temporaries(out_dir)
        self.out_dir = out_dir
        self.report = ExportReport(out_dir=str(out_dir), files_before=len(part_files(out_dir)))
        self.seen = load_positions(out_dir)
        self._seq = self.report.files_before + 1

    def write(self, rows: Sequence[Dict[str, Any]]) -> Optional[Path]:
        """Write rows durably as the next part file (nothing for no rows)."""
        if not rows:
            return None
        path = write_part(self.out_dir, rows, self._seq)
        self._seq += 1
        self.report.files.append(path.name)
        self.report.files_written += 1
        self.report.rows_written += len(rows)
        return path


def _drain_pass(client: "pulsar.Client", topics: Sequence[str], subscription: str, export: ExportDir,
                batch_rows: int, idle_ms: int, limit: Optional[int],
                on_batch: Optional[Callable[[int], None]]) -> int:
    """One consumer's pass: receive batches until nothing arrives for idle_ms (or `limit`
    messages); each batch is written durably, then acked. Returns the messages received."""
    report, seen = export.report, export.seen
    # One topic: a plain consumer (a multi-topic consumer only when partitions are named).
    # A killed exporter's consumer may still be registered under the id this client picks first
    # (pulsar-lite): skip a random number of ids, and start another attempt beside one that hangs.
    skip_consumer_ids(client, random_skip(), "non-persistent://public/default/pulsar-lifecycle-consumer-ids")
    consumer = subscribe_promptly(lambda: client.subscribe(
        topics[0] if len(topics) == 1 else list(topics), subscription, consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=min(max(1000, batch_rows), 50_000)),
        f"export {subscription}")
    total = 0
    try:
        while limit is None or total < limit:
            msgs: List[pulsar.Message] = []
            want = batch_rows if limit is None else min(batch_rows, limit - total)
            deadline = time.monotonic() + 1.0  # a batch waits at most 1 s to fill
            while len(msgs) < want:
                wait = idle_ms if not msgs else max(1, int((deadline - time.monotonic()) * 1000))
                try:
                    msgs.append(consumer.receive(timeout_millis=wait))
                except pulsar.Timeout:
                    break
            if not msgs:
                break
            rows, skipped = [], 0
            for m in msgs:
                mid = m.message_id()
                if (mid.ledger_id(), mid.entry_id(), mid.batch_index()) in seen:
                    skipped += 1  # in a file already: redelivered after a crash before its ack
                    continue
                seen.add(mid.ledger_id(), mid.entry_id(), mid.batch_index())
                rows.append(message_row(m, topics[0]))
            path = export.write(rows)
            if path is not None:
                log.info("event=export_batch_durable file=%s rows=%d skipped=%d", path.name, len(rows), skipped)
            for m in msgs:  # only now: every message of the batch is in a durable file
                consumer.acknowledge(m)
            report.redelivered_skipped += skipped
            total += len(msgs)
            if on_batch is not None:
                on_batch(len(rows))
    finally:
        consumer.close()
    return total


def export_backlog(client: "pulsar.Client", topics: Sequence[str], subscription: str, out_dir: Path, *,
                   batch_rows: int = 50_000, idle_ms: int = 3000, max_messages: Optional[int] = None,
                   on_batch: Optional[Callable[[int], None]] = None) -> ExportReport:
    """Drain `subscription` on `topics` into `out_dir` until nothing arrives for `idle_ms`.

    The writer must be stopped (it would consume the same subscription). Returns the report;
    `on_batch(rows)` is called after each durable batch (progress).
    """
    if batch_rows < 1 or idle_ms < 1:
        raise SparkJobError("batch_rows and idle_ms must be positive")
    t0 = time.monotonic()
    export = ExportDir(out_dir)
    report, seen = export.report, export.seen
    log.info("event=export_started topics=%s subscription=%s out=%s already_exported=%d",
             ",".join(topics), subscription, out_dir, len(seen))
    # One consumer, until nothing arrives for idle_ms. Messages a killed exporter had received
    # but not acked go back to the subscription when the broker drops its consumer, and both
    # pulsar-lite and Apache Pulsar hand them to a consumer that is already connected
    # (tests/integration/test_broker_quirks.py): a consumer idle for idle_ms has received everything.
    total = _drain_pass(client, topics, subscription, export, batch_rows, idle_ms, max_messages, on_batch)
    if seen.floors and (max_messages is None or total < max_messages):
        # Resumed after a crash: what the killed exporter's consumer still holds (held.py).
        def is_new(msg: "pulsar.Message") -> bool:
            mid = msg.message_id()
            return seen.add(mid.ledger_id(), mid.entry_id(), mid.batch_index())

        def export_rows(msgs: List["pulsar.Message"]) -> None:
            path = export.write([message_row(m, topics[0]) for m in msgs])
            log.info("event=export_batch_durable file=%s rows=%d held=true", path.name if path else None, len(msgs))
            if on_batch is not None:
                on_batch(len(msgs))

        report.held_exported = read_held_all(client, topics, seen.floors, is_new, export_rows, batch_rows)
    report.seconds = round(time.monotonic() - t0, 3)
    log.info("event=export_done out=%s files=%d rows=%d skipped=%d held=%d seconds=%.1f", out_dir,
             report.files_written, report.rows_written, report.redelivered_skipped, report.held_exported, report.seconds)
    return report


def _job(line: str, where: str) -> Dict[str, Any]:
    try:
        job = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SparkJobError(f"{where}: not a JSON object: {exc}") from exc
    if not isinstance(job, dict):
        raise SparkJobError(f"{where}: not a JSON object")
    if "payload_b64" in job:
        try:
            job["payload"] = base64.b64decode(job.pop("payload_b64"), validate=True)
        except ValueError as exc:
            raise SparkJobError(f"{where}: payload_b64 is not base64: {exc}") from exc
    if not isinstance(job.get("deliver_at"), int) or isinstance(job.get("deliver_at"), bool) or job["deliver_at"] < 0:
        raise SparkJobError(f"{where}: deliver_at must be a non-negative integer (ms since epoch), got {job.get('deliver_at')!r}")
    if not isinstance(job.get("payload"), (str, bytes)):
        raise SparkJobError(f"{where}: needs payload (a string) or payload_b64")
    return job


def import_jobs(jobs_file: Path, dataset_id: int, out_dir: Path, *, topic: str = "external",
                batch_rows: int = 50_000) -> ExportReport:
    """Turn an external dataset of scheduled jobs (JSON lines: deliver_at, payload or payload_b64,
    optional key, target, properties, event_time) into export files with positions from the
    reserved range (backlog.external_position: row n of dataset d has a fixed position, so a
    re-run after a crash skips what is already exported)."""
    t0 = time.monotonic()
    export = ExportDir(out_dir)
    report = export.report

    def flush(batch: List[Dict[str, Any]], first_row: int) -> None:
        rows = [r for r in external_rows(batch, dataset_id, topic, first_row)
                if export.seen.add(r["ledger_id"], r["entry_id"], r["batch_index"])]
        report.redelivered_skipped += len(batch) - len(rows)
        export.write(rows)

    try:
        fh = open(jobs_file, encoding="utf-8")
    except OSError as exc:
        raise SparkJobError(f"cannot read jobs file {jobs_file}: {exc}") from exc
    with fh:
        batch: List[Dict[str, Any]] = []
        first = 0
        n = 0
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                raise SparkJobError(f"{jobs_file}:{n}: empty line (every line is one job; positions follow line numbers)")
            batch.append(_job(line, f"{jobs_file}:{n}"))
            if len(batch) >= batch_rows:
                flush(batch, first)
                first += len(batch)
                batch = []
        if batch:
            flush(batch, first)
    report.seconds = round(time.monotonic() - t0, 3)
    return report
