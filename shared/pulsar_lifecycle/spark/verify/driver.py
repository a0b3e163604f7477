"""`spark verify`: check every snapshot of a writer's store, optionally against an export.

The driver reads the manifest once (it is replaced atomically, so this is a consistent view
even while a writer runs; nothing is written to the store) and checks what spans buckets:
duplicate ids, overlapping ledger ranges, snapshots outside the manifest. Executors check one
bucket each (executor.py, executor_checks.py). A snapshot that vanished meanwhile (merged or exhausted by a running
writer) is re-checked against a fresh manifest: gone from it too is fine, still listed is a
violation. With `against`, every exported message must be indexed exactly once, unless it was
cancelled or (running writer) already released or still in the journal; and an indexed message
that is not in the export is a violation for a store as the seeder left it (or one declared
frozen), a counted warning for a live writer's store (store_kind).
"""
from __future__ import annotations

import bisect
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...bucket.bitmap import LedgerBitmaps
from ...bucket.codec import (
    CorruptRecordError,
    JournalRecord,
    Manifest,
    ReleaseCursor,
    index_id_of,
    parse,
    parse_segment,
)
from ...bucket.config import BucketConfig
from ...bucket.manifest import sets_are_packed
from ...bucket.storage import BucketSnapshotStorage, lock_exclusively
from ..backlog import ROW_COLUMNS, ClassifyOptions, read_backlog
from ..errors import SparkJobError
from ..failures import spark_step
from ..paths import STORE_HINT, require_reachable, resolve_all, resolve_store
from ..progress import JobProgress
from ..store import open_store, store_dir
from .executor import check_partition, expected_partition, positions_partition
from .executor_checks import (
    DUPLICATE,
    MANIFEST,
    MISSING,
    MISSING_SNAPSHOT,
    NOT_IN_EXPORT,
    OVERLAP,
    Violation,
    overlapping,
)

log = logging.getLogger(__name__)

MAX_EXAMPLES = 20
# What verify --against knows about who wrote the store (store_kind): an indexed message that is
# not in the export is a violation for the first two, a counted warning for the last.
SEEDED = "seeded"  # as the seeder left it: no release watermark, no journal record, nothing sealed by a writer
FROZEN = "frozen"  # declared by the operator (--frozen): nothing was indexed after the export
LIVE = "live"  # a writer has used it (or holds it): it indexes messages published after the export


@dataclass
class VerifyReport:
    """The outcome of a verify run (summary text, JSON report and picture come from it)."""

    store: str
    buckets: int = 0
    items: int = 0
    segments: int = 0
    bytes: int = 0
    violations: Dict[str, int] = field(default_factory=dict)
    examples: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    bucket_details: List[Dict[str, Any]] = field(default_factory=list)
    against: Optional[Dict[str, Any]] = None
    committed: Optional[List[int]] = None
    seconds: float = 0.0
    items_per_s: float = 0.0

    @property
    def ok(self) -> bool:
        """No violation found."""
        return not any(self.violations.values())

    def violate(self, kind: str, bucket_id: int, detail: str, count: int = 1) -> None:
        """Count `count` violations of `kind`, keeping the first examples."""
        self.violations[kind] = self.violations.get(kind, 0) + count
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(asdict(Violation(kind, bucket_id, detail)))

    def to_json(self) -> str:
        """The JSON report."""
        return json.dumps(dict(asdict(self), ok=self.ok), indent=2)

    def summary(self) -> str:
        """The text summary: totals, violations per kind, first examples, warnings."""
        lines = [f"store {self.store}: {self.buckets} buckets, {self.segments} segments, {self.items:,} indexes, "
                 f"{self.bytes:,} bytes; checked in {self.seconds:.1f} s ({self.items_per_s:,.0f} indexes/s)"]
        if self.committed:
            lines.append(f"release watermark: ts {self.committed[0]} ledger {self.committed[1]} entry {self.committed[2]}")
        if self.against is not None:
            a = self.against
            lines.append(f"against export: {a['expected']:,} messages; found once {a['found']:,}, missing {a['missing']:,}, "
                         f"cancelled {a['cancelled']:,}, released {a['released']:,}, in journal {a['journal']:,}, "
                         f"indexed but not in the export {a['not_in_export']:,} ({a['store_kind']} store)")
        if self.ok:
            lines.append("OK: no violations")
        else:
            lines.append("VIOLATIONS: " + ", ".join(f"{k} {v}" for k, v in sorted(self.violations.items()) if v))
            for ex in self.examples[:10]:
                lines.append(f"  [{ex['kind']}] bucket {ex['bucket_id']}: {ex['detail']}")
        for w in self.warnings[:10]:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


def bind(fn: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """`fn` with leading arguments bound, as a plain function for mapInPandas (which wants a
    function, not a partial); Spark pickles `fn` by reference, `args` by value."""

    def run(batches: Any) -> Any:
        return fn(*args, batches)

    return run


def _seen_slices(man: Any) -> Tuple[List[int], Dict[int, bytes]]:
    ledgers = sorted(man.seen)
    return ledgers, dict(man.seen)


def _seen_for(ledgers: List[int], seen: Dict[int, bytes], start: int, end: int, format_version: int) -> bytes:
    """The seen-set of ledgers [start, end] as a Manifest with the store's format (its layout)."""
    part = Manifest(format_version=format_version)
    for ledger in ledgers[bisect.bisect_left(ledgers, start):bisect.bisect_right(ledgers, end)]:
        part.seen[ledger] = seen[ledger]
    return part.SerializeToString()


def _journal(storage: BucketSnapshotStorage, url: str, report: VerifyReport) -> Tuple[LedgerBitmaps, LedgerBitmaps, bool]:
    """(journal item positions, journal cancels, read?) - read only when no writer holds the store
    (reading a live directory journal could race with its appends)."""
    items, cancels = LedgerBitmaps(), LedgerBitmaps()
    path = store_dir(url)
    fh = None
    if path is not None:
        try:
            fh = lock_exclusively(path)
        except RuntimeError:
            report.warnings.append("a writer holds the store: its journal (the newest items) was not read")
            return items, cancels, False
    try:
        man = parse(Manifest, storage.get_manifest() or b"", "manifest")  # none yet: no journal cut
        for rid, raw in storage.journal_read():
            if rid <= man.journal_cut:
                continue
            rec = parse(JournalRecord, raw, f"journal record {rid}")
            if rec.add:
                for idx in parse_segment(raw).indexes:
                    items.add(idx.ledger_id, index_id_of(idx))
            for op in rec.cancel:
                cancels.add(op.ledger_id, op.entry_id)
    finally:
        if fh is not None:
            fh.close()
    return items, cancels, True


def run_verify(spark: Any, url: str, config: BucketConfig, *, against: Optional[Sequence[str]] = None,
               opts: Optional[ClassifyOptions] = None, fmt: str = "parquet", allow_overlap: bool = False,
               progress: JobProgress, frozen: bool = False, shared_fs: bool = False) -> VerifyReport:
    """Verify the store at `url` (read only); `against` = export files every message of which
    must be indexed exactly once. `frozen`: the operator declares that nothing was indexed after
    the export, so an indexed message outside it is a violation even in a writer's store.
    Paths are resolved here, on the driver (`shared_fs`: see paths.require_reachable)."""
    store = resolve_store(url)
    inputs = resolve_all(against or ())
    master = spark.sparkContext.master
    require_reachable(master, [("--store", store)], shared_fs, hint=STORE_HINT)
    require_reachable(master, [("--against", p) for p in inputs], shared_fs)
    url = store.url
    t0 = time.monotonic()
    report = VerifyReport(store=url)
    storage = open_store(url)
    try:
        progress.phase("manifest")
        raw = storage.get_manifest()
        if raw is None:
            raise SparkJobError(f"snapshot store {url} has no manifest: not a writer's (or a seeded) store")
        try:
            man = parse(Manifest, raw, "bucket manifest")
        except CorruptRecordError as exc:
            raise SparkJobError(f"snapshot store {url}: {exc}") from exc
        cur_raw = storage.get_cursor()
        watermark = None
        if cur_raw is not None:
            cur = parse(ReleaseCursor, cur_raw, "release cursor")
            if cur.has_watermark:
                watermark = (cur.ts, cur.ledger_id, cur.entry_id)
                report.committed = list(watermark)
        refs = list(man.buckets)
        _global_checks(report, man, refs, storage, allow_overlap)
        ledgers, seen = _seen_slices(man)
        rows = [(r.bucket_id, r.SerializeToString(), _seen_for(ledgers, seen, r.start_ledger_id, r.end_ledger_id,
                                                                 man.format_version))
                for r in refs]
        report.buckets = len(refs)
        if refs:
            progress.phase("check buckets")
            parts = max(1, min(len(refs), 4 * spark.sparkContext.defaultParallelism))
            bdf = spark.createDataFrame(rows, "bucket_id long, ref binary, seen binary").repartition(parts)
            with spark_step(f"cannot check the snapshots of {url}"):
                results = bdf.mapInPandas(bind(check_partition, url, config), "bucket_id long, result string").collect()
            by_id = {r.bucket_id: r for r in refs}
            for row in sorted(results, key=lambda r: r["bucket_id"]):
                _collect(report, json.loads(row["result"]), by_id[row["bucket_id"]], storage)
            progress.rows(report.items)
            if inputs:
                progress.phase("against export")
                with spark_step(f"cannot compare {url} with the export {', '.join(p.url for p in inputs)}"):
                    report.against = _against(spark, url, bdf, [p.url for p in inputs], fmt, opts, watermark, man,
                                              storage, report, frozen)
    finally:
        storage.close()
    report.seconds = round(time.monotonic() - t0, 3)
    report.items_per_s = round(report.items / report.seconds) if report.seconds else 0
    log.info("event=verify_done store=%s buckets=%d items=%d violations=%s seconds=%.1f", url, report.buckets,
             report.items, json.dumps(report.violations), report.seconds)
    return report


def _global_checks(report: VerifyReport, man: Any, refs: List[Any], storage: BucketSnapshotStorage,
                   allow_overlap: bool) -> None:
    ids = [r.bucket_id for r in refs]
    if len(set(ids)) != len(ids):
        report.violate(MANIFEST, 0, f"bucket ids listed twice: {sorted({i for i in ids if ids.count(i) > 1})}")
    if ids and man.max_bucket_id < max(ids):
        report.violate(MANIFEST, max(ids), f"max_bucket_id {man.max_bucket_id} below listed bucket {max(ids)}")
    for a, b in overlapping([(r.bucket_id, r.start_ledger_id, r.end_ledger_id) for r in refs]):
        if allow_overlap:
            report.warnings.append(f"buckets {a} and {b} cover overlapping ledger ranges")
        else:
            report.violate(OVERLAP, b, f"buckets {a} and {b} cover overlapping ledger ranges")
    listed = set(ids) | set(man.pending_delete)
    for bid in storage.list_snapshots(0):
        if bid in listed:
            continue
        if bid > man.max_bucket_id:
            report.warnings.append(f"snapshot {bid} is newer than the manifest (being written by a running writer?)")
        else:
            report.warnings.append(f"snapshot {bid} is in no manifest list (leaked, or awaiting two-phase deletion)")


def _collect(report: VerifyReport, res: Dict[str, Any], ref: Any, storage: BucketSnapshotStorage) -> None:
    bid = res["bucket_id"]
    if res["status"] == "gone":
        fresh = storage.get_manifest()
        still = fresh is not None and any(b.bucket_id == bid for b in Manifest.FromString(fresh).buckets)
        if still:
            report.violate(MISSING_SNAPSHOT, bid, "listed in the manifest but absent from the store")
        else:
            report.warnings.append(f"bucket {bid} was removed by the writer while verifying (merged or exhausted)")
        return
    report.items += res["items"]
    report.segments += len(res["segments"])
    report.bytes += res["length"]
    report.bucket_details.append({"bucket_id": bid, "key": ref.bucket_key, "start_ledger": ref.start_ledger_id,
                                  "end_ledger": ref.end_ledger_id, "items": res["items"], "segments": res["segments"]})
    for kind, n in res["counts"].items():
        report.violations[kind] = report.violations.get(kind, 0) + n
    for v in res["violations"]:
        if len(report.examples) < MAX_EXAMPLES:
            report.examples.append(v)


def store_kind(frozen: bool, watermark: Optional[Tuple[int, int, int]], man: Any, journal_read: bool,
               journal_records: int) -> str:
    """FROZEN when declared; SEEDED for a store as the seeder left it (no release watermark, no
    bucket sealed from a journal: journal_cut 0, and a journal that was read and holds nothing);
    LIVE otherwise (a writer released, sealed or journaled, or holds the store's lock)."""
    if frozen:
        return FROZEN
    if watermark is None and man.journal_cut == 0 and journal_read and journal_records == 0:
        return SEEDED
    return LIVE


def _against(spark: Any, url: str, bdf: Any, inputs: Sequence[str], fmt: str, opts: Optional[ClassifyOptions],
             watermark: Optional[Tuple[int, int, int]], man: Any, storage: BucketSnapshotStorage,
             report: VerifyReport, frozen: bool = False) -> Dict[str, Any]:
    from pyspark.sql import functions as F  # optional dependency: only this job needs it

    if opts is None:
        raise SparkJobError("verify --against needs the writer's intake settings")
    journal_items, journal_cancels, journal_read = _journal(storage, url, report)
    kind = store_kind(frozen, watermark, man, journal_read, len(journal_items) + len(journal_cancels))
    tomb = LedgerBitmaps.from_proto_map(man.tombstones, "manifest tombstones",
                                      packed=sets_are_packed(man)).union(journal_cancels)
    keys = ["ledger_id", "entry_id"]
    # One full outer join of what the store indexes (count per position) and what the export
    # says (item / cancel per position), then one aggregation for every count.
    actual = bdf.mapInPandas(bind(positions_partition, url), "ledger_id long, entry_id long, ts long, bucket_id long")
    held = actual.groupBy(*keys).agg(F.count("*").alias("n"), F.collect_set("bucket_id").alias("b"))
    src = read_backlog(spark, inputs, fmt).select(*ROW_COLUMNS)
    exp = src.mapInPandas(bind(expected_partition, opts), "ledger_id long, entry_id long, deliver_at long, kind string")
    want = exp.groupBy(*keys).agg(F.max((F.col("kind") == "item").cast("int")).alias("item"),
                                  F.max((F.col("kind") == "cancel").cast("int")).alias("cancel"),
                                  F.max("deliver_at").alias("deliver_at"))
    both = want.join(held, keys, "full_outer").persist()
    is_item, is_held = F.col("item") == 1, F.col("n").isNotNull()
    row = both.agg(
        F.sum(is_item.cast("long")).alias("expected"),
        F.sum((is_item & is_held).cast("long")).alias("found"),
        F.sum((is_held & F.coalesce(F.col("item"), F.lit(0)).eqNullSafe(0)).cast("long")).alias("not_in_export"),
        F.sum((F.col("n") > 1).cast("long")).alias("dups"),
        F.sum((is_item & ~is_held & (F.col("cancel") == 1)).cast("long")).alias("cancelled"),
    ).collect()[0]
    expected, found = int(row["expected"] or 0), int(row["found"] or 0)
    not_in_export, ndup = int(row["not_in_export"] or 0), int(row["dups"] or 0)
    for r in both.where("n > 1").limit(5).collect():
        report.violate(DUPLICATE, int(r["b"][0]), f"position {r['ledger_id']}:{r['entry_id']} indexed {r['n']} times "
                                                  f"(buckets {sorted(r['b'])})", count=0)
    if ndup:
        report.violations[DUPLICATE] = report.violations.get(DUPLICATE, 0) + ndup
    absent = both.where(is_item & ~is_held & (F.col("cancel") == 0))
    counts = {"cancelled": int(row["cancelled"] or 0), "released": 0, "journal": 0, "missing": 0}
    examples: List[str] = []
    for r in absent.toLocalIterator():
        ledger, entry, at = int(r["ledger_id"]), int(r["entry_id"]), int(r["deliver_at"])
        if tomb.contains(ledger, entry):
            counts["cancelled"] += 1
        elif journal_items.contains(ledger, entry):
            counts["journal"] += 1
        elif watermark is not None and at <= watermark[0]:
            counts["released"] += 1
        else:
            counts["missing"] += 1
            if len(examples) < 5:
                examples.append(f"{ledger}:{entry} (deliver at {at})")
    if counts["missing"]:
        report.violate(MISSING, 0, f"{counts['missing']} exported messages are in no snapshot, e.g. {', '.join(examples)}",
                       count=counts["missing"])
    if not_in_export:
        extra = both.where(is_held & F.coalesce(F.col("item"), F.lit(0)).eqNullSafe(0)).limit(5).collect()
        named = ", ".join(f"{r['ledger_id']}:{r['entry_id']} (bucket {sorted(r['b'])[0]})" for r in extra)
        if kind == LIVE:
            report.warnings.append(f"{not_in_export} indexed messages are not in the export, e.g. {named}: a live "
                                   "writer's store also holds messages published after the export (--frozen makes "
                                   "this a violation)")
        else:
            first_bucket = int(sorted(extra[0]["b"])[0]) if extra else 0
            report.violate(NOT_IN_EXPORT, first_bucket,
                           f"{not_in_export} indexed messages are not in the export, e.g. {named}: the store is "
                           f"{kind}, so each is corruption or the export is not the store's backlog",
                           count=not_in_export)
    both.unpersist()
    return {"expected": expected, "found": found, "not_in_export": not_in_export, "duplicates": ndup,
            "store_kind": kind, **counts}


def write_outputs(report: VerifyReport, out_dir: Path) -> Dict[str, Path]:
    """summary.txt, report.json and buckets.png under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out_dir / "summary.txt", "report": out_dir / "report.json", "picture": out_dir / "buckets.png"}
    paths["summary"].write_text(report.summary() + "\n")
    paths["report"].write_text(report.to_json())
    draw_buckets(report, paths["picture"])
    return paths


def draw_buckets(report: VerifyReport, path: Path) -> None:
    """A picture of the buckets over time: one row per bucket, one bar per segment from its min
    to its max release time, thicker for more indexes; buckets with violations in red."""
    import matplotlib  # optional dependency (spark extra); headless backend

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    bad = {ex["bucket_id"] for ex in report.examples}
    details = report.bucket_details
    fig_h = min(2 + 0.25 * max(1, len(details)), 40)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    biggest = max((c for d in details for _, _, c in d["segments"]), default=1)
    for y, d in enumerate(details):
        color = "tab:red" if d["bucket_id"] in bad else "tab:blue"
        for lo, hi, count in d["segments"]:
            x0 = mdates.date2num(_dt(lo))
            width = max(mdates.date2num(_dt(hi)) - x0, 1e-6)
            ax.broken_barh([(x0, width)], (y - 0.4 * count / biggest, 0.8 * count / biggest), color=color, alpha=0.7)
    ax.set_yticks(range(len(details)))
    ax.set_yticklabels([f"{d['bucket_id']} [{d['start_ledger']}..{d['end_ledger']}] {d['items']:,}" for d in details],
                       fontsize=7)
    ax.xaxis_date()
    ax.set_xlabel("release time (UTC); bar height = indexes per segment")
    ax.set_title(f"{report.buckets} buckets, {report.segments} segments, {report.items:,} indexes - "
                 f"{'OK' if report.ok else 'VIOLATIONS'}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _dt(ms: int) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
