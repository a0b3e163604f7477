"""`pulsar-lifecycle spark ...`: the offline pipeline's commands (PySpark, optional extra `spark`).

Each command is registered here by its own module (seed, verify, orphans): importing this group
never imports PySpark, a command imports its job when it runs.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import click

from .errors import SparkJobError, SparkSetupError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def spark() -> None:
    """Offline jobs on Spark: seed and verify bucket snapshots, audit orphan ledgers.

    Spark runs local[*] by default; `--master spark://host:7077` (or yarn, k8s://...) runs on a
    cluster, where the snapshot store must be reachable from every executor (see docs/spark.md).
    Needs Java 17+ and `pip install 'pulsar-lifecycle[spark]'`.
    """


def master_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--master`: the Spark master URL (default local[*])."""
    return click.option("--master", default=None, metavar="URL",
                        help="Spark master: local[*] (default), local[N], spark://host:7077, yarn, k8s://...")(f)


def run_job(fn: Callable[[], Any]) -> Any:
    """Run a job, turning setup and input errors into one clean CLI error (exit 1)."""
    try:
        return fn()
    except (SparkSetupError, SparkJobError) as exc:
        raise click.ClickException(str(exc)) from exc


def register(command: click.Command, name: Optional[str] = None) -> None:
    """Add a subcommand to the `spark` group (used by the command modules)."""
    spark.add_command(command, name)


# Modules that define a command and call register() on import (no PySpark import at module level).
COMMAND_MODULES = (
    "pulsar_lifecycle.spark.seed_cli",
    "pulsar_lifecycle.spark.verify_cli",
    "pulsar_lifecycle.spark.orphans_cli",
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
