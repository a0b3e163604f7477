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


def num_instances(context: Any) -> int:
    """How many instances of this function run (its `parallelism`).

    Java's Context has getNumInstances(); Python's declares no such method, but Pulsar's
    ContextImpl keeps `instance_config.function_details` (FunctionDetails.parallelism). The local
    runner's context has get_num_instances(). 1 when neither exists: callers that split work by
    it must stay safe when it is wrong (the writer's partition leases make a wrong count cost
    waiting, never two owners).
    """
    get = getattr(context, "get_num_instances", None)
    if callable(get):
        return max(1, int(get()))
    details = getattr(getattr(context, "instance_config", None), "function_details", None)
    parallelism = getattr(details, "parallelism", 0)
    return max(1, int(parallelism or 1))
