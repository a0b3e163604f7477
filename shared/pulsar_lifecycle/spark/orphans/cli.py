"""`pulsar-lifecycle spark orphans`: audit storage for orphan ledgers (dry run by default)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import click

from ...cli.deletion_cli import delay_options, deletion_topic_options
from ..cli import master_option, register
from ..errors import SparkJobError
from .model import ADMIN_COMPONENTS, ALL_COMPONENTS, STATUSES, ListingError, parse_duration_ms

EXIT_LISTING_FAILED = 2
EXIT_ENQUEUE_FAILED = 3

EXAMPLE = """
\b
Example (dry run, then a confirming run that enqueues, 6 h apart):
  pulsar-lifecycle spark orphans --bookie-url http://bookie-1:8000 \\
      --s3-bucket pulsar-offload --s3-endpoint-url https://s3.eu-west-1.amazonaws.com \\
      --admin-url http://broker-1:8080 --state-dir /var/lib/pl-orphans \\
      --json-report scan.json
  pulsar-lifecycle spark orphans ... --confirm-after 6h --enqueue --service-url pulsar://broker-1:6650
\b
From exported lists (Parquet/CSV/JSON lines, column ledger_id; listings may add component,
owner, created_ms, store, id_space, detail):
  pulsar-lifecycle spark orphans --listed ledgers.parquet --in-use in-use.parquet --master local[4]

Exit status: 0 done, 2 a listing or metadata source failed (nothing reported), 3 an enqueue failed.
"""


def _duration(_ctx: Any, param: click.Parameter, value: str) -> int:
    try:
        return parse_duration_ms(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def _deletion_options(f: Any) -> Any:
    # The broker URL is needed only with --enqueue (checked in the command).
    return deletion_topic_options(f, service_url_required=False)


def _text_summary(report: Dict[str, Any], state_dir: str) -> List[str]:
    c = report["counts"]
    lines = [f"orphan scan {report['scanId']}: {sum(c.values()):,} listed"]
    lines += [f"  {s:<20} {c.get(s, 0):>12,}" for s in STATUSES]
    for row in report["orphanSample"][:20]:
        lines.append(f"  orphan {row['store']} ledger {row['ledger_id']} {row['component']} owner={row['owner']}"
                     + (f" ({row['detail']})" if row.get("detail") else ""))
    if report["orphans"] > 20:
        lines.append(f"  ... {report['orphans'] - 20:,} more in {state_dir}/scans/{report['scanId']}.parquet")
    prev = report["confirmingScan"]
    if prev is None:
        lines.append("  confirmed: none (no committed scan old enough to confirm this one)")
    else:
        lines.append(f"  confirmed by scan {prev['scan_id']}: {report['confirmed']:,}")
    enq = report.get("enqueue")
    if enq is None:
        lines.append("  dry run: nothing enqueued (use --enqueue)")
    else:
        lines.append(f"  enqueued for two-phase deletion: {len(enq['sent'])}, not enqueueable: {len(enq['skipped'])}"
                     + (f", FAILED: {enq['failed']}" if enq["failed"] else ""))
    t = report.get("timings") or {}
    if t.get("elapsed_s"):
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in (t.get("phases_s") or {}).items())
        lines.append(f"  took {t['elapsed_s']:.1f} s ({t.get('rows_per_s', 0):,} rows/s): {phases}")
    return lines


@click.command("orphans", epilog=EXAMPLE)
@master_option
@click.option("--bookie-url", multiple=True, help="Bookie HTTP admin URL (http://bookie:8000); lists every ledger.")
@click.option("--s3-bucket", multiple=True, help="Offload bucket to list (objects <uuid>-ledger-<id>[-index]).")
@click.option("--s3-endpoint-url", default=None, help="S3 endpoint (default AWS).")
@click.option("--s3-region", default=None)
@click.option("--offload-dir", multiple=True, type=click.Path(file_okay=False),
              help="Filesystem offloader base directory (<base>/<tenant>/<ns>/persistent/<topic>/<id>-<uuid>).")
@click.option("--snapshot-dir", multiple=True, type=click.Path(file_okay=False),
              help="A BucketSnapshotWriter's snapshotDir: lists its snapshots AND reads its manifest.")
@click.option("--listed", multiple=True, type=click.Path(), help="Exported listing (Parquet/CSV/JSON lines).")
@click.option("--admin-url", multiple=True, help="Pulsar admin URL (http://broker:8080): every topic's ledgers.")
@click.option("--admin-token", default=None, envvar="PULSAR_ADMIN_TOKEN", help="Bearer token for the admin API.")
@click.option("--tenant", "tenants", multiple=True, help="Scan only these tenants (default all).")
@click.option("--in-use", "in_use_files", multiple=True, type=click.Path(), help="Exported in-use ledger ids.")
@click.option("--in-use-covers", multiple=True, type=click.Choice(ALL_COMPONENTS),
              help="Components an --in-use list is complete for (default: "
                   + ", ".join(ADMIN_COMPONENTS) + ").")
@click.option("--older-than", default="24h", show_default=True, callback=_duration,
              help="Minimum age of an orphan (ledger ctime / object mtime).")
@click.option("--confirm-after", default="1h", show_default=True, callback=_duration,
              help="An orphan is confirmed when a committed scan at least this much older also found it.")
@click.option("--max-admin-rps", type=float, default=50.0, show_default=True,
              help="Admin REST (and S3 HEAD) calls per second; 0 = unlimited.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=".pulsar-lifecycle/orphan-scans",
              show_default=True, help="Where scans are committed (must survive between runs).")
@click.option("--enqueue", is_flag=True, help="Send confirmed orphans to phase one of two-phase deletion.")
@click.option("--json-report", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here.")
@click.option("--sample", type=int, default=1000, show_default=True, help="Orphans listed in the report.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@_deletion_options
@delay_options
def orphans(master: Optional[str], shared_fs: bool, bookie_url: Tuple[str, ...], s3_bucket: Tuple[str, ...],
            s3_endpoint_url: Optional[str], s3_region: Optional[str], offload_dir: Tuple[str, ...],
            snapshot_dir: Tuple[str, ...], listed: Tuple[str, ...], admin_url: Tuple[str, ...],
            admin_token: Optional[str], tenants: Tuple[str, ...], in_use_files: Tuple[str, ...],
            in_use_covers: Tuple[str, ...], older_than: int, confirm_after: int, max_admin_rps: float,
            state_dir: str, enqueue: bool, json_report: Optional[str], sample: int, quiet: bool,
            send_delay_seconds: int, delay_backend: str, scheduling_topic: Optional[str], **opts: Any) -> None:
    """Report ledgers whose metadata names a Pulsar component but that no metadata uses.

    Storage is listed first (bookies with custom metadata, S3 and filesystem offloads, snapshot
    stores, exported lists), then the metadata is read (admin internalStats of every topic,
    bucket manifests, exported lists); Spark anti-joins them. Safety rules: any failed or partial
    listing aborts the scan; ledgers newer than the newest id the metadata knows, younger than
    --older-than, or of a component/namespace no in-use source covers are never orphans; only
    orphans also found by a committed scan at least --confirm-after older are enqueued, and only
    through phase one of two-phase deletion (the deletion worker re-checks before deleting).
    """
    from ...deletion.storage.s3 import make_s3_client  # boto3 only when S3 is listed
    from ..paths import resolve
    from .driver_frames import default_export_coverage
    from .sources import (
        AdminInUse,
        BookieListing,
        FilesystemListing,
        RateLimiter,
        S3OffloadListing,
        SnapshotManifestInUse,
        SnapshotStoreListing,
    )
    from .state import ScanStateDir, ScanStateError

    if not (bookie_url or s3_bucket or offload_dir or snapshot_dir or listed):
        raise click.UsageError("nothing to list: give --bookie-url, --s3-bucket, --offload-dir, --snapshot-dir or --listed")
    if (bookie_url or s3_bucket or offload_dir or listed) and not (admin_url or in_use_files):
        raise click.UsageError("ledgers are listed but no metadata is read: give --admin-url or --in-use")
    if enqueue and not opts.get("service_url"):
        raise click.UsageError("--enqueue needs --service-url (the broker of the deletion topic)")
    if in_use_covers and not in_use_files:
        raise click.UsageError("--in-use-covers applies to --in-use lists")
    # Every path absolute here, on the driver: executors write the candidates under --state-dir
    # and read the exported lists, each from a working directory of its own.
    state_path, listed_paths, in_use_paths = resolve(state_dir), [resolve(p) for p in listed], \
        [resolve(p) for p in in_use_files]
    offload_dir = tuple(str(resolve(d).local or d) for d in offload_dir)
    snapshot_dir = tuple(str(resolve(d).local or d) for d in snapshot_dir)
    state_dir = str(state_path.local or state_dir)
    listed = tuple(str(p.local or p.given) for p in listed_paths)
    in_use_files = tuple(str(p.local or p.given) for p in in_use_paths)
    limiter = RateLimiter(max_admin_rps)
    listings: List[Any] = [BookieListing(bookie_url)] if bookie_url else []
    if s3_bucket:
        client = make_s3_client(s3_endpoint_url, s3_region)
        listings += [S3OffloadListing(client, b, limiter) for b in s3_bucket]
    listings += [FilesystemListing(d) for d in offload_dir] + [SnapshotStoreListing(d) for d in snapshot_dir]
    in_use: List[Any] = [AdminInUse(admin_url, limiter, admin_token, tenants=tenants)] if admin_url else []
    in_use += [SnapshotManifestInUse(d) for d in snapshot_dir]

    def job() -> Dict[str, Any]:
        from ..paths import require_reachable
        from ..progress import JobProgress
        from ..session import DEFAULT_MASTER, spark_session
        from .driver import AuditConfig, run_audit

        config = AuditConfig(listings, listed, in_use, in_use_files, default_export_coverage(in_use_covers or None),
                             older_than, confirm_after, sample)
        shared = [("--state-dir", state_path)] + [("--listed", p) for p in listed_paths] + \
            [("--in-use", p) for p in in_use_paths]  # the executors write or read these
        require_reachable(master or DEFAULT_MASTER, shared, shared_fs)  # before Spark starts
        with spark_session(master, "pulsar-lifecycle orphans") as spark:
            require_reachable(spark.sparkContext.master, shared, shared_fs)  # spark-defaults may name the master
            state = ScanStateDir(Path(state_dir))
            service = client = None
            if enqueue:
                from ...cli.deletion_cli import build_service

                service, client = build_service(opts, send_delay_seconds, delay_backend, scheduling_topic)
            try:
                with JobProgress(spark, "orphan audit", enabled=not quiet) as prog:
                    report = run_audit(spark, config, state, service.append if service is not None else None, prog)
                out = report.as_dict()
                out["timings"] = prog.summary()
                return out
            finally:
                if service is not None:
                    service.close()
                if client is not None:
                    client.close()

    from ..cli import run_job

    try:
        report = run_job(job)
    except ListingError as exc:
        click.echo(f"orphan scan aborted, nothing reported: {exc}", err=True)
        sys.exit(EXIT_LISTING_FAILED)
    except ScanStateError as exc:
        raise click.ClickException(str(exc)) from exc
    except SparkJobError as exc:  # pragma: no cover - run_job already converts it
        raise click.ClickException(str(exc)) from exc
    if json_report:
        Path(json_report).write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
    for line in _text_summary(report, state_dir):
        click.echo(line)
    if report.get("enqueue") and report["enqueue"]["failed"]:
        sys.exit(EXIT_ENQUEUE_FAILED)


register(orphans)
