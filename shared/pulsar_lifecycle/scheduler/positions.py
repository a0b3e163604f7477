"""Index positions for batched scheduling messages.

The bucket index keys items by (ledgerId, index id) with index id `entry_id << BATCH_BITS |
batch_index` (bucket/records.py says why); the snapshots Pulsar reads hold real entry ids with
the batch index in an extension field (bucket/codec.py). This module names those helpers for
the scheduler.
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..bucket.records import BATCH_BITS, MAX_BATCH_INDEX, index_id, split_index_id

MAX_ENTRY_ID = (1 << (32 - BATCH_BITS)) - 1

__all__ = ["BATCH_BITS", "MAX_BATCH_INDEX", "MAX_ENTRY_ID", "encode", "decode", "format_message_ref"]


def encode(entry_id: int, batch_index: int) -> Optional[int]:
    """The index id of a message, or None when it does not fit."""
    return index_id(entry_id, batch_index)


def decode(index_entry_id: int) -> Tuple[int, int]:
    """(entry_id, batch_index) of an index id."""
    return split_index_id(index_entry_id)


def format_message_ref(ledger_id: int, entry_id: int, batch_index: int) -> str:
    """"<ledgerId>:<entryId>" or "<ledgerId>:<entryId>:<batchIndex>" for a batched message."""
    base = f"{ledger_id}:{entry_id}"
    return f"{base}:{batch_index}" if batch_index >= 0 else base
