"""`pulsar-lifecycle inspect writer|syncer|deletion`: look into a function's state, read-only.

Safe while the function runs: nothing is written, acknowledged or created. A rich table by
default, `--json` for scripts. Every argument is checked before anything connects.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click
from rich.console import Console

from ..clock import wall_clock_ms
from ..runtime.local_paths import absolute_path
from .args import check_http_url, check_service_url, connect_timeout_option
from .client_options import client_options, client_settings, conf_default


def _spec(path: str, default_name: str) -> Any:
    """The FunctionSpec of a function-config YAML (click.BadParameter when it cannot be read)."""
    from ..config.function_config import FunctionConfigError, load_function_config, spec_from_config

    if not Path(path).is_file():
        hint = f" (the default is the shipped {default_name}; run from the checkout or give the file)" \
            if path.endswith(default_name) else ""
        raise click.BadParameter(f"{path} not found{hint}", param_hint="--function-config-file")
    try:
        return spec_from_config(load_function_config(path))
    except FunctionConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--function-config-file") from exc


def _check_state_url(url: Optional[str]) -> Optional[str]:
    if url is not None and not url.lower().startswith("bk://"):
        raise click.BadParameter(f"{url!r} is not a bk://host:port URL", param_hint="--state-storage-service-url")
    return url


def _emit(as_json: bool, data: Any, view: Any) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        Console(width=160).print(view)


def _config_option(default_name: str) -> Any:
    return click.option("--function-config-file", "config_file", default=f"function-configs/{default_name}",
                        show_default=True, help="The function's config YAML (as given to localrun or functions create).")


_json_option = click.option("--json", "as_json", is_flag=True, help="JSON on stdout instead of tables.")
_data_dir_option = click.option("--data-dir", type=click.Path(file_okay=False), default=".pulsar-lifecycle",
                                show_default=True, callback=absolute_path, help="The --data-dir the function runs with under localrun or up.")
_state_option = click.option("--state-storage-service-url", "state_url", default=None,
                             help="bk://host:port of the table service holding the function state "
                                  "(default: the directory store in --data-dir).")


def _connection_options(f: Any) -> Any:
    f = connect_timeout_option(f)
    f = click.option("--admin-url", default=conf_default("webServiceUrl"),
                     help="Admin REST URL (real Pulsar): counts from subscription backlogs; called with the "
                          "token and TLS trust of the options below [default: webServiceUrl of the client.conf].")(f)
    f = click.option("--service-url", required=True, default=conf_default("brokerServiceUrl"),
                     help="pulsar:// or pulsar+ssl:// URL of the broker the function runs on "
                          "[default: brokerServiceUrl of the client.conf].")(f)
    f = client_options(f)
    f = click.option("--limit", type=click.IntRange(min=1), default=100_000, show_default=True,
                     help="Most messages a Reader counts per topic.")(f)
    return f


def _admin_access(admin_url: str, settings: Any) -> Any:
    """How this command reaches the admin REST API: the client settings' token (as a Bearer
    token) and CA, and the token's role for a refusal's one line."""
    from ..deletion.admin import AdminAccess
    from ..runtime.client_conf import token_of, token_role

    return AdminAccess.of_client(admin_url, token=token_of(settings), role=token_role(settings),
                                 ca_path=settings.tls_trust_cert_path, insecure=settings.tls_allow_insecure)


@click.group("inspect")
def inspect_group() -> None:
    """Look into a writer, syncer or deletion worker (read-only, safe while it runs)."""


@inspect_group.command("writer")
@_config_option("bucket-snapshot-writer.yaml")
@_data_dir_option
@click.option("--store", default=None, callback=absolute_path,
              help="A snapshot store directory to read instead of the configured one.")
@_state_option
@_json_option
def inspect_writer_cmd(config_file: str, data_dir: str, store: Optional[str], state_url: Optional[str],
                       as_json: bool) -> None:
    """A BucketSnapshotWriter: pending messages, buckets, next due, tombstones, dedup watermark.

    Reads its snapshot store (a directory, or the BookKeeper table service with snapshotStorage
    bookkeeper) and its function state; needs no broker.
    """
    from .render import writer_dict, writer_view
    from .writer_view import inspect_writer

    spec = _spec(config_file, "bucket-snapshot-writer.yaml")
    _check_state_url(state_url)
    if store is not None and not Path(store).is_dir():
        raise click.BadParameter(f"{store} is not a directory", param_hint="--store")
    report = inspect_writer(spec, data_dir=Path(data_dir), state_url=state_url, store=store)
    _emit(as_json, writer_dict(report), writer_view(report, wall_clock_ms()))
    if not as_json and report.problem:
        # Held targets (the writer cannot publish to them) and other problems of an index that reads.
        from rich.text import Text
        Console(width=160).print(Text.assemble(("problem", "bold red"), f": {report.problem}"))


@inspect_group.command("syncer")
@_config_option("delay-level-syncer.yaml")
@_connection_options
@_data_dir_option
@_state_option
@_json_option
def inspect_syncer_cmd(config_file: str, service_url: str, admin_url: Optional[str], connect_timeout: Optional[float],
                       limit: int, data_dir: str, state_url: Optional[str], as_json: bool) -> None:
    """A DelayLevelSyncer: parked messages per delay-level partition and the next forward time.

    Counts from the syncer subscription's backlog with --admin-url (real Pulsar); otherwise the
    messages after the last forwarded one, read with a non-durable Reader (pulsar-lite).
    """
    from ..runtime.connect import open_client
    from .common import open_state_reader
    from .render import syncer_dict, syncer_view
    from .syncer_view import inspect_syncer, syncer_config

    spec = _spec(config_file, "delay-level-syncer.yaml")
    syncer_config(spec)
    check_service_url("--service-url", service_url)
    admin = check_http_url("--admin-url", admin_url)
    _check_state_url(state_url)
    state = open_state_reader(spec, Path(data_dir), state_url)
    try:
        settings = client_settings(service_url)
        access = _admin_access(admin, settings) if admin else None
        client = open_client(settings, connect_timeout)
        try:
            # exact: every partition asked for its end (the status view's look skips empty ones)
            report = inspect_syncer(spec, client, state, admin_url=admin, admin_access=access, count_limit=limit,
                                    empty_wait_s=None)
        finally:
            client.close()
    finally:
        if state is not None:
            state.close()
    _emit(as_json, syncer_dict(report), syncer_view(report, wall_clock_ms()))


@inspect_group.command("deletion")
@_config_option("ledger-deletion-worker.yaml")
@_connection_options
@click.option("--tenant", default=None, help="Whose topics (deletionTopicScope tenant).")
@_json_option
def inspect_deletion_cmd(config_file: str, service_url: str, admin_url: Optional[str], connect_timeout: Optional[float],
                         limit: int, tenant: Optional[str], as_json: bool) -> None:
    """A LedgerDeletionWorker: pending requests, retries and dead letters.

    Counts from the worker subscription's backlog with --admin-url (real Pulsar); otherwise the
    messages stored on each topic, read with a non-durable Reader (pulsar-lite).
    """
    from ..runtime.connect import open_client
    from .deletion_view import deletion_topics, inspect_deletion
    from .render import deletion_dict, deletion_view

    spec = _spec(config_file, "ledger-deletion-worker.yaml")
    deletion_topics(spec, tenant)
    check_service_url("--service-url", service_url)
    admin = check_http_url("--admin-url", admin_url)
    settings = client_settings(service_url)
    access = _admin_access(admin, settings) if admin else None
    client = open_client(settings, connect_timeout)
    try:
        report = inspect_deletion(spec, client, tenant=tenant, admin_url=admin, admin_access=access, count_limit=limit)
    finally:
        client.close()
    _emit(as_json, deletion_dict(report), deletion_view(report))

