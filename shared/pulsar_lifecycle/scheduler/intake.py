"""Turning a scheduling-topic message into an index item, a cancel, or a refusal with a reason."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple, Union

from ..bucket import positions
from ..bucket.records import DelayedMessage, index_id
from ..dedup.recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY
from ..scheduling_protocol import (
    BATCH_INDEX_PROP,
    CANCEL_PROP,
    DELIVER_AT_PROP,
    REPLY_TO_PROP,
    TARGET_PROP,
    ProtocolError,
    parse_cancel_target,
    parse_deliver_at,
)

DEDUP_PROPERTIES = (PRODUCER_PROPERTY, SEQUENCE_PROPERTY)
# Properties a release does not inherit from its scheduling message.
_NOT_KEPT = frozenset((TARGET_PROP, BATCH_INDEX_PROP) + DEDUP_PROPERTIES)


@dataclass(frozen=True)
class Cancel:
    """A request to cancel the scheduling message at (ledger_id, entry_id) (entry_id an index id).

    `target` is the target as the cancel named it (the id its user sees), `source` the cancel
    message's own (ledger, entry, partition, batch index), `reply_to` the topic it asks to be
    answered on (empty: no answer)."""

    ledger_id: int
    entry_id: int
    # Not part of what is cancelled (equality): how it was asked and where to answer.
    target: str = field(default="", compare=False)
    source: Tuple[int, int, int, int] = field(default=(-1, -1, -1, -1), compare=False)
    reply_to: str = field(default="", compare=False)


@dataclass(frozen=True)
class Invalid:
    """A message that cannot be scheduled, and why."""

    reason: str


Intake = Union[DelayedMessage, Cancel, Invalid]
#: target (None: the writer's output) -> the reason its release is refused, or None
#: (scheduler/target_permissions.py: TargetPermissionCheck.refusal).
TargetCheck = Callable[[Optional[str]], Optional[str]]


def classify(
    *,
    payload: bytes,
    properties: dict,
    key: Optional[str],
    event_time: int,
    position: Tuple[int, int, int, int],
    now_ms: int,
    max_delay_ms: int,
    allowed_target_prefixes: Tuple[str, ...],
    target_check: Optional[TargetCheck] = None,
) -> Intake:
    """Decide what a scheduling message is. `position` = (ledger, entry, partition, batch_index).
    `target_check` refuses a target (or the output, for a message without one) the producers of the
    scheduling topic may not produce to themselves (None: no such check)."""
    ledger, entry, partition, batch_index = position
    index_entry = index_id(entry, batch_index)  # positions.encode
    if index_entry is None:
        return Invalid(f"message {ledger}:{entry}:{batch_index} is beyond the index's position range "
                       f"(entry <= {positions.MAX_INDEXABLE_ENTRY_ID}, batch index <= {positions.MAX_BATCH_INDEX})")
    try:
        if CANCEL_PROP in properties:
            lid, eid, bidx = parse_cancel_target(properties[CANCEL_PROP])
            target_entry = positions.encode(eid, bidx)
            if target_entry is None:
                return Invalid(f"{CANCEL_PROP}={properties[CANCEL_PROP]!r} is beyond the index's position range")
            return Cancel(lid, target_entry, properties[CANCEL_PROP], position, properties.get(REPLY_TO_PROP, ""))
        if DELIVER_AT_PROP not in properties:
            return Invalid(f"missing {DELIVER_AT_PROP} (deliver-at, ms since epoch)")
        deliver_at = parse_deliver_at(properties[DELIVER_AT_PROP])
    except ProtocolError as exc:
        return Invalid(str(exc))
    if deliver_at - now_ms > max_delay_ms:
        return Invalid(f"{DELIVER_AT_PROP}={deliver_at} is {(deliver_at - now_ms) // 1000} s ahead, over maxDelaySeconds={max_delay_ms // 1000}")
    target = properties.get(TARGET_PROP) or None
    if target is not None and not any(target.startswith(p) for p in allowed_target_prefixes):
        return Invalid(f"{TARGET_PROP}={target!r} is not under allowedTargetPrefix (allowed: {list(allowed_target_prefixes)})")
    if target_check is not None:
        refused = target_check(target)
        if refused is not None:
            return Invalid(refused)
    # An upstream DedupPublisher's own properties (e.g. the delay-level syncer's forwards) are
    # not the release's: the release publisher adds its own and refuses foreign ones.
    # (The common message carries none of them: then a plain copy, without a test per property.)
    if _NOT_KEPT.isdisjoint(properties):
        props = dict(properties)
    else:
        props = {k: v for k, v in properties.items() if k not in _NOT_KEPT}
    if batch_index == 0:  # the index id cannot tell batch index 0 from "not batched": keep it
        props[BATCH_INDEX_PROP] = "0"
    return DelayedMessage(ledger_id=ledger, entry_id=index_entry, partition=partition, deliver_at=deliver_at,
                          payload=bytes(payload), key=key or None, properties=props,
                          event_time=int(event_time or 0), target=target)
