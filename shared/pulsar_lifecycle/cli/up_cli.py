"""`pulsar-lifecycle up`: the broker and every shipped function running together, with a live
status view; Ctrl-C (or SIGTERM) stops everything cleanly."""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any, Optional, Tuple

import click

from ..logging_setup import log_to_file
from ..runtime.local_paths import absolute_path
from .args import check_service_url
from .client_options import client_options, client_settings, conf_default

log = logging.getLogger(__name__)


@click.command("up")
@click.option("--config-dir", type=click.Path(file_okay=False), default="function-configs", show_default=True,
              callback=absolute_path, help="Run every *.yaml here (one config per function name: the shortest file name wins).")
@click.option("--function-config-file", "config_files", multiple=True, type=click.Path(dir_okay=False),
              callback=absolute_path, help="Run these configs instead of --config-dir's (repeatable).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=".pulsar-lifecycle", show_default=True,
              callback=absolute_path, help="Broker data, function state and bucket snapshots; a restart with it continues.")
@click.option("--broker-service-url", default=conf_default("brokerServiceUrl"),
              help="pulsar:// or pulsar+ssl:// URL of an external broker, reached with the connection options "
                   "below; omitted = `brokerServiceUrl` of the client.conf (--client-conf, $PULSAR_CLIENT_CONF), "
                   "as the other commands take it; neither = start the embedded pulsar-lite broker.")
@client_options
@click.option("--state-storage-service-url", default=None,
              help="bk://host:4181 for the function state; omitted = the directory store in --data-dir.")
@click.option("--embedded-broker-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of the embedded broker (0 = the port this --data-dir last ran on, else a free one).")
@click.option("--refresh", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between status updates.")
@click.option("--run-seconds", type=click.FloatRange(min=0), default=None, help="Stop by itself after this long (scripts).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve the metrics of every function on http://127.0.0.1:PORT/metrics (0 = a free one).")
def up(config_dir: str, config_files: Tuple[str, ...], data_dir: str, broker_service_url: Optional[str],
       state_storage_service_url: Optional[str], embedded_broker_port: int, refresh: float,
       run_seconds: Optional[float], metrics_port: Optional[int]) -> None:
    """Run the broker and every shipped function as one local service, with a live status view.

    Stops on Ctrl-C or SIGTERM (functions first, then the broker); everything is kept in
    --data-dir, so the next `up` with it continues where this one stopped.
    """
    from rich.console import Console
    from rich.live import Live

    from ..config.function_config import FunctionConfigError
    from ..runtime.localrun import prepare_data_dir
    from .status import StatusBoard
    from .up import LocalService, plan_functions

    if broker_service_url is not None:
        check_service_url("--broker-service-url", broker_service_url)
    if state_storage_service_url is not None and not state_storage_service_url.lower().startswith("bk://"):
        raise click.BadParameter(f"{state_storage_service_url!r} is not a bk://host:port URL",
                                 param_hint="--state-storage-service-url")
    files = [Path(f) for f in config_files] or sorted(Path(config_dir).glob("*.yaml"))
    if not files:
        raise click.BadParameter(f"no *.yaml in {config_dir}: run from the checkout or give --function-config-file",
                                 param_hint="--config-dir")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise click.BadParameter(f"not found: {', '.join(missing)}", param_hint="--function-config-file")
    try:
        plans, notes = plan_functions(files, embedded=broker_service_url is None, data_dir=Path(data_dir))
    except FunctionConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    _check_plans(plans)
    # A terminal gets the live view and the log goes to --data-dir; a pipe gets plain tables.
    console = Console() if sys.stdout.isatty() else Console(width=140)
    # An external broker is reached as every command reaches one: the token and TLS trust of
    # --auth-plugin/--auth-params/--tls-trust-cert-path or the client.conf, for the functions too.
    client = client_settings(broker_service_url) if broker_service_url is not None else None
    service = LocalService(plans, Path(data_dir), broker_service_url=broker_service_url, client=client,
                           state_storage_service_url=state_storage_service_url,
                           embedded_broker_port=embedded_broker_port)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("event=signal_received signal=%d", signum)
        service.request_stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    prepare_data_dir(Path(data_dir))  # one line naming the directory when it cannot be used
    if console.is_terminal:
        log_to_file(Path(data_dir) / "up.log")
    service.start()  # a failure stops what started and ends the command with one line
    for plan in plans:
        for change in plan.changes:
            console.print(f"{plan.spec.name}: {change}")
    for note in notes:
        console.print(note)
    broker = service.broker
    if broker is not None and broker.port_changed is not None:
        old, holder = broker.port_changed
        console.print(f"broker port changed: {old}, the port this --data-dir last ran on, is taken by {holder}; "
                      f"clients given the old URL must use {service.service_url}")
    kept = "; its port is kept across restarts of this --data-dir (--embedded-broker-port pins one)" \
        if broker is not None else ""
    console.print(f"broker {service.service_url}{kept}; pulsar-client log {service.client_log}"
                  + (f"; log {Path(data_dir) / 'up.log'}" if console.is_terminal else ""))
    metrics = None
    if metrics_port is not None:
        from .up_metrics import UpMetricsServer

        try:
            metrics = UpMetricsServer(service, metrics_port).start()
        except OSError as exc:
            service.stop()
            raise click.ClickException(str(exc)) from exc
        console.print(f"metrics http://127.0.0.1:{metrics.bound}/metrics (every function; deploy/ dashboard and alerts)")
    board = StatusBoard(service).start()
    try:
        if console.is_terminal:
            with Live(board.table(), console=console, refresh_per_second=max(1, int(1 / refresh))) as live:
                _loop(service, run_seconds, refresh, lambda: live.update(board.table()))
        else:  # a pipe or a file: a table at the start and at the end
            console.print(board.table())
            _loop(service, run_seconds, refresh, lambda: None)
            console.print(board.table())
    finally:
        board.stop()
        if metrics is not None:
            metrics.stop()
        service.stop()
    console.print("stopped")


def _loop(service: Any, run_seconds: Optional[float], refresh: float, update: Any) -> None:
    import time

    deadline = None if run_seconds is None else time.monotonic() + run_seconds
    while not service.wait(refresh):
        update()
        if deadline is not None and time.monotonic() >= deadline:
            break


def _check_plans(plans: Any) -> None:
    """The checks `localrun` makes on each config, before anything starts."""
    from ..config.function_config import load_function_config, merged_config
    from ..config.validate import function_problems
    from .function_registry import FUNCTION_CHECKS, USER_CONFIG_KEYS

    problems = []
    for plan in plans:
        cfg = merged_config(load_function_config(plan.path), {"userConfig": plan.spec.user_config})
        problems += function_problems(cfg, str(plan.path), USER_CONFIG_KEYS, FUNCTION_CHECKS)
    if problems:
        raise click.ClickException("\n".join([*problems, f"{len(problems)} problem(s): nothing started"]))
