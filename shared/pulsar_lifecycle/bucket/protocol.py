"""The scheduling-topic message protocol (fixed; shared with every producer and the function).

The property names live in `pulsar_lifecycle.bucket_protocol` so producers can import them
without the bucket engine; this module re-exports them and adds strict parsers, so bad input
gets an error naming the property and the value.
"""
from __future__ import annotations

from typing import Tuple

from ..bucket_protocol import CANCEL_PROP, DELIVER_AT_PROP, ORIGIN_MSG_ID_PROP, TARGET_PROP

__all__ = [
    "CANCEL_PROP",
    "DELIVER_AT_PROP",
    "ORIGIN_MSG_ID_PROP",
    "TARGET_PROP",
    "ProtocolError",
    "parse_deliver_at",
    "parse_cancel_target",
    "format_origin_msg_id",
    "parse_origin_msg_id",
]

_MAX_U64 = (1 << 64) - 1


class ProtocolError(ValueError):
    """A scheduling-topic message property is missing or malformed."""


def _parse_uint(text: str, what: str, prop: str) -> int:
    # int() alone would accept "+5", " 5", "5_000" and "٥"; the protocol is plain ASCII digits.
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        raise ProtocolError(f"{prop}: {what} must be a non-negative decimal integer, got {text!r}")
    value = int(text)
    if value > _MAX_U64:
        raise ProtocolError(f"{prop}: {what} {text!r} does not fit in 64 bits")
    return value


def parse_deliver_at(value: str) -> int:
    """Parse `__pl_deliver_at__` (ms since epoch, decimal string)."""
    return _parse_uint(value, "deliver-at time in ms", DELIVER_AT_PROP)


def parse_cancel_target(value: str) -> Tuple[int, int, int]:
    """Parse `__pl_cancel__` = "<ledgerId>:<entryId>[:<batchIndex>]"; batch index -1 when absent.

    The one parser of the property (DelayedProducer.cancel writes it with the batch index of a
    batched scheduling message).
    """
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) not in (2, 3):
        raise ProtocolError(f"{CANCEL_PROP}: expected '<ledgerId>:<entryId>[:<batchIndex>]', got {value!r}")
    ledger = _parse_uint(parts[0], "ledger id", CANCEL_PROP)
    entry = _parse_uint(parts[1], "entry id", CANCEL_PROP)
    batch = _parse_uint(parts[2], "batch index", CANCEL_PROP) if len(parts) == 3 else -1
    return ledger, entry, batch


def format_origin_msg_id(ledger_id: int, entry_id: int, partition: int) -> str:
    """`__pl_origin_msg_id__` value of a released message: "<ledgerId>:<entryId>:<partition>"."""
    return f"{int(ledger_id)}:{int(entry_id)}:{int(partition)}"


def parse_origin_msg_id(value: str) -> Tuple[int, int, int]:
    """Inverse of format_origin_msg_id (partition may be -1 for a non-partitioned topic)."""
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) != 3:
        raise ProtocolError(f"{ORIGIN_MSG_ID_PROP}: expected '<ledgerId>:<entryId>:<partition>', got {value!r}")
    ledger = _parse_uint(parts[0], "ledger id", ORIGIN_MSG_ID_PROP)
    entry = _parse_uint(parts[1], "entry id", ORIGIN_MSG_ID_PROP)
    try:
        partition = int(parts[2])
    except ValueError:
        raise ProtocolError(f"{ORIGIN_MSG_ID_PROP}: partition must be an integer, got {parts[2]!r}") from None
    return ledger, entry, partition
