"""Rebuild a topic's sequence map after a crash: load the snapshot, replay the topic's tail.

This is the client-side version of Pulsar's ``MessageDeduplication.replayCursor``. The tail is
read with a Reader starting at the snapshot's entry (inclusive; re-reading entries is harmless
because the map only ever takes maxima) and stops at the topic's last message id, measured once
before reading. The loop is bounded by time and by message count: the embedded broker's Reader
may deliver duplicates under load, so the count bound is generous, and running out of either
bound is an error rather than a silent partial recovery.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

import pulsar

from .sequence_map import DedupError, Position

log = logging.getLogger(__name__)

PRODUCER_PROPERTY = "__pl_producer__"
SEQUENCE_PROPERTY = "__pl_seq__"
# How long to wait for the rest of the last entry's batch once its first message was read, when
# its size is unknown: pulsar-lite reports a batch entry's last message id with batch index -1.
# Apache Pulsar reports the entry's largest batch index (and a single message reads with -1), so
# there the replay ends with the entry's last message, without this wait.
END_DRAIN_MS = 200
# A replay that gets no message for READ_STALL_S (not at the end) restarts its reader; each
# restart doubles the wait (1, 2, 4, 8, 16 s). It was 5 s flat: a syncer start waits for every
# partition's replay, so one stalled reader made whole partitions 4-8 s late (issue 11).
READ_STALL_S = 1.0
MAX_READER_RESTARTS = 5


class RecoveryError(DedupError):
    """The topic's tail could not be replayed completely."""


@dataclass(frozen=True)
class TailStats:
    """What one tail replay read."""

    topic: str
    start: Optional[Position]
    end: Optional[Position]
    messages_read: int
    matched: int
    seconds: float
    restarts: int = 0  # Readers replaced after a stall (READ_STALL_S)


def position_of(message_id: object) -> Position:
    """A Position from a pulsar-client MessageId (either the wrapper or `_pulsar.MessageId`)."""
    return Position(
        ledger_id=int(message_id.ledger_id()),  # type: ignore[attr-defined]
        entry_id=int(message_id.entry_id()),  # type: ignore[attr-defined]
        batch_index=int(message_id.batch_index()),  # type: ignore[attr-defined]
        partition=int(message_id.partition()),  # type: ignore[attr-defined]
    )


def last_position(
    client: pulsar.Client, topic: str, *, probe_timeout_ms: int = 500, attempts: int = 3
) -> Optional[Position]:
    """The topic's last entry, or None when the topic holds no message.

    A Reader from the earliest message looks first: when none arrives within `probe_timeout_ms`
    the topic is empty. pulsar-lite answers the last-message-id request of an empty topic with
    UnknownError ("Topic has no messages"), which the client logs at ERROR and WARN, so an empty
    topic is never asked. A topic that holds a message is asked through a throw-away Shared
    subscription (the Python Reader has no get_last_message_id), unsubscribed afterwards; an
    error or an end before the message read is asked again (`attempts`), then refused: a replay
    needs an end.
    """
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1)
    try:
        first = position_of(reader.read_next(probe_timeout_ms).message_id())
    except pulsar.Timeout:
        return None
    finally:
        reader.close()
    sub = f"__pl_dedup_probe_{uuid.uuid4().hex[:12]}"
    consumer = client.subscribe(
        topic, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1,
        initial_position=pulsar.InitialPosition.Latest,
    )
    try:
        for _attempt in range(attempts):
            try:
                last: Optional[Position] = position_of(consumer.get_last_message_id())
            except pulsar.UnknownError:
                last = None
            if last is not None and last.entry() >= first.entry():
                return last
            log.info("event=dedup_last_id_retry topic=%s first=%s last=%s", topic, first, last)
            time.sleep(0.2)  # the broker may still be writing the entry it handed the Reader
    finally:
        try:
            consumer.unsubscribe()
        except pulsar.PulsarException as exc:  # a leftover probe subscription is only litter
            log.warning("event=dedup_probe_unsubscribe_failed topic=%s subscription=%s error=%s", topic, sub, exc)
            consumer.close()
    raise RecoveryError(
        f"topic {topic}: the broker could not report the last message id but the topic holds "
        f"messages ({attempts} attempts); refusing a replay with no end"
    )


def read_tail(
    client: pulsar.Client,
    topic: str,
    start: Optional[Position],
    on_message: Callable[[pulsar.Message], bool],
    *,
    timeout_s: float = 120.0,
    max_messages: int = 10_000_000,
) -> TailStats:
    """Feed every message from `start`'s entry (inclusive; None = earliest) to the last one.

    `on_message` returns True when the message was relevant (counted as `matched`).
    Raises RecoveryError when `timeout_s` or `max_messages` runs out before the end.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    end = last_position(client, topic)
    if end is None or (start is not None and end.entry() < start.entry()):
        if end is not None:
            log.warning(
                "event=dedup_snapshot_beyond_topic_end topic=%s snapshot_position=%s last=%s",
                topic, start, end,
            )
        return TailStats(topic, start, end, 0, 0, time.monotonic() - t0)
    # The snapshot's own entry is read again: a snapshot taken inside a batch is exact only up
    # to its batch index, while the rest of that batch was persisted at the same moment.
    start_id = (
        pulsar.MessageId(-1, start.ledger_id, start.entry_id, -1) if start is not None else pulsar.MessageId.earliest
    )
    reader = client.create_reader(topic, start_id, start_message_id_inclusive=True, receiver_queue_size=1000)
    read = matched = 0
    end_key = (end.ledger_id, end.entry_id)
    at_end = False
    last_id: Optional[pulsar.MessageId] = None  # the last message read (a restarted reader starts there)
    progress = time.monotonic()
    restarts = 0
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if at_end:
                    break
                raise RecoveryError(
                    f"topic {topic}: replay from {start} did not reach the last entry {end} within "
                    f"{timeout_s:.0f}s ({read} messages read); raise recovery_timeout_s"
                )
            if read >= max_messages:
                raise RecoveryError(
                    f"topic {topic}: replay from {start} read {read} messages without reaching {end}; "
                    "raise recovery_max_messages"
                )
            wait_ms = END_DRAIN_MS if at_end else 500
            try:
                msg = reader.read_next(max(1, int(min(remaining * 1000, wait_ms))))
            except pulsar.Timeout:
                if at_end:
                    break
                if time.monotonic() - progress >= READ_STALL_S * 2 ** restarts and restarts < MAX_READER_RESTARTS:
                    # pulsar-lite can leave a reader without messages after it dropped the
                    # connection (a protocol error on another command): a new reader, from the
                    # last message read (re-reading it is harmless), gets them.
                    restarts += 1
                    log.warning("event=dedup_tail_reader_restarted topic=%s read=%d last=%s stalled_s=%.1f",
                                topic, read, last_id, time.monotonic() - progress)
                    reader.close()
                    reader = client.create_reader(topic, last_id or start_id, start_message_id_inclusive=True,
                                                  receiver_queue_size=1000)
                    progress = time.monotonic()
                continue
            progress = time.monotonic()
            mid = msg.message_id()
            last_id = mid
            key = (mid.ledger_id(), mid.entry_id())
            if at_end and key != end_key:
                # The last entry's batch arrived whole and contiguous; anything else is either
                # newer than the measured end or a re-delivery of what was already applied.
                break
            read += 1
            if on_message(msg):
                matched += 1
            if key >= end_key:
                batch_index = mid.batch_index()
                if key == end_key and (batch_index < 0 or 0 <= end.batch_index <= batch_index):
                    break  # the last entry's last message (a single message, or the batch's last index)
                # The last entry may be a batch of unknown size: keep reading its remaining
                # messages, which the client has already queued, then stop.
                at_end = True
    finally:
        reader.close()
    stats = TailStats(topic, start, end, read, matched, time.monotonic() - t0, restarts)
    log.info(
        "event=dedup_tail_replayed topic=%s start=%s end=%s read=%d matched=%d reader_restarts=%d seconds=%.3f",
        topic, start, end, read, matched, restarts, stats.seconds,
    )
    return stats
