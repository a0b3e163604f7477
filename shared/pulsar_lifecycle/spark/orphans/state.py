"""Durable orphan-scan results: the memory behind "two scans at least `confirm_after` apart".

Layout under the scan-state directory (a local path, or on a cluster a mount every executor
and the driver see at the same path):
    scans/<scan id>.parquet/    the scan's orphan candidates, written by Spark's executors
    scans/<scan id>.json        the commit record: times, counts, and each Parquet file's size

A scan counts only once its record exists and every file it names has the recorded size. The
record is written last, with checked writes (durable.atomic_write: every os.write looped and
checked, the file fsynced, renamed into place, the directory fsynced), then read back and
compared. Spark's files are fsynced and their row count read back before the record is written.
So a crash or a full disk leaves no record, and a scan without a record confirms nothing.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...durable import atomic_write, fsync_dir, fsync_fd
from ..errors import ScanStateError

log = logging.getLogger(__name__)

RECORD_VERSION = 1
_RECORD_NAME = re.compile(r"^(?P<id>\d{13}-[0-9a-f]{8})\.json$")


@dataclass
class ScanRecord:
    """What one committed scan found (the commit record)."""

    scan_id: str
    started_ms: int  # before the first listing call
    finished_ms: int
    orphans: int
    counts: Dict[str, int] = field(default_factory=dict)  # status -> listed ledgers
    files: Dict[str, int] = field(default_factory=dict)  # Parquet file name -> size in bytes
    sources: List[str] = field(default_factory=list)
    version: int = RECORD_VERSION

    def to_json(self) -> bytes:
        """The record as UTF-8 JSON."""
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "ScanRecord":
        """Parse; ScanStateError naming `where` when the record is not ours or damaged."""
        try:
            raw = json.loads(data)
            rec = cls(**raw)
        except (ValueError, TypeError) as exc:
            raise ScanStateError(f"scan record {where} is damaged: {exc}") from exc
        if rec.version != RECORD_VERSION:
            raise ScanStateError(f"scan record {where} has version {rec.version}, this tool reads {RECORD_VERSION}")
        return rec


def new_scan_id(started_ms: int) -> str:
    """`<13-digit ms>-<8 hex>`: sorts by start time, unique across concurrent runs."""
    return f"{started_ms:013d}-{os.urandom(4).hex()}"


def checked_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` durably (durable.atomic_write: looped writes, fsync, rename,
    directory fsync) and read it back: a record that does not read back as written is an error."""
    atomic_write(path, data)
    if path.read_bytes() != data:
        raise OSError(f"{path}: read-back differs from what was written")


class ScanStateDir:
    """The scan-state directory: commit scans, find the one that can confirm a new scan."""

    def __init__(self, root: os.PathLike | str, keep: int = 50) -> None:
        self.root = Path(root)
        self.scans = self.root / "scans"
        self.keep = keep
        try:
            self.scans.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ScanStateError(f"cannot create scan-state directory {self.scans}: {exc}") from exc

    def candidates_path(self, scan_id: str) -> Path:
        """Where Spark writes the scan's orphan candidates."""
        return self.scans / f"{scan_id}.parquet"

    def staging_path(self, scan_id: str) -> Path:
        """Where Spark writes first (renamed into place once verified)."""
        return self.scans / f".{scan_id}.parquet.tmp"

    def seal_candidates(self, scan_id: str) -> Dict[str, int]:
        """fsync every file Spark wrote, rename the staging directory into place; returns
        {file name: size}. The caller has already checked the row count."""
        staging, final = self.staging_path(scan_id), self.candidates_path(scan_id)
        files: Dict[str, int] = {}
        try:
            for entry in sorted(staging.iterdir()):
                if entry.is_file() and not entry.name.startswith("."):
                    fd = os.open(entry, os.O_RDONLY)
                    try:
                        fsync_fd(fd, entry)
                    finally:
                        os.close(fd)
                    files[entry.name] = entry.stat().st_size
            fsync_dir(staging)
            os.replace(staging, final)
            fsync_dir(self.scans)
        except OSError as exc:
            raise ScanStateError(f"cannot make scan {scan_id}'s candidates durable: {exc}") from exc
        if "_SUCCESS" not in files:
            raise ScanStateError(f"scan {scan_id}: Spark did not commit its output (no _SUCCESS in {staging})")
        return files

    def commit(self, record: ScanRecord) -> Path:
        """Write the commit record (checked); after this the scan can confirm later scans."""
        path = self.scans / f"{record.scan_id}.json"
        try:
            checked_write(path, record.to_json())
        except OSError as exc:
            raise ScanStateError(f"cannot commit scan record {path}: {exc}") from exc
        log.info("event=orphan_scan_committed scan=%s orphans=%d", record.scan_id, record.orphans)
        self._prune()
        return path

    def records(self) -> List[ScanRecord]:
        """Every committed scan, oldest first; a damaged record is a ScanStateError (the operator
        must look: a silent skip could hide a lost disk)."""
        out: List[ScanRecord] = []
        for entry in sorted(self.scans.iterdir()):
            if not _RECORD_NAME.match(entry.name):
                continue
            out.append(ScanRecord.from_json(entry.read_bytes(), str(entry)))
        return out

    def verify_files(self, rec: ScanRecord) -> None:
        """Every Parquet file of `rec` exists with its recorded size."""
        base = self.candidates_path(rec.scan_id)
        for name, size in rec.files.items():
            try:
                actual = (base / name).stat().st_size
            except OSError as exc:
                raise ScanStateError(f"scan {rec.scan_id}: candidate file {base / name} is gone: {exc}") from exc
            if actual != size:
                raise ScanStateError(f"scan {rec.scan_id}: candidate file {base / name} has {actual} bytes, "
                                     f"the record says {size}")

    def confirming_scan(self, started_ms: int, confirm_after_ms: int, exclude: str = "") -> Optional[ScanRecord]:
        """The newest committed scan that started at least `confirm_after_ms` before `started_ms`;
        ScanStateError when its files are missing or not the size recorded."""
        best: Optional[ScanRecord] = None
        for rec in self.records():
            if rec.scan_id != exclude and rec.started_ms <= started_ms - confirm_after_ms:
                best = rec
        if best is not None:
            self.verify_files(best)
        return best

    def discard(self, scan_id: str) -> None:
        """Remove an uncommitted scan's files (a failed run)."""
        for path in (self.staging_path(scan_id), self.candidates_path(scan_id)):
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self) -> None:
        recs = sorted(e.name for e in self.scans.iterdir() if _RECORD_NAME.match(e.name))
        for name in recs[:-self.keep] if self.keep > 0 else []:
            scan_id = name[:-len(".json")]
            try:
                (self.scans / name).unlink()
            except OSError as exc:
                log.warning("event=orphan_scan_prune_failed scan=%s error=%s", scan_id, exc)
                continue
            shutil.rmtree(self.candidates_path(scan_id), ignore_errors=True)


def record_dict(rec: Optional[ScanRecord]) -> Optional[Dict[str, Any]]:
    """A record as a plain dict (for the JSON report)."""
    return None if rec is None else {"scan_id": rec.scan_id, "started_ms": rec.started_ms, "orphans": rec.orphans}
