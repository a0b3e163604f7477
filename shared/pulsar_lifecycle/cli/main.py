"""`pulsar-lifecycle`: local run mode, config validation, packaging and operator tools."""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import click

from ..config.settings import ConfigError, user_config_from_json
from ..logging_setup import ClientLogRotation, default_client_log, route_client_log, setup_logging
from ..runtime.local_paths import absolute_path
from .args import connect_timeout_option
from .client_options import client_options, conf_default


class _OneLineErrors(click.Group):
    """Every command: an unexpected exception becomes one line on stderr and exit status 1.

    The traceback goes to the log at DEBUG (`--log-level DEBUG` shows it), never to an
    operator's terminal by default.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            logging.getLogger("pulsar_lifecycle.cli").debug("command failed", exc_info=True)
            raise click.ClickException(one_line_error(exc)) from exc


# Feature groups live with their features and are imported when named (or listed by --help):
# importing them all took ~0.35 s of every command's start, `localrun` included (requests, rich,
# Spark's helpers), which a writer restart waits out before its first release. A group whose
# module is missing is left out; the others work.
OPTIONAL_GROUPS = {
    "deletion": ("pulsar_lifecycle.cli.deletion_cli", "deletion"),
    "demo": ("pulsar_lifecycle.cli.demo", "demo"),
    "spark": ("pulsar_lifecycle.spark.cli", "spark"),
    "export-backlog": ("pulsar_lifecycle.spark.export.cli", "export_backlog"),
    "inspect": ("pulsar_lifecycle.cli.inspect_cli", "inspect_group"),
    "delayed": ("pulsar_lifecycle.cli.delayed_cli", "delayed"),
    "up": ("pulsar_lifecycle.cli.up_cli", "up"),
}


class _MainGroup(_OneLineErrors):
    """The top-level group: its own commands, and the feature groups of OPTIONAL_GROUPS loaded on use."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted(set(super().list_commands(ctx)) | set(OPTIONAL_GROUPS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in OPTIONAL_GROUPS:
            import importlib

            module, attr = OPTIONAL_GROUPS[cmd_name]
            try:
                cmd = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):
                return None
            self.add_command(cmd, cmd_name)
        return cmd


def one_line_error(exc: BaseException) -> str:
    """`exc` as one line: the package's own errors as they are, others with their type."""
    from ..exceptions import PulsarLifecycleError

    text = " ".join(str(exc).split()) or repr(exc)
    if isinstance(exc, (PulsarLifecycleError, click.ClickException)):
        return text
    return f"{type(exc).__name__}: {text}"


@click.group(cls=_MainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(log_level: str) -> None:
    """Pulsar Functions for ledger lifecycle: two-phase deletion, delayed delivery, de-duplication."""
    setup_logging(log_level)
    # pulsar-client's C++ log lines go to a file, never to an operator's terminal (localrun and
    # up move it into their --data-dir); $PULSAR_LIFECYCLE_CLIENT_LOG picks another file.
    route_client_log(default_client_log())
    # SIGTERM unwinds like Ctrl-C, so every command's finally blocks close producers, consumers
    # and the client in order (localrun installs its own handler for a graceful stop).
    signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _user_config(raw: Optional[str]) -> Optional[Dict[str, Any]]:
    if raw is None:
        return None
    try:
        return user_config_from_json(raw)
    except ConfigError as exc:
        raise click.BadParameter(str(exc).replace("--user-config ", "", 1), param_hint="--user-config") from exc


@main.command()
@click.option("--function-config-file", "--functionConfigFile", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="Function config YAML, as for pulsar-admin functions create/localrun.")
@click.option("--broker-service-url", default=None, help="pulsar:// URL; omitted = start the embedded pulsar-lite broker.")
@click.option("--state-storage-service-url", "--stateStorageServiceUrl", default=None,
              help="bk://host:4181 for BookKeeper's table service; omitted = durable local directory store.")
@click.option("--user-config", default=None, help="JSON object replacing the config's userConfig.")
@click.option("--parallelism", type=int, default=None)
@click.option("--tenant", default=None)
@click.option("--namespace", default=None)
@click.option("--name", default=None)
@click.option("--classname", "--className", "class_name", default=None)
@click.option("-i", "--inputs", default=None, help="Comma-separated input topics.")
@click.option("-o", "--output", default=None)
@click.option("--subs-name", default=None)
@click.option("--subs-position", type=click.Choice(["Latest", "Earliest"]), default=None)
@click.option("--processing-guarantees", type=click.Choice(["ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL"]), default=None)
@click.option("--auto-ack", type=bool, default=None)
@click.option("--timeout-ms", type=int, default=None)
@click.option("--client-auth-plugin", default=None)
@click.option("--client-auth-params", default=None)
@click.option("--use-tls", type=bool, default=False)
@click.option("--tls-allow-insecure", type=bool, default=False)
@click.option("--hostname-verification-enabled", type=bool, default=False)
@click.option("--tls-trust-cert-path", default=None)
@click.option("--instance-id-offset", type=int, default=0)
@click.option("--num-instances", type=int, default=None,
              help="Instances of the function in all processes (get_num_instances); default offset + parallelism.")
@click.option("--metrics-port-start", "metrics_port", type=int, default=None,
              help="Serve Prometheus metrics on 127.0.0.1:PORT (0 = any free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=".pulsar-lifecycle", show_default=True,
              callback=absolute_path, help="Embedded broker data and local function state; kept across restarts.")
@click.option("--embedded-broker-port", type=int, default=0,
              help="Port of the embedded broker (0 = the one this --data-dir last ran on, else a free one).")
@click.option("--run-seconds", type=float, default=None, help="Stop by itself after this long (for scripts).")
def localrun(config_file: Optional[str], broker_service_url: Optional[str], state_storage_service_url: Optional[str],
             user_config: Optional[str], parallelism: Optional[int], tenant: Optional[str], namespace: Optional[str],
             name: Optional[str], class_name: Optional[str], inputs: Optional[str], output: Optional[str],
             subs_name: Optional[str], subs_position: Optional[str], processing_guarantees: Optional[str],
             auto_ack: Optional[bool], timeout_ms: Optional[int], client_auth_plugin: Optional[str],
             client_auth_params: Optional[str], use_tls: bool, tls_allow_insecure: bool,
             hostname_verification_enabled: bool, tls_trust_cert_path: Optional[str], instance_id_offset: int,
             num_instances: Optional[int], metrics_port: Optional[int], data_dir: str, embedded_broker_port: int, run_seconds: Optional[float]) -> None:
    """Run a function locally, like `pulsar-admin functions localrun`."""
    from ..config.function_config import FunctionConfigError, load_function_config, merged_config, spec_from_config
    from ..config.validate import function_problems
    from ..runtime.client import ClientSettings
    from ..runtime.localrun import LocalRunner, LocalRunOptions
    from .function_registry import FUNCTION_CHECKS, USER_CONFIG_KEYS

    log = logging.getLogger("pulsar_lifecycle.localrun")
    try:
        cfg = load_function_config(config_file) if config_file else {}
        overrides = {
            "tenant": tenant, "namespace": namespace, "name": name, "className": class_name,
            "inputs": inputs.split(",") if inputs else None, "output": output, "subName": subs_name,
            "subscriptionPosition": subs_position, "processingGuarantees": processing_guarantees,
            "autoAck": auto_ack, "timeoutMs": timeout_ms, "parallelism": parallelism,
            "userConfig": _user_config(user_config),
        }
        spec = spec_from_config(cfg, overrides)
        problems = function_problems(merged_config(cfg, overrides), config_file or "command line",
                                     USER_CONFIG_KEYS, FUNCTION_CHECKS)
    except FunctionConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if problems:
        # The function would refuse these at start or misbehave with them; say so before anything starts.
        raise click.ClickException("\n".join([*problems, f"{len(problems)} problem(s): nothing started "
                                               "(`pulsar-lifecycle validate` checks a config file)"]))
    opts = LocalRunOptions(
        broker_service_url=broker_service_url, state_storage_service_url=state_storage_service_url,
        client=ClientSettings(broker_service_url or "", client_auth_plugin, client_auth_params, use_tls,
                              tls_allow_insecure, hostname_verification_enabled, tls_trust_cert_path),
        data_dir=Path(data_dir), metrics_port=metrics_port, embedded_broker_port=embedded_broker_port,
        instance_id_offset=instance_id_offset, num_instances=num_instances,
    )
    rotation = ClientLogRotation(Path(route_client_log(Path(data_dir) / "pulsar-client.log"))).start()
    runner = LocalRunner(spec, opts)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("event=signal_received signal=%d", signum)
        runner._stop.set()

    # The graceful handler is in place before the start: a SIGTERM while the broker and the
    # instances start (seconds on a loaded machine) lets the start finish and then stops in
    # order, instead of unwinding out of it with the broker and clients still open.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        runner.start()
    except Exception as exc:
        runner.stop()  # whatever started (broker, clients) is closed in order before exiting
        log.debug("localrun start failed", exc_info=True)
        raise click.ClickException(f"cannot start {spec.fqfn}: {one_line_error(exc)}") from exc
    if not runner._stop.is_set():
        click.echo(f"running {spec.fqfn} ({spec.class_name}) on {runner.service_url}; Ctrl-C stops", err=True)
    runner.wait(run_seconds)
    runner.stop()
    rotation.stop()


@main.command()
@click.option("--target", type=click.Choice(["cluster", "localrun"]), default="cluster", show_default=True,
              help="Where the configs will run: cluster = pulsar-admin functions create under Pulsar's Python "
                   "runtime (workers with function state); localrun = pulsar-lifecycle localrun.")
@click.option("--system", is_flag=True,
              help="Also check that the configs join up as one system: every topic a function writes is read by "
                   "one of them (outputs and dead letters excepted), every delayed message reaches a writer that "
                   "accepts its target, no two share a name, and the delay-level topics producers use have a syncer.")
@click.option("--delay-level-topic", "delay_level_topics", multiple=True,
              help="With --system: a delay-level topic your producers park on, which needs a syncer in the set "
                   "(repeatable; DelayLevelProducer's default is checked in every set with a syncer).")
@click.argument("files", nargs=-1, required=True, type=click.Path())
def validate(target: str, system: bool, delay_level_topics: Tuple[str, ...], files: Tuple[str, ...]) -> None:
    """Check function-config YAMLs for where they will run (exit 1 on problems): by default as
    pulsar-admin functions create accepts and Pulsar's Python runtime starts them; with --system
    also as one set (a directory means its *.yaml files)."""
    from ..config.validate import validate_each
    from .function_registry import FUNCTION_CHECKS, TARGET_CHECKS, USER_CONFIG_KEYS

    results = validate_each(list(files), user_config_keys=USER_CONFIG_KEYS, function_checks=FUNCTION_CHECKS,
                            target=target, target_checks=TARGET_CHECKS)
    bad = 0
    for name, problems in results:
        if problems:
            bad += 1
            for line in problems:
                click.echo(line, err=True)
        else:
            click.echo(f"OK: {name}")
    dead_ends = _system_dead_ends(files, delay_level_topics) if system else []
    for line in dead_ends:
        click.echo(f"dead end: {line}", err=True)
    if bad or dead_ends:
        if bad:
            click.echo(f"{bad} of {len(results)} file(s) have problems", err=True)
        if dead_ends:
            click.echo(f"{len(dead_ends)} dead end(s) in the set", err=True)
        sys.exit(1)
    click.echo(f"OK: {len(results)} file(s) checked for {target}" + (", and they join up as one system" if system else ""))


def _system_dead_ends(files: Tuple[str, ...], delay_level_topics: Tuple[str, ...]) -> List[str]:
    """`validate --system`'s findings (config/system.py), with the delay-level topics producers use."""
    from ..config.validate import system_check
    from ..delaylevel.rule import DEFAULT_DELAY_LEVEL_TOPIC
    from .args import check_topic
    from .function_registry import topology_of

    parked = [(check_topic("--delay-level-topic", t), "--delay-level-topic") for t in delay_level_topics]
    return system_check(list(files), topology_of, parked, [(DEFAULT_DELAY_LEVEL_TOPIC, "DelayLevelProducer's default")])


@main.command()
@click.option("--project-dir", type=click.Path(file_okay=False, exists=True), default=".", show_default=True)
@click.option("--out-dir", type=click.Path(file_okay=False), default="dist", show_default=True)
@click.option("--stem", default="pulsar-lifecycle", show_default=True, help="Zip name = top-level folder name.")
@click.option("--python-version", default=None, help="Worker's Python, e.g. 3.11 (default: this interpreter's).")
@click.option("--platform", "platform_tag", default=None, help="Worker's wheel platform, e.g. manylinux2014_x86_64.")
@click.option("--exclude", multiple=True, help="Distribution to leave out of deps/ (e.g. pulsar-client).")
@click.option("--wheel/--no-wheel", default=True, show_default=True, help="Also build the project wheel.")
def package(project_dir: str, out_dir: str, stem: str, python_version: Optional[str], platform_tag: Optional[str],
            exclude: Tuple[str, ...], wheel: bool) -> None:
    """Build the zip `pulsar-admin functions create --py` takes (and a wheel)."""
    from ..packaging.zip_builder import build_function_zip, build_wheel

    zpath = build_function_zip(Path(project_dir), Path(out_dir), stem=stem, python_version=python_version,
                               platform=platform_tag, exclude=exclude)
    click.echo(f"zip: {zpath}")
    if wheel:
        click.echo(f"wheel: {build_wheel(Path(project_dir), Path(out_dir))}")


@main.command("send-ticks")
@click.option("--service-url", required=True, default=conf_default("brokerServiceUrl"),
              help="pulsar:// or pulsar+ssl:// URL of the cluster [default: brokerServiceUrl of the client.conf].")
@click.option("--tick-topic", required=True, help="The writer's userConfig tickTopic.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Ticks to send [default: 2 x --instances]: extras are acked by the instances.")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
              help="The writer's parallelism.")
@connect_timeout_option
@client_options
def send_ticks(service_url: str, tick_topic: str, count: Optional[int], instances: int,
               connect_timeout: Optional[float]) -> None:
    """Start a deployed writer whose only input is its tick topic (a partitioned writer).

    Pulsar calls a function only when a message arrives; after `functions create` (or a
    parallelism change) each instance needs one tick to start, then it keeps its own.

    Example: pulsar-lifecycle send-ticks --service-url pulsar://broker:6650
    --tick-topic persistent://public/default/delayed-ticks --instances 4
    """
    from ..runtime.connect import open_client
    from ..scheduler.wake import send_start_ticks
    from .args import check_topic
    from .client_options import client_settings

    check_topic("--tick-topic", tick_topic)  # before connecting: a typo fails at once
    client = open_client(client_settings(service_url), connect_timeout)
    try:
        sent = send_start_ticks(client, tick_topic, count or 2 * instances)
    finally:
        client.close()
    click.echo(f"sent {sent} tick(s) to {tick_topic}")


if __name__ == "__main__":  # pragma: no cover
    main()
