"""`pulsar-lifecycle spark verify`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Tuple

import click

from ..cli import master_option, register, run_job, writer_options


@click.command("verify")
@click.option("--store", required=True, metavar="URL",
              help="The snapshot store: a directory (snapshotDir) or bk://host:4181/tenant/namespace/name.")
@click.option("--against", multiple=True, metavar="PATH",
              help="Export files (or directory) every message of which must be indexed exactly once.")
@writer_options
@master_option
@click.option("--input-format", type=click.Choice(["parquet", "avro"]), default="parquet", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="verify-report", show_default=True,
              help="Directory for summary.txt, report.json and buckets.png.")
@click.option("--allow-overlap", is_flag=True,
              help="Overlapping bucket ledger ranges are a warning, not a violation (a running writer's count/age "
                   "seals split ledgers across buckets).")
@click.option("--frozen", is_flag=True,
              help="With --against: nothing was indexed after the export (e.g. a stopped writer's store), so an "
                   "indexed message that is not in the export is a violation; for a seeded store it always is.")
@click.option("--quiet", is_flag=True, help="No progress display.")
def verify(store: str, against: Tuple[str, ...], function_config_file: Optional[str], user_config: Optional[str],
           master: Optional[str], shared_fs: bool, input_format: str, out_dir: str, allow_overlap: bool, frozen: bool,
           quiet: bool) -> None:
    """Check every snapshot of a writer's store; exit 1 on any violation.

    Checks segment order, the time-step and size limits, that segments are the engine's cut,
    each bitmap against its segment, metadata min/max, bucket keys and ledger ranges (disjoint),
    and the manifest against the snapshots. Safe on a running writer's store (reads one
    consistent manifest, writes nothing). Writes summary.txt, report.json and buckets.png.

    With --against, an indexed message that is not in the export is a violation when the store
    is as the seeder left it (or --frozen), a counted warning for a live writer's store, which
    also holds messages published after the export.

    \b
    Example:
      pulsar-lifecycle spark verify --store /data/buckets/writer --against backlog/ \\
          --function-config-file function-configs/bucket-snapshot-writer.yaml --out verify-report/
    """
    from ..paths import STORE_HINT, require_reachable, resolve_all, resolve_store
    from ..progress import JobProgress
    from ..session import DEFAULT_MASTER, spark_session
    from ..settings import writer_settings
    from .driver import run_verify, write_outputs

    out_path = Path(out_dir).absolute()  # this directory, whatever runs later

    def job():  # type: ignore[no-untyped-def]
        config, opts = writer_settings(function_config_file, user_config)
        store_path, inputs = resolve_store(store), resolve_all(against)
        require_reachable(master or DEFAULT_MASTER, [("--store", store_path)], shared_fs, hint=STORE_HINT)
        require_reachable(master or DEFAULT_MASTER, [("--against", p) for p in inputs], shared_fs)  # before Spark starts
        with spark_session(master, "pulsar-lifecycle verify") as spark, \
                JobProgress(spark, "verify", enabled=not quiet) as progress:
            return run_verify(spark, store_path.url, config, against=[p.url for p in inputs] or None, opts=opts, fmt=input_format,
                              allow_overlap=allow_overlap, progress=progress, frozen=frozen, shared_fs=shared_fs)

    report = run_job(job)
    paths = write_outputs(report, out_path)
    click.echo(report.summary())
    click.echo(f"report: {paths['report']}  picture: {paths['picture']}")
    if not report.ok:
        sys.exit(1)


register(verify)
