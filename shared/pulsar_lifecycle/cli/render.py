"""Human (rich tables) and script (JSON-ready dict) forms of the inspect reports."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List, Optional

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..delaylevel.rule import DEFAULT_DELAY_LEVEL_TOPIC
from .args import format_ms
from .deletion_view import DeletionReport
from .syncer_view import SyncerReport
from .writer_view import WriterReport, report_dict

__all__ = ["deletion_dict", "deletion_view", "relative", "syncer_dict", "syncer_view", "writer_dict", "writer_view"]


def relative(epoch_ms: Optional[int], now_ms: int) -> str:
    """`epoch_ms` as an ISO time plus how far from now ("in 2h 5m", "12s ago")."""
    if epoch_ms is None:
        return "-"
    delta = (epoch_ms - now_ms) // 1000
    span = abs(delta)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if span >= size:
            parts.append(f"{span // size}{unit}")
            span %= size
    if not parts or len(parts) < 2:
        parts.append(f"{span}s")
    text = " ".join(parts[:2])
    return f"{format_ms(epoch_ms)} ({'in ' + text if delta >= 0 else text + ' ago'})"


def _mib(n: int) -> str:
    return f"{n} B" if n < 10_240 else f"{n / 1_048_576:.2f} MiB"


def writer_view(report: WriterReport, now_ms: int) -> Group:
    """Per index: a summary table and a table of its buckets."""
    parts: List[Any] = [Text(f"BucketSnapshotWriter {report.fqfn} → {report.output}: "
                             f"{report.pending} pending", style="bold")]
    for r in report.indexes:
        summary = Table(title=f"{r.label}  {r.store}", show_header=False, title_justify="left")
        summary.add_column("what", style="cyan")
        summary.add_column("value")
        if r.index is None:
            summary.add_row("problem", r.problem)
            parts.append(summary)
            continue
        idx = r.index
        summary.add_row("pending", f"{idx.pending} ({idx.cancelled} cancelled, skipped at release)")
        summary.add_row("next due", relative(idx.next_release_ms, now_ms))
        summary.add_row("oldest pending", str(idx.oldest_pending) if idx.oldest_pending else "-")
        summary.add_row("tombstones", f"{idx.cancelled} on pending messages, {idx.early_cancels} for messages "
                                      "not indexed yet")
        summary.add_row("released up to", f"seq {idx.committed_seq}, release time "
                                          f"{relative(idx.watermark_release_ms, now_ms)}")
        if r.dedup is not None:
            d = r.dedup
            dedup = (f"seq {d.highest_seq} at {d.position} ({d.producer})" if d.highest_seq is not None
                     else (d.problem or "no snapshot yet"))
            summary.add_row("dedup watermark", dedup)
        ident = {True: "index id matches the dedup state", False: "MISMATCH: the writer refuses to start",
                 None: "not known"}[r.identity_ok]
        summary.add_row("index id", f"{idx.index_id or '-'} ({ident})")
        summary.add_row("snapshots", f"{len(idx.buckets) - 1} sealed, {_mib(idx.snapshot_bytes)}; "
                                     f"journal {idx.journal_records} record(s)"
                                     + (f"; {len(idx.pending_deletions)} awaiting deletion" if idx.pending_deletions else ""))
        parts.append(summary)
        buckets = Table(title=f"{r.label} buckets", title_justify="left")
        for col in ("bucket", "sealed", "ledgers", "indexed", "pending", "snapshot", "first due", "last due"):
            buckets.add_column(col, justify="right" if col in ("indexed", "pending", "snapshot") else "left")
        for b in idx.buckets:
            buckets.add_row(str(b.bucket_id) if b.bucket_id is not None else "mutable", "yes" if b.sealed else "no",
                            f"{b.start_ledger}..{b.end_ledger}" if b.start_ledger >= 0 else "-", str(b.indexes),
                            str(b.pending), _mib(b.snapshot_bytes) if b.sealed else "-",
                            format_ms(b.first_release_ms), format_ms(b.last_release_ms))
        parts.append(buckets)
    return Group(*parts)


def writer_dict(report: WriterReport) -> Dict[str, Any]:
    """The JSON form of `inspect writer`."""
    return report_dict(report)


def syncer_view(report: SyncerReport, now_ms: int) -> Group:
    """The partitions table of `inspect syncer`."""
    table = Table(title=f"DelayLevelSyncer {report.fqfn}: {report.parked} parked, next forward "
                        f"{relative(report.next_forward_ms, now_ms)}", title_justify="left")
    for col in ("partition", "parked", "counted by", "last forwarded", "next forward", "its deliver-at", "note"):
        table.add_column(col, justify="right" if col in ("partition", "parked") else "left")
    for p in report.partitions:
        parked = "?" if p.parked is None else (f">={p.parked}" if p.truncated else str(p.parked))
        table.add_row(str(p.partition), parked, p.parked_source, p.last_forwarded or "-",
                      relative(p.next_forward_ms, now_ms), format_ms(p.next_deliver_at_ms), p.problem)
    # A producer parks on the default topic unless told otherwise: a syncer of another topic
    # sees only the producers that name it.
    whose = ("DelayLevelProducer's default" if report.delay_level_topic == DEFAULT_DELAY_LEVEL_TOPIC else
             f"not DelayLevelProducer's default {DEFAULT_DELAY_LEVEL_TOPIC}: only producers that name it park here")
    head = Text(f"delay-level topic {report.delay_level_topic} ({whose}), subscription {report.subscription}, "
                f"forwards to {report.near_term_topic or 'the business topics (broker backend)'}")
    return Group(head, table)


def syncer_dict(report: SyncerReport) -> Dict[str, Any]:
    """The JSON form of `inspect syncer`."""
    out = asdict(report)
    out["parked"] = report.parked
    out["next_forward_ms"] = report.next_forward_ms
    return out


def deletion_view(report: DeletionReport) -> Group:
    """The topics table of `inspect deletion`."""
    table = Table(title=f"LedgerDeletionWorker {report.fqfn}: {report.total('pending')} pending, "
                        f"{report.total('retry')} retries, {report.total('dead-letter')} dead letters",
                  title_justify="left")
    for col in ("kind", "topic", "messages", "counted"):
        table.add_column(col, justify="right" if col == "messages" else "left")
    for t in report.topics:
        table.add_row(t.kind, t.topic, f">={t.count}" if t.truncated else str(t.count),
                      "subscription backlog" if t.source == "admin-backlog" else "stored on the topic")
    return Group(Text(f"subscription {report.subscription}"), table)


def deletion_dict(report: DeletionReport) -> Dict[str, Any]:
    """The JSON form of `inspect deletion`."""
    out = asdict(report)
    out.update(pending=report.total("pending"), retries=report.total("retry"),
               dead_letters=report.total("dead-letter"))
    return out
