"""BucketSnapshotWriter: delayed delivery with a PIP-195 bucket index and snapshots.

Reads the scheduling topic (messages carry `__pl_deliver_at__`; see pulsar_lifecycle.timing
.DelayedProducer), makes each durable in the bucket index before acking it, and releases it to
the output topic at its time, exactly once (dedup publisher). Run with processingGuarantees
MANUAL: this function acks a source message only once its index entry is durable.

With userConfig `schedulingTopic` the service consumes the scheduling topic itself, in batches
(direct intake); the scheduling topic is also an input on the same subscription, so the first
message starts a fresh deployment; the service then closes that input, and a scheduling message
that still reaches process() is left unacked for the broker to redeliver to the direct consumer
(pulsar_lifecycle.scheduler.runtime_input). Without it, process() queues every scheduling
message. Ticks on `tickTopic` only wake the function after a restart: it keeps one unacked
(pulsar_lifecycle.scheduler.wake).
"""
from __future__ import annotations

from typing import Any, Optional

from pulsar_lifecycle.runtime.context_api import num_instances, pulsar_client
from pulsar_lifecycle.scheduler.intake import classify
from pulsar_lifecycle.scheduler.service import Pending, SchedulerService
from pulsar_lifecycle.scheduler.wake import WakeTicks, arm_wake, position_of
from pulsar_lifecycle.topics import normalize_topic


class BucketSnapshotWriter:
    """Pulsar Function entry point; all the work is in pulsar_lifecycle.scheduler."""

    def __init__(self) -> None:
        # Kept trivial: Pulsar's runtime silently changes mode if __init__ raises.
        self.service: Optional[SchedulerService] = None
        self.wake = WakeTicks()

    def _ensure_service(self, context: Any) -> SchedulerService:
        if self.service is not None and not self.service.healthy:
            context.get_logger().error("event=scheduler_restart reason=%r", self.service.failure)
            self.service.stop()
            self.service = None
        if self.service is None:
            from pulsar_lifecycle.scheduler.factory import build_service

            service = build_service(context)
            try:
                arm_wake(service, pulsar_client(context), service.config.tick_topic, service.config.tick_time_millis)
            except BaseException:
                # With the runtime's input closed, no redelivery of this message retries the start.
                if isinstance(service, SchedulerService):
                    service.wake_if_input_closed()
                raise
            self.service = service
        return self.service

    def process(self, input: Any, context: Any) -> None:  # noqa: A002 - Pulsar's parameter name
        service = self._ensure_service(context)
        topic = context.get_current_message_topic_name()
        msg_id = context.get_message_id()
        props = context.get_message_properties() or {}
        if service.config.tick_topic and normalize_topic(topic) == normalize_topic(service.config.tick_topic):
            # One tick stays unacked; every other one goes, passed on first when there are
            # siblings: it may be the wake tick of a sibling being started again elsewhere.
            self.wake.on_tick(position_of(msg_id), props, lambda: context.ack(msg_id, topic),
                              client=pulsar_client(context), tick_topic=service.config.tick_topic,
                              delay_ms=service.config.tick_time_millis, instances=num_instances(context))
            return None
        if isinstance(service, SchedulerService) and service.runtime_input_closed:
            # Direct intake: the message that started the service, or one still in the runtime's
            # queue when its consumer was closed. Neither queued nor acked: the broker redelivers
            # it to the direct consumer.
            return None
        from pulsar_lifecycle.scheduler.factory import target_check_of  # loaded by _ensure_service

        payload = input if isinstance(input, bytes) else str(input).encode("utf-8")
        item = classify(
            payload=payload, properties=props, key=context.get_message_key(),
            event_time=context.get_message_eventtime() or 0,
            position=(msg_id.ledger_id(), msg_id.entry_id(), msg_id.partition(), msg_id.batch_index()),
            now_ms=service.clock(), max_delay_ms=service.config.max_delay_seconds * 1000,
            allowed_target_prefixes=service.config.allowed_target_prefixes, target_check=target_check_of(service),
        )
        service.submit(Pending(item, lambda: context.ack(msg_id, topic), payload, dict(props)))
        return None

    def close(self) -> None:
        """Stop the service threads (called by the local runner on shutdown)."""
        if self.service is not None:
            self.service.stop()
            self.service = None
