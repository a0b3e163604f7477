"""What the functions need from Pulsar's Python Context beyond the classic API, checked once.

`get_pulsar_client()` came to Pulsar's Python ContextImpl with apache/pulsar#18739 (merged
2022-12, first released in Pulsar 3.0.0); older runtimes' contexts lack it. The writer, the
deletion worker and the delay-level syncer open consumers and producers of their own through it,
so on an older runtime they stop with an error naming the version instead of an AttributeError.
"""
from __future__ import annotations

from typing import Any

from ..exceptions import PulsarLifecycleError

MIN_PULSAR_VERSION = "3.0.0"


class UnsupportedRuntimeError(PulsarLifecycleError, RuntimeError):
    """The Pulsar Functions runtime is older than the package needs."""


def pulsar_client(context: Any) -> Any:
    """`context.get_pulsar_client()`, or UnsupportedRuntimeError naming the minimum Pulsar version."""
    get = getattr(context, "get_pulsar_client", None)
    if not callable(get):
        raise UnsupportedRuntimeError(
            f"this Pulsar Functions runtime's Python context has no get_pulsar_client() "
            f"(context type {type(context).__name__}); pulsar-lifecycle needs Pulsar {MIN_PULSAR_VERSION} or newer "
            f"(apache/pulsar#18739), or run it with `pulsar-lifecycle localrun`")
    return get()


def instance_count(context: Any, configured: int = 1) -> int:
    """How many instances of this function run (its `parallelism`).

    Pulsar's Java Context has `getNumInstances()`; its Python ContextImpl has no such method but
    keeps the FunctionDetails (`instance_config.function_details.parallelism`). So: the context's
    `get_num_instances()` where it exists, else the FunctionDetails' parallelism, else
    `configured` (a userConfig fallback for runtimes that expose neither)."""
    get = getattr(context, "get_num_instances", None)
    if callable(get):
        return int(get())
    details = getattr(getattr(context, "instance_config", None), "function_details", None)
    parallelism = int(getattr(details, "parallelism", 0) or 0)
    return parallelism if parallelism > 0 else configured
