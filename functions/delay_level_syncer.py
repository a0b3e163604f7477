"""DelayLevelSyncer: forwards messages parked in delay-level partitions to the near-term path
(the BucketSnapshotWriter's scheduling topic, or broker deliver_at) when they come close.

The function's only input is a tick topic: the Context exists only in process(), so a tick
starts the syncer. As the writer does (pulsar_lifecycle.scheduler.wake), each start sends one
wake tick and the function keeps exactly one tick unacked, which Pulsar redelivers to the next
instance after a restart; a failed service sends one tick after tickTimeMillis, whose arrival
rebuilds it. The syncer consumes the partitions itself through the runtime's client; see
pulsar_lifecycle.delaylevel and docs/delay-levels.md.
"""
from __future__ import annotations

from typing import Any, Optional

from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.delaylevel.wiring import build_syncer
from pulsar_lifecycle.runtime.context_api import num_instances, pulsar_client
from pulsar_lifecycle.scheduler.wake import WakeTicks, arm_wake, position_of


class DelayLevelSyncer:
    """Pulsar Function entry point; all the work is in pulsar_lifecycle.delaylevel."""

    def __init__(self) -> None:
        # Kept trivial: Pulsar's runtime silently changes mode if __init__ raises.
        self.service: Optional[DelayLevelSyncerService] = None
        self.wake = WakeTicks()

    def _ensure_service(self, context: Any) -> DelayLevelSyncerService:
        if self.service is not None and not self.service.healthy:
            context.get_logger().error("event=delay_level_syncer_restart reason=%r", self.service.failure_reason)
            self.service.stop()
            self.service = None
        if self.service is None:
            service = build_syncer(context)
            arm_wake(service, pulsar_client(context), service.cfg.tick_topic, service.cfg.tick_time_millis)
            self.service = service
        return self.service

    def process(self, input: Any, context: Any) -> None:  # noqa: A002 - Pulsar's parameter name
        service = self._ensure_service(context)
        msg_id = context.get_message_id()
        topic = context.get_current_message_topic_name()
        # One tick stays unacked; the others are acked, passed on first to a sibling instance
        # that may be starting again elsewhere without one (scheduler/wake.py).
        self.wake.on_tick(position_of(msg_id), context.get_message_properties() or {},
                          lambda: context.ack(msg_id, topic), client=pulsar_client(context),
                          tick_topic=service.cfg.tick_topic, delay_ms=service.cfg.tick_time_millis,
                          instances=num_instances(context))
        return None

    def close(self) -> None:
        """Stop the service threads (called by the local runner on shutdown)."""
        if self.service is not None:
            self.service.stop()
            self.service = None
