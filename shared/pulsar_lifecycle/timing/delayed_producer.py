"""The package's one time abstraction: send a message to be delivered later.

Two backends, chosen by configuration:
- ``broker``: the broker's own delayed delivery (``deliver_at``) — real Pulsar only.
- ``scheduler``: the package's BucketSnapshotWriter; the message goes to its scheduling topic
  carrying the deliver-at time and the real target, and is released there on time. This works
  on any broker, including the embedded one, which delivers ``deliver_at`` messages at once.

Partitioned topics (a partitioned writer's scheduling topic; with the broker backend, a
partitioned business topic): a keyed message goes to the partition of its key as a Java producer
with the default `JavaStringHash` picks it (`keyHashing`, dedup/partition_router.py), so every
producer of the system puts one key on one partition and its messages keep their order; an
unkeyed one goes round robin (one partition after the other). These producers are plain
producers, not de-duplicated: a message sent again is a new message with its own id, so no
unkeyed message has to land where an earlier attempt did. The partition count is the broker's
(pulsar-client routes through `message_router`, and finds partitions added later), or, with
`scheduling_partitions` > 0, that many partitions of the scheduling topic addressed by name
(`<topic>-partition-<k>`: how pulsar-lite, which has no partitioned topics, carries a partitioned
writer's input; and the count the writer reads, whatever the broker says). Either way the message
id carries the partition, so a cancel goes to the partition that holds the message.
"""
from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import pulsar

from ..clock import wall_clock_ms as now_ms
from ..dedup.partition_router import DEFAULT_KEY_HASHING, key_hasher
from ..pulsar_io.producers import ProducerPool
from ..scheduling_protocol import (
    CANCEL_PROP,
    DELIVER_AT_PROP,
    REPLY_TO_PROP,
    TARGET_PROP,
    MessageRef,
    cancel_reply_topic,
)
from ..topics import TopicName, partition_name

log = logging.getLogger(__name__)

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


def _with_partition(message_id: pulsar.MessageId, partition: int) -> pulsar.MessageId:
    """`message_id` carrying `partition` (a producer of one partition by name reports -1)."""
    if partition < 0 or message_id.partition() == partition:
        return message_id
    return pulsar.MessageId(partition, message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


@dataclass
class DelayedProducer:
    """Sends messages to be delivered at a given time through the configured backend.

    Args:
        client: the Pulsar client every producer is opened on (closed by its owner).
        backend: ``scheduler`` (the BucketSnapshotWriter, any broker) or ``broker`` (deliver_at).
        scheduling_topic: the writer's scheduling topic (scheduler backend): a topic, a
            partitioned topic, or one partition by name.
        scheduling_partitions: > 0: the scheduling topic's partitions are addressed by name,
            `<scheduling_topic>-partition-0` .. `-<n-1>` (the writer's `schedulingTopicPartitions`);
            0: the topic as the broker has it (partitioned or not).
        key_hashing: how a key picks its partition (`java_string`, Java's default, or
            `murmur3_32`); dedup/partition_router.py.
    """

    client: pulsar.Client
    backend: str = "scheduler"
    scheduling_topic: Optional[str] = None
    scheduling_partitions: int = 0
    key_hashing: str = DEFAULT_KEY_HASHING
    _pool: ProducerPool = field(init=False, repr=False)
    _key_hash: Callable[[str], int] = field(init=False, repr=False)
    _turn: Iterator[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown delay backend {self.backend!r}; expected one of {BACKENDS}")
        if self.backend == "scheduler" and not self.scheduling_topic:
            raise ValueError("the scheduler delay backend needs a scheduling_topic")
        if isinstance(self.scheduling_partitions, bool) or not isinstance(self.scheduling_partitions, int) \
                or self.scheduling_partitions < 0:
            raise ValueError(f"scheduling_partitions must be a count >= 0, got {self.scheduling_partitions!r}")
        if self.scheduling_partitions and self.scheduling_topic \
                and TopicName.from_client(self.scheduling_topic).partition_index >= 0:
            raise ValueError(f"scheduling_partitions={self.scheduling_partitions} needs the partitioned topic's "
                             f"name, not one partition ({self.scheduling_topic})")
        self._key_hash = key_hasher(self.key_hashing)  # RoutingError (a ValueError) names the choices
        self._turn = itertools.count()  # next() is atomic under the GIL: safe from several threads
        # Batching on: the scheduler indexes (entry, batch index), and the embedded broker
        # dispatches unbatched messages about 100x slower than batched ones. The router is used
        # only on a partitioned topic (pulsar-client calls it with the partition count).
        self._pool = ProducerPool(self.client, batching_enabled=True, batching_max_publish_delay_ms=5,
                                  block_if_queue_full=True, message_router=self.choose_partition)

    def choose_partition(self, msg: Any, num_partitions: int) -> int:
        """The partition of a message (a `message_router` for pulsar-client): a keyed one by its
        key's hash (`key_hashing`), an unkeyed one round robin."""
        key = msg.partition_key() if hasattr(msg, "partition_key") else None
        return self._partition_of(key or None, num_partitions)

    def _partition_of(self, key: Optional[str], partitions: int) -> int:
        if key:
            return self._key_hash(key) % partitions
        return next(self._turn) % partitions

    def _producer(self, topic: str) -> pulsar.Producer:
        return self._pool.get(topic)

    def _destination(self, topic: str, key: Optional[str]) -> Tuple[str, int]:
        """(topic to publish to, partition by name or -1): a partition of the scheduling topic
        when its partitions are addressed by name, else `topic` itself."""
        if self.scheduling_partitions and topic == self.scheduling_topic:
            k = self._partition_of(key, self.scheduling_partitions)
            return partition_name(topic, k), k
        return topic, -1

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
        """Deliver `payload` to `topic` no earlier than `deliver_at_ms`; returns the sent message id
        (its partition() is the partition it went to on a partitioned topic)."""
        dest, props, kwargs = self._prepare(topic, deliver_at_ms, properties, key, event_timestamp)
        dest, partition = self._destination(dest, key)
        return _with_partition(self._producer(dest).send(payload, properties=props, **kwargs), partition)

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
        dest, partition = self._destination(dest, key)
        done = callback
        if partition >= 0:
            def done(res: pulsar.Result, mid: pulsar.MessageId) -> None:
                callback(res, _with_partition(mid, partition) if res == pulsar.Result.Ok else mid)
        self._producer(dest).send_async(payload, done, properties=props, **kwargs)

    def flush(self) -> None:
        """Wait until every message sent so far is confirmed or failed."""
        self._pool.flush()

    def send_after(self, topic: str, payload: bytes, delay_ms: int, **kw) -> pulsar.MessageId:
        """Like send(), with a delay relative to now."""
        delay = check_time_ms("delay_ms", delay_ms)
        return self.send(topic, payload, now_ms() + delay, **kw)

    def cancel_topic(self, message_id: pulsar.MessageId) -> str:
        """Where the cancel of `message_id` goes: the partition that holds the message (its id's
        partition) of a partitioned scheduling topic, else the scheduling topic itself. The
        partitions' writers are independent: a cancel on another partition would never find it."""
        if self.backend != "scheduler":
            raise ValueError("cancellation needs the scheduler backend; Pulsar's broker cannot cancel (PR #23907)")
        assert self.scheduling_topic is not None
        partition = int(message_id.partition())
        if partition < 0 or TopicName.from_client(self.scheduling_topic).partition_index >= 0:
            return self.scheduling_topic
        if self.scheduling_partitions and partition >= self.scheduling_partitions:
            raise ValueError(f"message id names partition {partition}, the scheduling topic {self.scheduling_topic} "
                             f"has {self.scheduling_partitions}")
        return partition_name(self.scheduling_topic, partition)

    def cancel_reply_topic(self, message_id: pulsar.MessageId) -> str:
        """The topic the writer answers the cancel of `message_id` on (`reply_to` of cancel())."""
        return cancel_reply_topic(TopicName.from_client(self.cancel_topic(message_id)).full_name)

    def cancel(self, message_id: pulsar.MessageId, reply_to: Optional[str] = None) -> pulsar.MessageId:
        """Ask the scheduler to drop a not-yet-released message (scheduler backend only); returns
        the cancel message's own id. The cancel goes to cancel_topic(message_id), the partition
        holding the message on a partitioned scheduling topic. With `reply_to`
        (cancel_reply_topic(message_id)) the writer answers there with the outcome."""
        dest = self.cancel_topic(message_id)
        props = {CANCEL_PROP: MessageRef.of(message_id).format_cancel()}
        if reply_to:
            props[REPLY_TO_PROP] = reply_to
        log.debug("event=delayed_cancel_routed cancel=%s topic=%s", props[CANCEL_PROP], dest)
        return self._producer(dest).send(b"", properties=props)

    def close(self) -> None:
        """Flush and close every producer this object opened."""
        self._pool.close()
