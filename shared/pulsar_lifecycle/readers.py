"""Non-durable Readers from an entry of a topic: how this package reads what a consumer is not given.

Several parts read a topic beside their consumer: the writer's intake gaps, the syncer's gap
probe and gap read, the syncer's search for a forward, a resumed export, and `inspect`. They all
open a Reader at an entry (inclusive, so that the rest of a batch entry is read too), ask whether
the topic holds more, and close it without caring whether the close succeeds (a Reader's
subscription is its own: nothing waits on it).
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

import pulsar

log = logging.getLogger(__name__)

__all__ = ["Entry", "close_quietly", "has_more", "reader_at"]

Entry = Tuple[int, int]  # (ledger id, entry id)


def reader_at(client: "pulsar.Client", topic: str, entry: Optional[Entry], *, partition: int = -1,
              receiver_queue_size: int = 1000) -> "pulsar.Reader":
    """A Reader of `topic` from `entry` (inclusive: every message of that entry; None: the
    earliest message). `partition` is the partition index the message ids of `topic` carry."""
    start = pulsar.MessageId.earliest if entry is None else pulsar.MessageId(partition, entry[0], entry[1], -1)
    return client.create_reader(topic, start, start_message_id_inclusive=True, receiver_queue_size=receiver_queue_size)


def has_more(reader: "pulsar.Reader") -> bool:
    """Whether `reader` has a message left before the topic's end."""
    try:
        return bool(reader.has_message_available())
    except pulsar.UnknownError:
        # pulsar-lite answers the last-message-id request of a topic with no messages with
        # UnknownError ("Topic has no messages"): nothing to read.
        return False


def close_quietly(reader: Any, topic: str) -> None:
    """Close `reader`; a failure is logged at debug level only."""
    try:
        reader.close()
    except Exception as exc:  # a Reader's subscription is its own: nothing waits on it
        log.debug("event=reader_close_failed topic=%s error=%r", topic, exc)
