"""`RuntimeInput`: with direct intake, the runtime's own consumer of the scheduling topic only starts the writer.

The shipped config makes the scheduling topic an input (receiver queue 1, on the direct-intake
consumer's subscription) so that its first message calls process(), which builds the service: a
fresh deployment starts with no operator action. Left running, that consumer keeps taking
messages: a Shared subscription dispatches whole batch entries (up to 1,000 messages) even to a
consumer with one permit, and each of those then goes through process() one at a time, the
runtime's queue of one, at about the cost of an identity function. In the writer throughput
benchmark it took 51-81 % of the messages (docs/benchmarks.md).

So the service closes that consumer when it starts (`SchedulerService.start`): after the index
recovered (a failed recovery leaves it open, and the runtime's redelivery of the message that
started the writer retries the start) and before the direct consumer subscribes. A closed
consumer holds nothing: the broker redelivers what it had dispatched to it and nobody acked (the
message that started the writer, the rest of its batch entry) to the subscription's other
consumers, the direct one included. A scheduling message that still reaches process() after the
close (the one that started the writer, or one in the runtime's queue of one) is neither queued
nor acked: the broker has it for the direct consumer.

Pausing it instead (`pause_message_listener` and `redeliver_unacknowledged_messages`, which
this module once did) leaves messages behind on any broker: the C++ client under Python's
runtime grants the broker a permit for each message as it takes it from its queue, before the
listener runs, so a consumer paused by the message that started the writer still has a permit,
and the next batch entry published after the hand-back is dispatched to it, where nothing acks,
nacks or redelivers it while the instance lives (scripts/repro/paused_runtime_input.py and
docs/architecture.md, "Runtime input", show it with message ids).

Pulsar's Python Context has no public way to close an input; the runtime's ContextImpl keeps its
input consumers in `context.consumers` (topic -> pulsar.Consumer; `ack` uses it), as does the
local runner. Where that is missing or the close fails, the input stays open: process() queues
what it receives and acks it once durable (correct, slower), and the writer says so once per
start. A consumer that is already closed (a service rebuilt in the same instance) counts as closed.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Mapping, Optional

import pulsar

from ..topics import normalize_topic

log = logging.getLogger(__name__)

# The runtime's consumers this module closed, for as long as the runtime keeps them.
_CLOSED: "weakref.WeakSet[Any]" = weakref.WeakSet()


class RuntimeInput:
    """The runtime's consumer of the scheduling topic, found through the function's Context."""

    def __init__(self, context: Any, topic: str) -> None:
        self._context = context
        self.topic = normalize_topic(topic)
        self.closed = False
        self._given_up = False  # closing failed once: not tried again by this start (and logged once)

    @classmethod
    def of_input(cls, context: Any, topic: str) -> Optional["RuntimeInput"]:
        """A RuntimeInput when `topic` is one of the function's inputs, else None."""
        try:
            inputs = [normalize_topic(t) for t in (context.get_input_topics() or [])]
        except Exception as exc:  # a Context without it: no input to close
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

    def close(self) -> bool:
        """Close the runtime's consumer of the scheduling topic: True once it is closed (also when
        an earlier start of this instance closed it), False where it cannot be."""
        if self.closed or self._given_up:
            return self.closed
        consumer = self._find()
        if consumer is not None and consumer in _CLOSED:
            # A service rebuilt in this instance: its predecessor closed the input (pulsar-client's
            # Python Consumer raises ValueError on a second close).
            self.closed = True
            return True
        try:
            if consumer is None:
                raise LookupError("the Context exposes no consumer of the scheduling topic (context.consumers)")
            consumer.close()
        except pulsar.AlreadyClosed:
            log.debug("event=runtime_input_already_closed topic=%s", self.topic)
        except Exception as exc:  # an internal of the runtime: any failure means "still open"
            self._given_up = True
            log.warning("event=runtime_input_not_closed topic=%s error=%r hint='the runtime keeps handing "
                        "scheduling messages to process() one at a time (correct, slower)'", self.topic, exc)
            return False
        else:
            log.info("event=runtime_input_closed topic=%s reason='direct intake consumes the scheduling topic'",
                     self.topic)
        _CLOSED.add(consumer)
        self.closed = True
        return True
