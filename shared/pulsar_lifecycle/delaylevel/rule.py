"""The partition rule, the forward time and the names of a delay-level topic. Pure.

A parked message in partition k carries its deliver-at (`__pl_deliver_at__`), its business
topic (`__pl_target__`) and the producer's clock reading when it chose k (`__pl_dl_base__`).
The syncer forwards it at

    forward_at = min(base + (k+1) * unit, deliver_at) - lookahead

measured on the syncer's clock. `base` grows with publish order within a partition (one
producer's clock, or several producers' clocks within their skew), so forward times are
monotone in the order the syncer reads them: it waits only on each partition's head.
Since deliver_at >= base + (k+1) * unit, a message is forwarded at least `lookahead` before its
deliver-at by the producer's clock; the writer releases it at deliver_at by its own clock.
See docs/delay-levels.md for the never-early / bounded-lateness argument and clock skew.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Tuple

from ..bucket import positions
from ..scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP
from ..topics import partition_name
from .errors import ParkedMessageError

__all__ = [
    "BASE_PROP",
    "CANCEL_PARTITION_PROP",
    "LEVEL_PROP",
    "ORIGIN_MSG_ID_PROP",
    "ORIGIN_PARTITION_PROP",
    "Parked",
    "cancel_topic",
    "DEFAULT_DELAY_LEVEL_TOPIC",
    "dead_letter_topic",
    "dedicated_delay_level_topic",
    "default_delay_level_topic",
    "forward_at",
    "parse_parked",
    "partition_topic",
    "sequence_id",
    "source_position",
    "tick_topic",
]

BASE_PROP = "__pl_dl_base__"  # producer's clock (ms) when it chose the partition
LEVEL_PROP = "__pl_dl_level__"  # the partition index the producer chose (checked by the syncer)
ORIGIN_PARTITION_PROP = "__pl_dl_origin_partition__"  # on forwarded messages: the partition topic
ORIGIN_MSG_ID_PROP = "__pl_dl_origin_msg_id__"  # on forwarded messages: "<ledger>:<entry>[:<batch>]"
CANCEL_PARTITION_PROP = "__pl_dl_cancel_partition__"  # on cancel requests: the partition index

#: The one delay-level topic every DelayLevelProducer parks on unless told otherwise, and the one the
#: shipped DelayLevelSyncer (function-configs/delay-level-syncer.yaml) serves: shared by every
#: business topic, each parked message carrying its own in `__pl_target__`.
DEFAULT_DELAY_LEVEL_TOPIC = "persistent://public/default/delay-level"
DEFAULT_SUFFIX = "-delay-level"
_LEDGER_LIMIT = (1 << 31) - 1  # so that the +1 below stays within a signed 64-bit id


def default_delay_level_topic() -> str:
    """The shared delay-level topic producers park on by default (DEFAULT_DELAY_LEVEL_TOPIC)."""
    return DEFAULT_DELAY_LEVEL_TOPIC


def dedicated_delay_level_topic(business_topic: str) -> str:
    """`<business topic>-delay-level`: a delay-level topic of one business topic's own, in its
    namespace (needs a syncer of its own)."""
    return f"{business_topic}{DEFAULT_SUFFIX}"


def partition_topic(delay_level_topic: str, k: int) -> str:
    """Partition k by name, as Pulsar names a partitioned topic's partitions."""
    return partition_name(delay_level_topic, k)


def dead_letter_topic(delay_level_topic: str) -> str:
    """Where parked messages whose business topic no longer exists go: `<delay-level topic>-DLQ`."""
    return f"{delay_level_topic}-DLQ"


def cancel_topic(delay_level_topic: str) -> str:
    """Where cancel requests for parked messages go: `<delay-level topic>-CANCEL`."""
    return f"{delay_level_topic}-CANCEL"


def tick_topic(delay_level_topic: str) -> str:
    """The syncer's wake topic by default: `<delay-level topic>-TICK`. A DelayLevelProducer sends
    one tick there when it first writes to the delay-level topic, so a syncer in `hold` mode (its
    only input is this topic) starts by itself on the first parked message."""
    return f"{delay_level_topic}-TICK"


def sequence_id(ledger_id: int, entry_id: int, batch_index: int) -> int:
    """The forward's sequence id from its source position: increasing with the position, > 0.

    `ledger << 32 | entry << 10 | batch` (+1, since pulsar-client ignores sequence id 0): the
    scheduler's 32-bit (entry, batch index) encoding below a 31-bit ledger id.
    """
    batch = batch_index if batch_index > 0 else 0
    if (0 <= entry_id <= positions.MAX_INDEXABLE_ENTRY_ID and batch <= positions.MAX_BATCH_INDEX
            and 0 <= ledger_id < _LEDGER_LIMIT):  # positions.encode inlined: once per parked message
        return ((ledger_id << 32) | (entry_id << positions.BATCH_BITS) | batch) + 1
    low = positions.encode(entry_id, batch_index)
    if low is None or not 0 <= ledger_id < _LEDGER_LIMIT:
        raise ParkedMessageError(f"position {ledger_id}:{entry_id}:{batch_index} does not fit a sequence id "
                                 f"(ledger < 2**31 - 1, entry <= {positions.MAX_INDEXABLE_ENTRY_ID}, "
                                 f"batch index <= {positions.MAX_BATCH_INDEX})")
    return ((ledger_id << 32) | low) + 1


def source_position(seq: int) -> Tuple[int, int, int]:
    """(ledger, entry, batch index) of the parked message a forward's sequence id came from
    (`sequence_id`'s inverse; a message outside a batch comes back with batch index 0)."""
    if seq < 1:
        raise ValueError(f"sequence id {seq} names no source position (ids start at 1)")
    ledger, low = (seq - 1) >> 32, (seq - 1) & 0xFFFF_FFFF
    entry, batch = positions.decode(low)
    return ledger, entry, batch


def forward_at(base_ms: int, k: int, unit_ms: int, deliver_at_ms: int, lookahead_ms: int) -> int:
    """When (syncer clock, ms) the parked message should leave for the near-term path."""
    return min(base_ms + (k + 1) * unit_ms, deliver_at_ms) - lookahead_ms


class Parked(NamedTuple):
    """The delay-level properties of one parked message (a NamedTuple: built once per parked
    message, and a frozen dataclass costs three times as much to build)."""

    deliver_at: int
    target: str
    base: int
    level: int


def _int_prop(props: Mapping[str, str], name: str) -> int:
    raw = props.get(name)
    if raw is None:
        raise ParkedMessageError(f"missing {name}")
    if raw.isascii() and raw.isdigit():  # the common case, checked cheaply (per parked message)
        return int(raw)
    if not raw.isascii() or not raw.lstrip("-").isdigit():
        raise ParkedMessageError(f"{name} must be a decimal integer, got {raw!r}")
    return int(raw)


def parse_parked(props: Mapping[str, str], partition: int) -> Parked:
    """The delay-level properties of a message read from `partition`; ParkedMessageError names a
    missing or malformed one. A level other than the partition is an error too (a producer with
    another strategy wrote here)."""
    deliver_at = _int_prop(props, DELIVER_AT_PROP)
    base = _int_prop(props, BASE_PROP)
    level = _int_prop(props, LEVEL_PROP)
    target = props.get(TARGET_PROP) or ""
    if not target:
        raise ParkedMessageError(f"missing {TARGET_PROP} (the business topic)")
    if level != partition:
        raise ParkedMessageError(f"{LEVEL_PROP}={level} but the message is in partition {partition}: "
                                 "its producer uses another strategy")
    if deliver_at < 0 or base < 0:
        raise ParkedMessageError(f"{DELIVER_AT_PROP}={deliver_at} / {BASE_PROP}={base} must not be negative")
    return Parked(deliver_at=deliver_at, target=target, base=base, level=level)

