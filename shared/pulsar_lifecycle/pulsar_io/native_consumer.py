"""Receiving through pulsar-client's native consumer, where the client has one.

`pulsar.Consumer` wraps a native `_pulsar.Consumer` (`consumer._consumer`) and builds a Python
`pulsar.Message` around every message it returns. The native messages have the same accessors
(`data`, `properties`, `message_id`, `partition_key`, `event_timestamp`) without that wrapper and
without a Python frame per accessor, which matters on the per-message paths of the writer's
intake and the delay-level forwarders. They are acked through the public consumer's
`acknowledge`, which takes them as they are (and stays the seam tests patch). A consumer without
`_consumer` (another client layout, a test's consumer) is used through its public API.
"""
from __future__ import annotations

from typing import Any, List, Optional

import pulsar


def native_of(consumer: Any) -> Any:
    """The native consumer behind `consumer`, or None."""
    return getattr(consumer, "_consumer", None)


def receive(consumer: Any, timeout_ms: int) -> Optional[Any]:
    """One message, or None when none came within `timeout_ms`."""
    native = native_of(consumer)
    try:
        if native is not None:
            return native.receive(timeout_ms)
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


def batch_receive(consumer: Any) -> List[Any]:
    """What the consumer's batch receive policy returns (possibly nothing)."""
    native = native_of(consumer)
    if native is not None:
        return native.batch_receive()  # type: ignore[no-any-return]
    return consumer.batch_receive()  # type: ignore[no-any-return]
