"""Non-durable Readers from an entry of a topic: how this package reads what a consumer is not given.

Several parts read a topic beside their consumer: the writer's intake gaps, the syncer's gap
probe and gap read, the syncer's search for a forward, a resumed export, and `inspect`. They all
open a Reader at an entry (inclusive, so that the rest of a batch entry is read too), ask whether
the topic holds more, and close it without caring whether the close succeeds (a Reader's
subscription is its own: nothing waits on it).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Set, Tuple

import pulsar

log = logging.getLogger(__name__)

__all__ = ["Entry", "HoldsMessages", "close_quietly", "has_more", "holding_messages", "reader_at"]

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


def holding_messages(client: "pulsar.Client", topics: Sequence[str], wait_s: float) -> Set[str]:
    """The topics of `topics` a Reader from the earliest message receives a message of within
    `wait_s` (one wait for all: their Readers are opened together).

    For views that count what a topic holds: `has_more` asks the broker for the topic's last
    message id, which pulsar-lite answers for a topic without messages with an error that the
    client logs at ERROR and WARN; asked only of topics known to hold a message, a look at idle
    topics logs nothing. A topic whose first message takes longer than `wait_s` to arrive counts
    as empty for this look.
    """
    readers: List[Tuple[str, Any]] = []
    found: Set[str] = set()
    try:
        for topic in topics:
            readers.append((topic, reader_at(client, topic, None, receiver_queue_size=1)))
        deadline = time.monotonic() + wait_s
        for topic, reader in readers:
            try:
                reader.read_next(max(1, int((deadline - time.monotonic()) * 1000)))
                found.add(topic)
            except pulsar.Timeout:
                continue
    finally:
        for topic, reader in readers:
            close_quietly(reader, topic)
    return found


@dataclass
class HoldsMessages:
    """Whether `topic` may be asked for its last message id: called, True once a Reader from the
    earliest message received one of its messages within `wait_s` (each call looks again until
    one did; from then on True without looking).

    pulsar-lite answers the last-message-id request of a topic without messages with an error the
    client logs at ERROR and WARN, so a check that runs while a topic is idle (the stall watchdog)
    asks only a topic known to hold a message. A topic that held one keeps its end while its
    messages are retained, acked ones included, so asking it does not error. A first message
    slower than `wait_s` counts as none for that call.
    """

    client: Any
    topic: str
    wait_s: float = 0.5
    found: bool = False

    def __call__(self) -> bool:
        if not self.found:
            try:
                self.found = bool(holding_messages(self.client, [self.topic], self.wait_s))
            except pulsar.PulsarException as exc:  # not known this time: the caller asks again later
                log.info("event=holds_messages_look_failed topic=%s error=%r", self.topic, exc)
        return self.found


def close_quietly(reader: Any, topic: str) -> None:
    """Close `reader`; a failure is logged at debug level only."""
    try:
        reader.close()
    except Exception as exc:  # a Reader's subscription is its own: nothing waits on it
        log.debug("event=reader_close_failed topic=%s error=%r", topic, exc)
