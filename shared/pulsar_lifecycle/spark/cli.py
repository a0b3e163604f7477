"""`pulsar-lifecycle spark ...`: the offline pipeline's commands (PySpark, optional extra `spark`).

Each command is registered here by its own job package's cli module (seed, verify, orphans): importing this group
never imports PySpark, a command imports its job when it runs.
"""
from __future__ import annotations

import logging
import traceback
from typing import Any, Callable, Optional

import click

from .errors import SparkJobError, SparkSetupError
from .failures import cause_of, is_spark_failure
from .session import spark_log_path

log = logging.getLogger(__name__)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def spark() -> None:
    """Offline jobs on Spark: seed and verify bucket snapshots, audit orphan ledgers.

    Spark runs local[*] by default; `--master spark://host:7077` (or yarn, k8s://...) runs on a
    cluster, where the snapshot store must be reachable from every executor (see docs/spark.md).
    Needs Java 17+ and `pip install 'pulsar-lifecycle[spark]'`.
    """


def master_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--master`: the Spark master URL (default local[*]); `--shared-fs`: local paths are on a
    filesystem every executor mounts at the same path."""
    f = click.option("--shared-fs", is_flag=True,
                     help="With a remote --master: the local paths given are on a filesystem mounted at the same "
                          "path on every node (network filesystems such as NFS are recognised without it).")(f)
    return click.option("--master", default=None, metavar="URL",
                        help="Spark master: local[*] (default), local[N], local-cluster[N,cores,MB], "
                             "spark://host:7077, yarn, k8s://...")(f)


def writer_options(f):  # type: ignore[no-untyped-def]
    """--function-config-file / --user-config: the writer's settings (shared by seed and verify)."""
    f = click.option("--user-config", default=None, metavar="JSON",
                     help="userConfig keys overriding the config file's (e.g. bucket rules).")(f)
    f = click.option("--function-config-file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="The writer's function config YAML: bucket rules, scheduling topic and name.")(f)
    return f


def _log_failure(exc: BaseException) -> Optional[str]:
    """Append the whole failure (Python traceback, Java stack trace) to the Spark log file; its path."""
    try:
        path = spark_log_path()
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("pulsar-lifecycle: command failed\n")
            fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return str(path)
    except (OSError, SparkSetupError):  # the one-line error still reaches the operator
        log.debug("event=spark_log_unwritable", exc_info=True)
        return None


def run_job(fn: Callable[[], Any]) -> Any:
    """Run a job, turning setup, input and Spark failures into one `Error:` line (exit 1): the
    package's message, or what failed and the Java/Python exception's own message; the stack
    traces go to the Spark log file, which the line names."""
    try:
        return fn()
    except SparkSetupError as exc:
        raise click.ClickException(str(exc)) from exc
    except SparkJobError as exc:
        where = _log_failure(exc) if exc.__cause__ is not None and is_spark_failure(exc.__cause__) else None
        raise click.ClickException(str(exc) + (f" (stack traces: {where})" if where else "")) from exc
    except Exception as exc:
        if not is_spark_failure(exc):
            raise
        where = _log_failure(exc)
        raise click.ClickException(f"Spark job failed: {cause_of(exc)}"
                                   + (f" (stack traces: {where})" if where else "")) from exc


def register(command: click.Command, name: Optional[str] = None) -> None:
    """Add a subcommand to the `spark` group (used by the command modules)."""
    spark.add_command(command, name)


# Modules that define a command and call register() on import (no PySpark import at module level).
COMMAND_MODULES = (
    "pulsar_lifecycle.spark.seed.cli",
    "pulsar_lifecycle.spark.verify.cli",
    "pulsar_lifecycle.spark.orphans.cli",
)


def _load_commands() -> None:
    # A command module not written yet must not break the others.
    import importlib

    for module in COMMAND_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


_load_commands()
