"""The scheduling protocol in one module: property names, message references, strict parsers.

Every producer (DelayedProducer, DelayLevelProducer, the delay-level syncer), the writer
(intake, releases, wake ticks) and cancellation import the names and formats from here, so one
rule is written once. Bad input raises ProtocolError naming the property and the value.

Message references (`MessageRef`): a scheduling message is named by its position
(ledgerId, entryId, partition, batchIndex); partition -1 = non-partitioned topic, batch index
-1 = not in a batch. Text forms (unchanged wire formats, old values still parse):

* `__pl_cancel__`         "<ledgerId>:<entryId>[:<batchIndex>]"  (no partition: ledger ids are
  unique across a topic's partitions)
* `__pl_origin_msg_id__`  "<ledgerId>:<entryId>:<partition>[:<batchIndex>]"  on releases; the
  batch index is present exactly for a batched scheduling message, 0 included

Cancel outcomes: a cancel that carries `__pl_reply_to__` = `cancel_reply_topic(<the scheduling
topic or partition it was sent to>)` is answered on that topic by one message per cancel, whose
properties hold `__pl_cancel_outcome__` (one of CANCEL_OUTCOMES), `__pl_cancel__` (the target, as
the cancel named it) and `__pl_origin_msg_id__` (the cancel message's own position).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .exceptions import PulsarLifecycleError

__all__ = [
    "BATCH_INDEX_PROP",
    "CANCEL_KEPT_PROP",
    "CANCEL_OUTCOMES",
    "CANCEL_OUTCOME_PROP",
    "CANCEL_PROP",
    "CANCEL_REPLY_SUFFIX",
    "REPLY_TO_PROP",
    "DELIVER_AT_PROP",
    "ERROR_PROP",
    "ORIGIN_MSG_ID_PROP",
    "RELEASED_AT_PROP",
    "TARGET_PROP",
    "TICK_PROP",
    "MessageRef",
    "cancel_reply_topic",
    "ProtocolError",
    "format_message_ref",
    "format_origin_msg_id",
    "parse_cancel_target",
    "parse_deliver_at",
    "parse_origin_msg_id",
]

DELIVER_AT_PROP = "__pl_deliver_at__"  # deliver-at, integer ms since epoch, decimal string
TARGET_PROP = "__pl_target__"  # optional fully qualified target topic of the release
CANCEL_PROP = "__pl_cancel__"  # MessageRef.format_cancel() of a scheduling message to cancel
ORIGIN_MSG_ID_PROP = "__pl_origin_msg_id__"  # MessageRef.format() of the scheduling message, on releases
RELEASED_AT_PROP = "__pl_released_at__"  # on releases: the writer's clock (ms) when it sent them
ERROR_PROP = "__pl_error__"  # on a message sent to an -INVALID topic or a DLQ: the reason
TICK_PROP = "__pl_tick__"  # on wake ticks (the writer's own and the local runner's): sender's clock, ms
REPLY_TO_PROP = "__pl_reply_to__"  # on a cancel: the topic to answer on (cancel_reply_topic only)
CANCEL_OUTCOME_PROP = "__pl_cancel_outcome__"  # on a cancel's answer: one of CANCEL_OUTCOMES
CANCEL_REPLY_SUFFIX = "-CANCEL-REPLY"
# on a not_known_yet answer: how long the writer keeps the cancel (unknownCancelRetentionSeconds)
CANCEL_KEPT_PROP = "__pl_cancel_kept_seconds__"
# cancelled: pending, it will not be delivered; already_released: delivered before the cancel;
# not_known_yet: no such message indexed (yet): the cancel is kept in case it is on its way.
CANCEL_OUTCOMES = ("cancelled", "already_released", "not_known_yet")
# Kept with an indexed item whose scheduling message was the first of a batch (batch index 0):
# the index id cannot tell it from a message that was not batched. Internal: never released.
BATCH_INDEX_PROP = "__pl_batch_index__"

_MAX_U64 = (1 << 64) - 1


class ProtocolError(PulsarLifecycleError, ValueError):
    """A scheduling-topic message property is missing or malformed."""


def _parse_uint(text: str, what: str, prop: str) -> int:
    # int() alone would accept "+5", " 5", "5_000" and "٥"; the protocol is plain ASCII digits.
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        raise ProtocolError(f"{prop}: {what} must be a non-negative decimal integer, got {text!r}")
    value = int(text)
    if value > _MAX_U64:
        raise ProtocolError(f"{prop}: {what} {text!r} does not fit in 64 bits")
    return value


def _parse_int(text: str, what: str, prop: str) -> int:
    if isinstance(text, str) and text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        value = -int(text[1:])
        if value < -(1 << 31):
            raise ProtocolError(f"{prop}: {what} {text!r} does not fit in 32 bits")
        return value
    return _parse_uint(text, what, prop)


@dataclass(frozen=True)
class MessageRef:
    """The position of one message: ledger, entry, partition (-1: none), batch index (-1: none)."""

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1

    def format(self) -> str:
        """`__pl_origin_msg_id__` form: "<ledgerId>:<entryId>:<partition>[:<batchIndex>]"."""
        return format_origin_msg_id(int(self.ledger_id), int(self.entry_id), int(self.partition),
                                    int(self.batch_index))

    def format_cancel(self) -> str:
        """`__pl_cancel__` form: "<ledgerId>:<entryId>[:<batchIndex>]" (no partition)."""
        base = f"{int(self.ledger_id)}:{int(self.entry_id)}"
        return f"{base}:{int(self.batch_index)}" if self.batch_index >= 0 else base

    @classmethod
    def parse(cls, text: str, prop: str = ORIGIN_MSG_ID_PROP) -> "MessageRef":
        """Inverse of format(); 3-part values (non-batched, and every value written before the
        batch index was added) and 4-part values parse. ProtocolError names `prop` and the value."""
        parts = text.split(":") if isinstance(text, str) else []
        if len(parts) not in (3, 4):
            raise ProtocolError(f"{prop}: expected '<ledgerId>:<entryId>:<partition>[:<batchIndex>]', got {text!r}")
        ledger = _parse_uint(parts[0], "ledger id", prop)
        entry = _parse_uint(parts[1], "entry id", prop)
        partition = _parse_int(parts[2], "partition", prop)
        if partition < -1:
            raise ProtocolError(f"{prop}: partition must be -1 or a partition index, got {parts[2]!r}")
        batch = _parse_uint(parts[3], "batch index", prop) if len(parts) == 4 else -1
        return cls(ledger, entry, partition, batch)

    @classmethod
    def parse_cancel(cls, text: str) -> "MessageRef":
        """Inverse of format_cancel() (partition -1): "<ledgerId>:<entryId>[:<batchIndex>]"."""
        parts = text.split(":") if isinstance(text, str) else []
        if len(parts) not in (2, 3):
            raise ProtocolError(f"{CANCEL_PROP}: expected '<ledgerId>:<entryId>[:<batchIndex>]', got {text!r}")
        ledger = _parse_uint(parts[0], "ledger id", CANCEL_PROP)
        entry = _parse_uint(parts[1], "entry id", CANCEL_PROP)
        batch = _parse_uint(parts[2], "batch index", CANCEL_PROP) if len(parts) == 3 else -1
        return cls(ledger, entry, -1, batch)

    @classmethod
    def of(cls, message_id: object, partition: int = -1) -> "MessageRef":
        """The ref of a pulsar-client MessageId (`ledger_id()`, `entry_id()`, `batch_index()`)."""
        return cls(message_id.ledger_id(), message_id.entry_id(), partition,  # type: ignore[attr-defined]
                   message_id.batch_index())  # type: ignore[attr-defined]


def cancel_reply_topic(scheduling_topic: str) -> str:
    """The topic a writer answers cancels on: `<scheduling topic or partition>-CANCEL-REPLY`."""
    return f"{scheduling_topic}{CANCEL_REPLY_SUFFIX}"


def parse_deliver_at(value: str) -> int:
    """Parse `__pl_deliver_at__` (ms since epoch, decimal string)."""
    return _parse_uint(value, "deliver-at time in ms", DELIVER_AT_PROP)


def parse_cancel_target(value: str) -> Tuple[int, int, int]:
    """Parse `__pl_cancel__` = "<ledgerId>:<entryId>[:<batchIndex>]"; batch index -1 when absent."""
    ref = MessageRef.parse_cancel(value)
    return ref.ledger_id, ref.entry_id, ref.batch_index


def format_message_ref(ledger_id: int, entry_id: int, batch_index: int) -> str:
    """`__pl_cancel__` value: "<ledgerId>:<entryId>" or "<ledgerId>:<entryId>:<batchIndex>" for a batched message
    (MessageRef.format_cancel, formatted here without building a MessageRef: the delay-level
    forwarder calls it once per parked message)."""
    ledger_id, entry_id, batch_index = int(ledger_id), int(entry_id), int(batch_index)
    return f"{ledger_id}:{entry_id}:{batch_index}" if batch_index >= 0 else f"{ledger_id}:{entry_id}"


def format_origin_msg_id(ledger_id: int, entry_id: int, partition: int, batch_index: int = -1) -> str:
    """`__pl_origin_msg_id__` value of a released message (MessageRef.format; formatted here
    without building a MessageRef: the writer's release path calls it once per message)."""
    if batch_index >= 0:
        return f"{ledger_id}:{entry_id}:{partition}:{batch_index}"
    return f"{ledger_id}:{entry_id}:{partition}"


def parse_origin_msg_id(value: str) -> Tuple[int, int, int]:
    """(ledger, entry, partition) of `__pl_origin_msg_id__`, 3- or 4-part; MessageRef.parse gives the batch index too."""
    ref = MessageRef.parse(value)
    return ref.ledger_id, ref.entry_id, ref.partition
