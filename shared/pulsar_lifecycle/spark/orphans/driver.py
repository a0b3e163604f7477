"""One orphan scan, start to finish (the wiring behind `pulsar-lifecycle spark orphans`).

Order (BookKeeper's garbage collector and Iceberg's orphan-file action):
  1. list storage (every listing complete, or the scan stops with nothing reported);
  2. only then read the metadata (in-use sets), also complete or stop;
  3. Spark classifies every listed ledger (model.py's statuses) and writes the orphans as
     this scan's candidates; the scan is committed durably (state.py);
  4. the orphans a committed scan at least `confirm_after` older also reported are "confirmed";
  5. with `enqueue`, confirmed orphans go to phase one of two-phase deletion; nothing is deleted here.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from pyspark.sql import SparkSession  # this module runs only under Spark

from ...clock import Clock, wall_clock_ms
from ..errors import SparkJobError
from ..paths import file_url
from .driver_frames import (
    CANDIDATE_COLUMNS,
    AuditRules,
    check_ids,
    classify,
    collect_sample,
    confirmed,
    count_statuses,
    read_in_use_file,
    read_listing_file,
    rows_to_in_use,
    rows_to_listing,
    union_all,
    write_candidates,
)
from .driver_listing import list_bookies
from .enqueue import EnqueueResult, enqueue_orphans
from .model import STATUS_ORPHAN, Coverage, InUseSet, ListedLedger, ListingError
from .sources import BookieListing
from .state import ScanRecord, ScanStateDir, new_scan_id, record_dict

log = logging.getLogger(__name__)


class ListingSource(Protocol):
    """Something that lists storage completely or raises ListingError."""

    def list(self) -> Any:
        """Iterate ListedLedger."""


class InUseSource(Protocol):
    """Something that collects an in-use set completely or raises ListingError."""

    def collect(self) -> InUseSet:
        """The set."""


class Progress(Protocol):
    """The part of spark.progress.JobProgress the audit uses."""

    def phase(self, name: str) -> None: ...

    def rows(self, n: int) -> None: ...


class _NoProgress:
    def phase(self, name: str) -> None:
        pass

    def rows(self, n: int) -> None:
        pass


@dataclass
class AuditConfig:
    """One scan's inputs and rules.

    Args:
        listings: storage listings run on the driver (bookie, S3, filesystem, snapshot store).
        listing_files: exported listings read by Spark.
        in_use: in-use sources run on the driver (admin, bucket manifest).
        in_use_files: exported in-use lists read by Spark, vouching for `in_use_file_coverage`.
        older_than_ms: minimum age of an orphan (default 24 h).
        confirm_after_ms: how much older the confirming scan must be.
        sample: orphans listed in the report (all are in the scan's candidate files).
    """

    listings: Sequence[ListingSource] = ()
    listing_files: Sequence[str] = ()
    in_use: Sequence[InUseSource] = ()
    in_use_files: Sequence[str] = ()
    in_use_file_coverage: Sequence[Coverage] = ()
    older_than_ms: int = 24 * 3600 * 1000
    confirm_after_ms: int = 3600 * 1000
    sample: int = 1000
    clock_ms: Clock = field(default=wall_clock_ms)


@dataclass
class AuditReport:
    """What a scan found; `as_dict()` is the JSON report."""

    scan_id: str
    started_ms: int
    counts: Dict[str, int]
    orphans: int
    sample: List[Dict[str, Any]]
    confirming_scan: Optional[Dict[str, Any]]
    confirmed: int
    confirmed_rows: List[Dict[str, Any]]
    rules: Dict[str, int]
    enqueue: Optional[EnqueueResult] = None
    timings: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        """JSON-friendly form."""
        out: Dict[str, Any] = {
            "scanId": self.scan_id, "startedMs": self.started_ms, "rules": self.rules, "counts": self.counts,
            "orphans": self.orphans, "orphanSample": self.sample, "confirmingScan": self.confirming_scan,
            "confirmed": self.confirmed, "confirmedOrphans": self.confirmed_rows, "timings": self.timings,
        }
        if self.enqueue is not None:
            out["enqueue"] = {"sent": self.enqueue.sent, "skipped": self.enqueue.skipped,
                              "failed": self.enqueue.failed}
        return out


def run_audit(spark: SparkSession, config: AuditConfig, state: ScanStateDir,
              append: Optional[Callable[[Any], Any]] = None, progress: Optional[Progress] = None) -> AuditReport:
    """Run one scan; `append` (LedgerDeletionService.append) given = enqueue confirmed orphans.

    Raises ListingError (a listing or in-use source failed: nothing reported, nothing committed),
    SparkJobError (bad exported input) or ScanStateError (state directory)."""
    prog = progress or _NoProgress()
    started = config.clock_ms()
    scan_id = new_scan_id(started)

    # 1. storage first: a ledger created after this point cannot be listed, so the metadata
    #    read afterwards knows every listed ledger that was in use when it was listed.
    prog.phase("list storage")
    listed: List[tuple] = []
    listed_frames: List[Any] = []
    n_listed = 0
    work_dir = state.scans / f".{scan_id}.listings.tmp"  # where the executors write the bookie listings
    try:
        for i, src in enumerate(config.listings):
            if isinstance(src, BookieListing):  # pages fetched by the executors (driver_listing.py, executor.py)
                df, n = list_bookies(spark, src, work_dir / str(i))
                listed_frames.append(df)
                n_listed += n
                continue
            for item in src.list():
                assert isinstance(item, ListedLedger)
                listed.append(item.row())
        n_listed += len(listed)
        listing = rows_to_listing(spark, listed)
        frames = [read_listing_file(spark, p) for p in config.listing_files]
        for p, df in zip(config.listing_files, frames):
            n_listed += check_ids(df, f"listing {p}")
        prog.rows(n_listed)
        listing = union_all(frames + listed_frames, listing)
        return _scan(spark, config, state, scan_id, started, listing, n_listed, append, prog)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _scan(spark: SparkSession, config: AuditConfig, state: ScanStateDir, scan_id: str, started: int, listing: Any,
          n_listed: int, append: Optional[Callable[[Any], Any]], prog: Progress) -> AuditReport:
    """run_audit after the storage listings: metadata, classification, state, enqueue."""
    # 2. then the metadata.
    prog.phase("read metadata")
    sets = [src.collect() for src in config.in_use]
    in_use_rows = [r for s in sets for r in s.rows()]
    in_use = rows_to_in_use(spark, in_use_rows)
    in_use_frames = [read_in_use_file(spark, p) for p in config.in_use_files]
    for p, df in zip(config.in_use_files, in_use_frames):
        prog.rows(check_ids(df, f"in-use list {p}"))
    in_use = union_all(in_use_frames, in_use)
    coverage = [c for s in sets for c in s.coverage] + (list(config.in_use_file_coverage) if config.in_use_files else [])
    max_known: Dict[str, int] = {}
    for s in sets:
        for space, newest in s.newest().items():
            max_known[space] = max(max_known.get(space, -1), newest)

    # 3. classify on the executors, write candidates, commit.
    prog.phase("classify")
    rules = AuditRules(now_ms=started, older_than_ms=config.older_than_ms)
    # Only the ledgers not in use are kept (cached) for the counts and the candidates.
    classified = classify(listing, in_use, coverage, max_known, rules).persist()
    committed = False
    try:
        counts = count_statuses(classified, n_listed)
        orphans_df = classified.filter(classified.status == STATUS_ORPHAN)
        prog.phase("write scan state")
        staging = file_url(state.staging_path(scan_id))  # the driver's directory, whatever the executors' is
        write_candidates(orphans_df, staging)
        written = spark.read.parquet(staging).count()
        if written != counts[STATUS_ORPHAN]:
            state.discard(scan_id)
            raise SparkJobError(f"scan {scan_id}: wrote {written} candidate rows, expected {counts[STATUS_ORPHAN]}")
        files = state.seal_candidates(scan_id)
        sources = [type(s).__name__ for s in config.listings] + [f"file:{p}" for p in config.listing_files] + \
            [s.source for s in sets] + [f"in-use-file:{p}" for p in config.in_use_files]
        record = ScanRecord(scan_id, started, config.clock_ms(), counts[STATUS_ORPHAN], counts, files, sources)
        current = spark.read.parquet(file_url(state.candidates_path(scan_id)))
        sample = collect_sample(current, config.sample)
        # 4. confirmation against an older committed scan (looked up before committing this one).
        prog.phase("confirm")
        prev = state.confirming_scan(started, config.confirm_after_ms, exclude=scan_id)
        state.commit(record)
        committed = True
        conf_rows: List[Dict[str, Any]] = []
        n_conf = 0
        if prev is not None and counts[STATUS_ORPHAN]:
            previous = spark.read.parquet(file_url(state.candidates_path(prev.scan_id)))
            conf = confirmed(current, previous).select(*CANDIDATE_COLUMNS)
            conf_rows = [r.asDict() for r in conf.orderBy("id_space", "ledger_id", "store").collect()] \
                if append is not None else collect_sample(conf, config.sample)
            n_conf = len(conf_rows) if append is not None else conf.count()
    except BaseException:
        if not committed:
            state.discard(scan_id)  # an uncommitted scan must leave nothing that looks like one
        raise
    finally:
        classified.unpersist()

    report = AuditReport(scan_id, started, counts, counts[STATUS_ORPHAN], sample, record_dict(prev), n_conf, conf_rows,
                         {"olderThanMs": config.older_than_ms, "confirmAfterMs": config.confirm_after_ms,
                          "nowMs": started})
    # 5. phase one only.
    if append is not None:
        prog.phase("enqueue")
        report.enqueue = enqueue_orphans(conf_rows, append)
    log.info("event=orphan_scan_done scan=%s listed=%d orphans=%d confirmed=%d", scan_id, sum(counts.values()),
             counts[STATUS_ORPHAN], n_conf)
    return report


__all__ = ["AuditConfig", "AuditReport", "ListingError", "run_audit"]
