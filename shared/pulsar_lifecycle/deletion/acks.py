"""Settle an input message after process() returned: the worker acks a request once its outcome
is durable, from whichever thread finished it.

The config runs the worker with `processingGuarantees: MANUAL`, so the runtime acks nothing
itself. Acks go through `context.ack(msgid, topic)`, public in Pulsar's Python Context and in
the local runner's. Pulsar's Context has no nack; its ContextImpl keeps the input consumers in
`context.consumers` (topic -> pulsar.Consumer; `ack` uses it), as does the local runner, so a
nack goes to that consumer. Where it is missing the message stays unacked, and the input's ack
timeout (`timeoutMs`) or the next start redelivers it: later than a nack, never lost.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..topics import strip_partition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputMessage:
    """What the worker needs of one input message once process() has returned.

    The Context answers for the current message only, so process() takes everything here first.
    """

    payload: bytes
    properties: Mapping[str, str]
    topic: Optional[str]
    message_id: Any  # the runtime's message id, handed back to ack/nack as it came

    @property
    def id_text(self) -> str:
        """The message id as text (ORIGIN_MESSAGE_ID, log lines)."""
        return str(self.message_id) if self.message_id is not None else ""


def ack(context: Any, message: InputMessage) -> None:
    """Acknowledge `message` on its input; raises when the runtime refuses (the message then comes back)."""
    if message.topic is None or message.message_id is None:
        raise ValueError(f"cannot ack a message without topic and id (topic={message.topic} id={message.id_text})")
    context.ack(message.message_id, message.topic)


def nack(context: Any, message: InputMessage) -> bool:
    """Ask for `message` again now; False when the runtime's consumer cannot be found (the ack
    timeout or the next start redelivers it instead)."""
    consumers = getattr(context, "consumers", None)
    consumer = None
    if isinstance(consumers, Mapping) and message.topic is not None:
        consumer = consumers.get(message.topic) or consumers.get(strip_partition(message.topic))
    if consumer is None or message.message_id is None:
        log.warning("event=nack_unavailable topic=%s msg_id=%s hint='redelivered after the ack timeout or on restart'",
                    message.topic, message.id_text)
        return False
    try:
        consumer.negative_acknowledge(message.message_id)
    except Exception as exc:  # a closed consumer: the broker redelivers what it never saw acked
        log.warning("event=nack_failed topic=%s msg_id=%s error=%r", message.topic, message.id_text, exc)
        return False
    return True
