"""Finding a forward on the near-term topic, so that a late cancel can follow it into the index.

A forward carries its publisher's `__pl_producer__` and `__pl_seq__` (DedupPublisher); a reader
from a `ForwardTrail` checkpoint finds it within one checkpoint interval of traffic plus what
came after. The writer's cancel protocol then names that position (`__pl_cancel__`).
"""
from __future__ import annotations

import logging
import time
from typing import Optional, Tuple

import pulsar

from ..dedup.recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY, Position, last_position, position_of
from ..pulsar_io.readers import reader_at

log = logging.getLogger(__name__)

__all__ = ["find_forward"]

END_DRAIN_MS = 300  # after the last entry: how long to wait for the rest of its batch


def find_forward(client: pulsar.Client, topic: str, start: Optional[Tuple[int, int]], producer_name: str,
                 seq: int, *, timeout_s: float = 60.0, max_messages: int = 5_000_000) -> Optional[Position]:
    """The position of the message `producer_name` published with sequence id `seq`, reading
    `topic` from entry `start` (inclusive; None = the earliest) to its current end; None when it
    is not there (the forward was dropped by a cancel or dead-lettered). Raises TimeoutError when
    the end is not reached in `timeout_s` or `max_messages` (the cancel is then retried)."""
    end = last_position(client, topic)
    if end is None:
        return None
    reader = reader_at(client, topic, (start[0], start[1]) if start else None)
    deadline = time.monotonic() + timeout_s
    wanted = str(seq)
    end_key = (end.ledger_id, end.entry_id)
    read = 0
    at_end = False  # the last entry was reached: what follows in it is the rest of its batch
    try:
        while time.monotonic() < deadline and read < max_messages:
            try:
                msg = reader.read_next(END_DRAIN_MS if at_end else 1000)
            except pulsar.Timeout:
                if at_end:
                    return None
                continue
            read += 1
            props = msg.properties()
            pos = position_of(msg.message_id())
            if props.get(PRODUCER_PROPERTY) == producer_name and props.get(SEQUENCE_PROPERTY) == wanted:
                log.info("event=delay_level_forward_found topic=%s producer=%s seq=%d position=%s read=%d",
                         topic, producer_name, seq, pos, read)
                return pos
            key = (pos.ledger_id, pos.entry_id)
            if key > end_key:
                return None
            at_end = at_end or key == end_key
    finally:
        reader.close()
    raise TimeoutError(f"{topic}: the forward {producer_name}/{seq} was not found and the end {end} was not "
                       f"reached within {timeout_s:.0f} s ({read} messages read)")

