"""DelayLevelSyncer: forwards messages parked in delay-level partitions to the near-term path
(the BucketSnapshotWriter's scheduling topic, or broker deliver_at) when they come close.

The function's only input is a tick topic: ticks start the syncer (the Context exists only in
process()) and rebuild it after a failure. The syncer consumes the partitions itself through
`context.get_pulsar_client()`; see pulsar_lifecycle.delaylevel and docs/delay-levels.md.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Optional

from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.delaylevel.wiring import build_syncer
from pulsar_lifecycle.runtime.localrun import TICK_PROP


class DelayLevelSyncer:
    """Pulsar Function entry point; all the work is in pulsar_lifecycle.delaylevel."""

    def __init__(self) -> None:
        # Kept trivial: Pulsar's runtime silently changes mode if __init__ raises.
        self.service: Optional[DelayLevelSyncerService] = None

    def process(self, input: Any, context: Any) -> None:  # noqa: A002 - Pulsar's parameter name
        if self.service is not None and not self.service.healthy:
            context.get_logger().error("event=delay_level_syncer_restart reason=%r", self.service.failure_reason)
            self.service.stop()
            self.service = None
        if self.service is None:
            self.service = build_syncer(context)
        topic = context.get_current_message_topic_name()
        context.ack(context.get_message_id(), topic)
        cfg = self.service.cfg
        if cfg.tick_mode == "chain" and TICK_PROP in (context.get_message_properties() or {}):
            # Real Pulsar has no timer for functions: each tick schedules the next one.
            context.publish(topic, b"tick", properties={TICK_PROP: str(int(time.time() * 1000))},
                            message_conf={"deliver_after": timedelta(milliseconds=cfg.tick_time_millis)})
        return None

    def close(self) -> None:
        """Stop the service threads (called by the local runner on shutdown)."""
        if self.service is not None:
            self.service.stop()
            self.service = None
