"""`DelayLevelProducer`: the seed's enableDelayLevelTopic / delayLevelTopic /
delayLevelTopicPartitionStrategy over a pulsar.Client.

A delay shorter than one unit (or a deliver-at already past) goes straight to the near-term path
(`timing.DelayedProducer`: the writer's scheduling topic, or broker deliver_at on a real Pulsar);
a longer one is parked in its delay-level partition, addressed by name. A delay above the
strategy's maximum raises DelayTooLongError: nothing is silently dropped or clamped.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple

import pulsar

from ..pulsar_io.producers import ProducerPool
from ..scheduling_protocol import CANCEL_PROP, DELIVER_AT_PROP, TARGET_PROP, TICK_PROP, format_message_ref
from ..timing.delayed_producer import DelayedProducer, now_ms
from .rule import (
    BASE_PROP,
    CANCEL_PARTITION_PROP,
    LEVEL_PROP,
    cancel_topic,
    default_delay_level_topic,
    partition_topic,
    tick_topic,
)
from .strategy import DelayLevelTopicPartitionStrategy

__all__ = ["DelayLevelMessageId", "DelayLevelProducer", "SendCallback"]

log = logging.getLogger(__name__)

_RESERVED = (DELIVER_AT_PROP, TARGET_PROP, BASE_PROP, LEVEL_PROP)
# Messages per batch (one broker entry). Keep it at most half the syncer's receiverQueueSize (200):
# pulsar-lite dispatches whole entries against a consumer's permits and keeps a killed consumer's
# negative permit balance in the subscription's total, so an entry larger than that lets a crashed
# syncer's successor receive nothing on the partition (docs/delay-levels.md, "Lateness after a
# crash"). Apache Pulsar has no deficit (tests/integration/test_broker_quirks.py) and 100 costs
# nothing measurable on either broker (bench/bench_delay_level_batch_cap.py).
DEFAULT_BATCH_MAX_MESSAGES = 100


@dataclass(frozen=True)
class DelayLevelMessageId:
    """Where a message went: a delay-level partition (`partition` >= 0) or the near-term path."""

    topic: str
    partition: Optional[int]
    message_id: pulsar.MessageId

    @property
    def parked(self) -> bool:
        """True when the message sits in a delay-level partition."""
        return self.partition is not None


SendCallback = Callable[[pulsar.Result, Optional[DelayLevelMessageId]], None]


class DelayLevelProducer:
    """Sends delayed messages for one business topic, parking long delays in delay-level partitions.

    Args:
        client: the pulsar.Client to produce with.
        topic: the business topic (where the message is finally delivered).
        near_term: the near-term path (DelayedProducer, scheduler or broker backend).
        strategy: partitioning of the delay-level topic (the seed's defaults: 30 days, DAY).
        delay_level_topic: its name; default the shared DEFAULT_DELAY_LEVEL_TOPIC
            (`persistent://public/default/delay-level`), which the shipped syncer serves; every
            parked message carries `topic` in `__pl_target__`, and the syncer forwards it there.
        enabled: the seed's enableDelayLevelTopic; False sends every message on the near-term path.
        clock: ms since the epoch (the producer's clock; recorded on each parked message).
        batching_max_messages: messages per batch, at most half the syncer's receiverQueueSize
            (DEFAULT_BATCH_MAX_MESSAGES says why).
        wake_syncer: send one tick to `<delay-level topic>-TICK` before the first parked message,
            which starts a syncer in `hold` mode whose input is that topic (the shipped config).
    """

    def __init__(self, client: pulsar.Client, topic: str, near_term: DelayedProducer, *,
                 strategy: Optional[DelayLevelTopicPartitionStrategy] = None,
                 delay_level_topic: Optional[str] = None, enabled: bool = True,
                 clock: Callable[[], int] = now_ms, batching_max_publish_delay_ms: int = 5,
                 max_pending_messages: int = 1000, batching_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
                 wake_syncer: bool = True) -> None:
        if not topic:
            raise ValueError("DelayLevelProducer needs the business topic")
        self.client = client
        self.topic = topic
        self.near_term = near_term
        self.strategy = strategy or DelayLevelTopicPartitionStrategy()
        self.delay_level_topic = delay_level_topic or default_delay_level_topic()
        self.enabled = enabled
        self.clock = clock
        if batching_max_messages < 2:
            raise ValueError(f"batching_max_messages must be >= 2 (pulsar-client's minimum), got {batching_max_messages}")
        self._wake = wake_syncer  # one tick to tick_topic() before the first parked message or cancel
        # Batched like the writer's producers: pulsar-lite dispatches unbatched messages about 100x
        # more slowly, and the syncer's sequence ids include the batch index. At most
        # DEFAULT_BATCH_MAX_MESSAGES per batch (see there): a bigger entry can stall a restarted
        # syncer's partition on pulsar-lite.
        self._producers = ProducerPool(client, batching_enabled=True, block_if_queue_full=True,
                                       batching_max_publish_delay_ms=batching_max_publish_delay_ms,
                                       batching_max_messages=batching_max_messages,
                                       max_pending_messages=max_pending_messages)
        self._ticks = ProducerPool(client, batching_enabled=False)
        self._lock = threading.Lock()

    def _producer(self, topic: str) -> pulsar.Producer:
        with self._lock:
            if self._wake:
                # The syncer's input in `hold` mode: this tick starts a fresh deployment (extra
                # ticks are acked by the syncer). Sent once per producer object, before the
                # first parked message, without waiting for it.
                self._wake = False
                # Once per producer: where parked messages wait, which a syncer must serve
                # (`inspect syncer` names the topic it serves).
                log.info("event=delay_level_parking delay_level_topic=%s business_topic=%s hint='forwarded by the "
                         "DelayLevelSyncer whose delayLevelTopic is this topic'", self.delay_level_topic, self.topic)
                ticks = self._ticks.get(tick_topic(self.delay_level_topic))
                ticks.send_async(b"tick", None, properties={TICK_PROP: str(self.clock())})
        return self._producers.get(topic)

    def _route(self, deliver_at_ms: Optional[int], delay_ms: Optional[int]) -> Tuple[int, int, Optional[int]]:
        """(deliver-at, now, partition or None)."""
        if (deliver_at_ms is None) == (delay_ms is None):
            raise ValueError("give exactly one of deliver_at_ms and delay_ms")
        now = self.clock()
        if delay_ms is not None:
            if delay_ms < 0:
                raise ValueError(f"delay must not be negative, got {delay_ms} ms")
            deliver_at_ms = now + int(delay_ms)
        assert deliver_at_ms is not None
        if deliver_at_ms < 0:
            raise ValueError(f"deliver-at time must not be negative, got {deliver_at_ms}")
        # A deliver-at in the past is delivered now: delay 0, near-term path.
        partition = self.strategy.partition_for(max(0, deliver_at_ms - now)) if self.enabled else None
        return int(deliver_at_ms), now, partition

    def _parked_props(self, properties: Optional[Mapping[str, str]], deliver_at: int, now: int, k: int) -> Dict[str, str]:
        props = dict(properties or {})
        for name in _RESERVED:
            if name in props:
                raise ValueError(f"message property {name!r} is reserved for delay-level topics")
        props.update({DELIVER_AT_PROP: str(deliver_at), TARGET_PROP: self.topic, BASE_PROP: str(now), LEVEL_PROP: str(k)})
        return props

    def send(self, payload: bytes, *, deliver_at_ms: Optional[int] = None, delay_ms: Optional[int] = None,
             properties: Optional[Mapping[str, str]] = None, key: Optional[str] = None,
             event_timestamp: Optional[int] = None) -> DelayLevelMessageId:
        """Send and wait for the broker; returns where the message went."""
        deliver_at, now, k = self._route(deliver_at_ms, delay_ms)
        if k is None:
            mid = self.near_term.send(self.topic, payload, deliver_at, properties, key, event_timestamp)
            return DelayLevelMessageId(self._near_term_topic(), None, mid)
        dest = partition_topic(self.delay_level_topic, k)
        kwargs = self._kwargs(key, event_timestamp)
        mid = self._producer(dest).send(payload, properties=self._parked_props(properties, deliver_at, now, k), **kwargs)
        return DelayLevelMessageId(dest, k, mid)

    def send_async(self, payload: bytes, callback: SendCallback, *, deliver_at_ms: Optional[int] = None,
                   delay_ms: Optional[int] = None, properties: Optional[Mapping[str, str]] = None,
                   key: Optional[str] = None, event_timestamp: Optional[int] = None) -> None:
        """Send without waiting; `callback(result, DelayLevelMessageId or None)` runs on the client's
        thread. Routing errors (delay too long, bad arguments) raise here, before anything is sent."""
        deliver_at, now, k = self._route(deliver_at_ms, delay_ms)
        if k is None:
            dest = self._near_term_topic()

            def near(res: pulsar.Result, mid: pulsar.MessageId) -> None:
                callback(res, DelayLevelMessageId(dest, None, mid) if res == pulsar.Result.Ok else None)
            self.near_term.send_async(self.topic, payload, deliver_at, near, properties, key, event_timestamp)
            return
        part = partition_topic(self.delay_level_topic, k)

        def parked(res: pulsar.Result, mid: pulsar.MessageId) -> None:
            callback(res, DelayLevelMessageId(part, k, mid) if res == pulsar.Result.Ok else None)
        self._producer(part).send_async(payload, parked, properties=self._parked_props(properties, deliver_at, now, k),
                                        **self._kwargs(key, event_timestamp))

    def cancel(self, sent: DelayLevelMessageId) -> pulsar.MessageId:
        """Cancel a message sent by this producer. A parked message is cancelled through the
        syncer (`<delay-level topic>-CANCEL`), which drops it when it reaches the head of its
        partition; a near-term one through the writer's tombstone (scheduler backend)."""
        if not sent.parked:
            return self.near_term.cancel(sent.message_id)
        mid = sent.message_id
        ref = format_message_ref(mid.ledger_id(), mid.entry_id(), mid.batch_index())
        return self._producer(cancel_topic(self.delay_level_topic)).send(
            b"", properties={CANCEL_PROP: ref, CANCEL_PARTITION_PROP: str(sent.partition)})

    def _near_term_topic(self) -> str:
        if self.near_term.backend == "scheduler" and self.near_term.scheduling_topic:
            return self.near_term.scheduling_topic
        return self.topic

    @staticmethod
    def _kwargs(key: Optional[str], event_timestamp: Optional[int]) -> Dict[str, object]:
        out: Dict[str, object] = {}
        if key is not None:
            out["partition_key"] = key
        if event_timestamp:
            out["event_timestamp"] = int(event_timestamp)
        return out

    def flush(self) -> None:
        """Wait until every message sent so far is confirmed or failed."""
        self._ticks.flush()
        self._producers.flush()
        self.near_term.flush()

    def close(self) -> None:
        """Flush and close the producers this object opened (not the near-term path's)."""
        self._ticks.close()
        self._producers.close()
