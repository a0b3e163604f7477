"""`pulsar-lifecycle export-backlog`."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional, Tuple

import click

from ...cli.client_options import client_options
from ...runtime.local_paths import absolute_path
from ..errors import SparkJobError


@click.command("export-backlog")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), callback=absolute_path,
              help="Directory of the Parquet files.")
@click.option("--service-url", default=None,
              help="pulsar:// or pulsar+ssl:// URL of the broker (draining a subscription) "
                   "[default: brokerServiceUrl of the client.conf].")
@click.option("--topic", "topics", multiple=True,
              help="Scheduling topic (repeat for each partition `<topic>-partition-<k>` where needed).")
@click.option("--subscription", default=None,
              help="The writer's scheduling subscription (default of the writer: tenant/namespace/name).")
@click.option("--store", default=None, metavar="DIR", callback=absolute_path,
              help="The writer's snapshot directory: its lock is held while exporting (fails if the writer runs).")
@click.option("--from-jobs", "jobs_file", type=click.Path(exists=True, dir_okay=False), default=None, callback=absolute_path,
              help="Instead of a subscription: an external dataset of scheduled jobs (JSON lines).")
@click.option("--dataset-id", type=int, default=0, show_default=True,
              help="With --from-jobs: picks the reserved position range (one id per dataset).")
@click.option("--batch-rows", type=int, default=50_000, show_default=True, help="Messages per file (acked together).")
@click.option("--idle-ms", type=int, default=3000, show_default=True, help="Stop when nothing arrives for this long.")
@click.option("--max-messages", type=int, default=None, help="Stop after this many messages.")
@click.option("--wake-topic", default=None, metavar="TOPIC",
              help="The writer's tickTopic: after draining, leave one tick there so that the writer's next "
                   "start runs at once and releases what is seeded, even with no new scheduling message.")
@client_options
def export_backlog(out_dir: str, service_url: Optional[str], topics: Tuple[str, ...], subscription: Optional[str],
                   store: Optional[str], jobs_file: Optional[str], dataset_id: int, batch_rows: int, idle_ms: int,
                   max_messages: Optional[int], wake_topic: Optional[str]) -> None:
    """Drain a stopped writer's scheduling subscription into Parquet files for `spark seed`.

    Messages are acked only after the file holding them is durable; after a crash run the
    same command again: nothing is lost and nothing is exported twice. `--from-jobs` converts an
    external dataset (one JSON object per line: deliver_at, payload or payload_b64, optional
    key, target, properties, event_time) instead, with positions from a reserved ledger-id range.

    \b
    Examples:
      pulsar-lifecycle export-backlog --service-url pulsar://localhost:6650 \\
          --topic persistent://public/default/delayed-scheduling \\
          --subscription public/default/bucket-snapshot-writer --out backlog/
      pulsar-lifecycle export-backlog --from-jobs jobs.jsonl --dataset-id 1 --out backlog/
    """
    from ...scheduler.wake import send_wake_tick
    from ..store import exclusive
    from .driver import export_backlog as run_export
    from .driver import import_jobs

    try:
        if jobs_file:
            if topics or service_url:
                raise click.UsageError("--from-jobs takes no --service-url/--topic")
            report = import_jobs(Path(jobs_file), dataset_id, Path(out_dir), batch_rows=batch_rows)
        else:
            if not (topics and subscription):
                raise click.UsageError("draining needs --service-url, --topic and --subscription (or use --from-jobs)")
            from ...cli.client_options import client_settings
            from ...runtime.connect import open_client

            settings = client_settings(service_url)  # no URL here nor in a client.conf: one line

            with exclusive(store) if store else contextlib.nullcontext():
                client = open_client(settings, None)  # a refused or silent broker: one line, not 30 s of retries
                try:
                    report = run_export(client, list(topics), subscription, Path(out_dir), batch_rows=batch_rows,
                                        idle_ms=idle_ms, max_messages=max_messages)
                    if wake_topic:  # the writer's first start after a seed needs an input message
                        send_wake_tick(client, wake_topic)
                finally:
                    client.close()
    except SparkJobError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:
        import pulsar  # the client raises its own exception types, which name no broker

        if not isinstance(exc, pulsar.PulsarException):
            raise
        raise click.ClickException(f"broker {service_url} (topic {', '.join(topics)}, subscription {subscription}): "
                                   f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    click.echo(f"exported {report.rows_written:,} messages in {report.files_written} new files to {out_dir} "
               f"({report.files_before} files were there; {report.redelivered_skipped} already exported) "
               f"in {report.seconds:.1f} s")
    if report.held_exported:
        click.echo(f"{report.held_exported:,} of them were read with a Reader: a killed exporter's consumer still "
                   "holds them (the embedded broker keeps it until it restarts). They stay on the subscription, "
                   "unacked; a later export and the writer on the seeded store ack them as already there.")
