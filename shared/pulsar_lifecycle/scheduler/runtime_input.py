"""`RuntimeInput`: with direct intake, the runtime's own consumer of the scheduling topic only starts the writer.

The shipped config makes the scheduling topic an input (receiver queue 1, on the direct-intake
consumer's subscription) so that its first message calls process(), which builds the service: a
fresh deployment starts with no operator action. Left running, that consumer keeps taking
messages: a Shared subscription dispatches whole batch entries (up to 1,000 messages) even to a
consumer with one permit, and each of those then goes through process() one at a time, the
runtime's queue of one, at about the cost of an identity function. In the writer throughput
benchmark it took 51-81 % of the messages (docs/benchmarks.md).

So once the service runs, the first scheduling message that reaches process() pauses that
consumer's listener (`pause_message_listener`: it sends no more permits, so the broker
dispatches nothing more to it) and hands back what it has prefetched
(`redeliver_unacknowledged_messages`: in a Shared subscription the broker redelivers them to the
subscription's other consumers, i.e. the direct one). What process() still receives is queued as
before and acked once durable; a message that arrives on both ways is indexed once (the index
drops duplicates by position). A race can let one more entry reach the paused consumer after the
hand-back, so the direct consumer's stall watchdog calls `hand_back` again before it
re-subscribes (it fires when the topic holds messages beyond the last one it received).

Pulsar's Python Context has no public pause; the runtime's ContextImpl keeps its input consumers
in `context.consumers` (topic -> pulsar.Consumer; `ack` uses it), as does the local runner.
Where that is missing or a call fails, nothing is paused: the writer works as before, slower,
and says so once in the log.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from ..dedup.publisher import normalize_topic

log = logging.getLogger(__name__)


class RuntimeInput:
    """The runtime's consumer of the scheduling topic, found through the function's Context."""

    def __init__(self, context: Any, topic: str) -> None:
        self._context = context
        self.topic = normalize_topic(topic)
        self._consumer: Any = None
        self.paused = False
        self._given_up = False  # pausing failed once: never tried again (and logged once)

    @classmethod
    def of_input(cls, context: Any, topic: str) -> Optional["RuntimeInput"]:
        """A RuntimeInput when `topic` is one of the function's inputs, else None."""
        try:
            inputs = [normalize_topic(t) for t in (context.get_input_topics() or [])]
        except Exception as exc:  # a Context without it: no input to pause
            log.debug("event=runtime_inputs_unknown error=%r", exc)
            return None
        return cls(context, topic) if normalize_topic(topic) in inputs else None

    def _find(self) -> Optional[Any]:
        consumers = getattr(self._context, "consumers", None)
        if not isinstance(consumers, Mapping):
            return None
        for name, consumer in consumers.items():
            if isinstance(name, str) and normalize_topic(name) == self.topic:
                return consumer
        return None

    def pause(self) -> bool:
        """Pause the runtime's consumer of the scheduling topic and hand back what it prefetched
        (once; later calls return at once). False where it cannot be done."""
        if self.paused or self._given_up:
            return self.paused
        consumer = self._find()
        try:
            if consumer is None:
                raise LookupError("the Context exposes no consumer of the scheduling topic (context.consumers)")
            consumer.pause_message_listener()
            consumer.redeliver_unacknowledged_messages()
        except Exception as exc:  # an internal of the runtime: any failure means "not paused"
            self._given_up = True
            log.warning("event=runtime_input_not_paused topic=%s error=%r hint='the runtime keeps handing "
                        "scheduling messages to process() one at a time (correct, slower)'", self.topic, exc)
            return False
        self._consumer = consumer
        self.paused = True
        log.info("event=runtime_input_paused topic=%s reason='direct intake consumes the scheduling topic'", self.topic)
        return True

    def hand_back(self) -> None:
        """Redeliver whatever the paused consumer still holds (an entry dispatched to it in the
        moment it was paused) to the subscription's other consumers."""
        if self._consumer is None:
            return
        try:
            self._consumer.redeliver_unacknowledged_messages()
            log.info("event=runtime_input_handed_back topic=%s", self.topic)
        except Exception as exc:  # best effort: the runtime's next start redelivers them anyway
            log.warning("event=runtime_input_hand_back_failed topic=%s error=%r", self.topic, exc)
