"""The package's one time abstraction: send a message to be delivered later.

Two backends, chosen by configuration:
- ``broker``: the broker's own delayed delivery (``deliver_at``) — real Pulsar only.
- ``scheduler``: the package's BucketSnapshotWriter; the message goes to its scheduling topic
  carrying the deliver-at time and the real target, and is released there on time. This works
  on any broker, including the embedded one, which delivers ``deliver_at`` messages at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import pulsar

from ..clock import wall_clock_ms as now_ms
from ..producers import ProducerPool
from ..scheduling_protocol import CANCEL_PROP, DELIVER_AT_PROP, REPLY_TO_PROP, TARGET_PROP, MessageRef

BACKENDS = ("broker", "scheduler")
MAX_TIME_MS = 2**63 - 1  # Pulsar's deliverAtTime is a Java long


def check_time_ms(name: str, value: Any) -> int:
    """`value` as whole milliseconds, or ValueError naming `name` and the value.

    Refuses bool, NaN, infinities and negatives (int(nan) would raise a message that names
    neither the argument nor the value); a fraction is rounded up, never early.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of milliseconds, got {type(value).__name__} {value!r}")
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError(f"{name} must be a number of milliseconds, got NaN")
        if math.isinf(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    out = math.ceil(value)
    if out < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    if out > MAX_TIME_MS:
        raise ValueError(f"{name} must be at most {MAX_TIME_MS} (int64), got {value!r}")
    return out


@dataclass
class DelayedProducer:
    """Sends messages to be delivered at a given time through the configured backend."""

    client: pulsar.Client
    backend: str = "scheduler"
    scheduling_topic: Optional[str] = None
    _pool: ProducerPool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown delay backend {self.backend!r}; expected one of {BACKENDS}")
        if self.backend == "scheduler" and not self.scheduling_topic:
            raise ValueError("the scheduler delay backend needs a scheduling_topic")
        # Batching on: the scheduler indexes (entry, batch index), and the embedded broker
        # dispatches unbatched messages about 100x slower than batched ones.
        self._pool = ProducerPool(self.client, batching_enabled=True, batching_max_publish_delay_ms=5,
                                  block_if_queue_full=True)

    def _producer(self, topic: str) -> pulsar.Producer:
        return self._pool.get(topic)

    def _prepare(self, topic: str, deliver_at_ms: int, properties: Optional[Mapping[str, str]], key: Optional[str],
                 event_timestamp: Optional[int]) -> Tuple[str, Dict[str, str], Dict[str, Any]]:
        """(topic to send to, properties, send kwargs) of one delayed message."""
        deliver_at_ms = check_time_ms("deliver_at_ms", deliver_at_ms)
        props = dict(properties or {})
        kwargs: Dict[str, Any] = {}
        if key is not None:
            kwargs["partition_key"] = key
        if event_timestamp:
            kwargs["event_timestamp"] = int(event_timestamp)
        if self.backend == "broker":
            kwargs["deliver_at"] = int(deliver_at_ms)
            return topic, props, kwargs
        props[DELIVER_AT_PROP] = str(int(deliver_at_ms))
        props[TARGET_PROP] = topic
        assert self.scheduling_topic is not None
        return self.scheduling_topic, props, kwargs

    def send(
        self,
        topic: str,
        payload: bytes,
        deliver_at_ms: int,
        properties: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        event_timestamp: Optional[int] = None,
    ) -> pulsar.MessageId:
        """Deliver `payload` to `topic` no earlier than `deliver_at_ms`; returns the sent message id."""
        dest, props, kwargs = self._prepare(topic, deliver_at_ms, properties, key, event_timestamp)
        return self._producer(dest).send(payload, properties=props, **kwargs)

    def send_async(
        self,
        topic: str,
        payload: bytes,
        deliver_at_ms: int,
        callback: Callable[[pulsar.Result, pulsar.MessageId], None],
        properties: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        event_timestamp: Optional[int] = None,
    ) -> None:
        """Like send(), without waiting: `callback(result, message_id)` runs on the client's thread."""
        dest, props, kwargs = self._prepare(topic, deliver_at_ms, properties, key, event_timestamp)
        self._producer(dest).send_async(payload, callback, properties=props, **kwargs)

    def flush(self) -> None:
        """Wait until every message sent so far is confirmed or failed."""
        self._pool.flush()

    def send_after(self, topic: str, payload: bytes, delay_ms: int, **kw) -> pulsar.MessageId:
        """Like send(), with a delay relative to now."""
        delay = check_time_ms("delay_ms", delay_ms)
        return self.send(topic, payload, now_ms() + delay, **kw)

    def cancel(self, message_id: pulsar.MessageId, reply_to: Optional[str] = None) -> pulsar.MessageId:
        """Ask the scheduler to drop a not-yet-released message (scheduler backend only); returns
        the cancel message's own id. With `reply_to` (cancel_reply_topic of the scheduling topic
        or partition the cancel goes to) the writer answers there with the outcome."""
        if self.backend != "scheduler":
            raise ValueError("cancellation needs the scheduler backend; Pulsar's broker cannot cancel (PR #23907)")
        assert self.scheduling_topic is not None
        props = {CANCEL_PROP: MessageRef.of(message_id).format_cancel()}
        if reply_to:
            props[REPLY_TO_PROP] = reply_to
        return self._producer(self.scheduling_topic).send(b"", properties=props)

    def close(self) -> None:
        """Flush and close every producer this object opened."""
        self._pool.close()
