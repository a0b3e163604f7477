"""`pulsar-lifecycle spark seed`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Tuple

import click

from ..cli import master_option, register, run_job, writer_options


@click.command("seed")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--store", required=True, metavar="URL",
              help="The writer's snapshot store: a directory (snapshotDir) or bk://host:4181/tenant/namespace/name.")
@writer_options
@master_option
@click.option("--input-format", type=click.Choice(["parquet", "avro"]), default="parquet", show_default=True)
@click.option("--max-buckets", type=int, default=0,
              help="Plan at most this many buckets (default: the writer's delayedDeliveryMaxNumBuckets).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here.")
@click.option("--allow-invalid", is_flag=True, help="Exit 0 even when rows the writer would refuse were skipped.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--shuffle", is_flag=True,
              help="Always move the rows through Spark's shuffle; by default executors read the Parquet row groups "
                   "of their own ledgers directly when the export is ordered enough (docs/spark.md).")
def seed(inputs: Tuple[str, ...], store: str, function_config_file: Optional[str], user_config: Optional[str],
         master: Optional[str], shared_fs: bool, input_format: str, max_buckets: int, report_path: Optional[str],
         allow_invalid: bool, quiet: bool, shuffle: bool) -> None:
    """Build a new writer's bucket snapshots from exported backlog files, on Spark.

    The store must be new (no manifest, cursor or journal). Buckets cover whole ledgers, cut by
    the writer's own rules; the writer started on the store afterwards releases every message
    on time without replaying the backlog. Rows the writer would refuse are counted and shown
    (they stay in the export files). Before the manifest is written (last), every snapshot is
    read back and checked against what its task reported; a failed check exits 1 with no manifest.

    \b
    Example:
      pulsar-lifecycle export-backlog --service-url pulsar://localhost:6650 \\
          --topic persistent://public/default/delayed-scheduling \\
          --subscription public/default/bucket-snapshot-writer --out backlog/
      pulsar-lifecycle spark seed backlog/ --store /data/buckets/writer \\
          --function-config-file function-configs/bucket-snapshot-writer.yaml --report seed.json
    """
    from ..paths import STORE_HINT, require_reachable, resolve_all, resolve_store
    from ..progress import JobProgress
    from ..session import DEFAULT_MASTER, spark_session
    from ..settings import writer_settings
    from .driver import run_seed

    report_file = Path(report_path).absolute() if report_path else None  # this directory, whatever runs later

    def job():  # type: ignore[no-untyped-def]
        config, opts = writer_settings(function_config_file, user_config)
        paths, store_path = resolve_all(inputs), resolve_store(store)
        require_reachable(master or DEFAULT_MASTER, [("backlog", p) for p in paths], shared_fs)  # before Spark starts
        require_reachable(master or DEFAULT_MASTER, [("--store", store_path)], shared_fs, hint=STORE_HINT)
        with spark_session(master, "pulsar-lifecycle seed") as spark, \
                JobProgress(spark, "seed", enabled=not quiet) as progress:
            return run_seed(spark, [p.url for p in paths], store_path.url, config, opts, fmt=input_format, max_buckets=max_buckets,
                            progress=progress, direct=not shuffle, shared_fs=shared_fs)

    report = run_job(job)
    if report_file is not None:
        report_file.write_text(report.to_json())
    click.echo(f"seeded {store}: {report.items:,} items in {report.buckets} buckets ({report.segments} segments) "
               f"from {report.rows:,} rows in {report.seconds:.1f} s ({report.rows_per_s:,.0f} rows/s, {report.path} path); "
               f"duplicates {report.duplicates}, cancelled {report.cancelled} "
               f"({report.cancel_requests} cancel requests, {report.tombstones} tombstones), invalid {report.invalid}")
    for example in report.invalid_examples:
        click.echo(f"  invalid: {example}", err=True)
    if report.invalid and not allow_invalid:
        click.echo(f"{report.invalid} rows were not seeded (see above); --allow-invalid accepts that", err=True)
        sys.exit(2)


register(seed)
