"""Index positions for batched scheduling messages.

The bucket index keys items by (ledgerId, index id) with index id `entry_id << BATCH_BITS |
batch_index` (bucket/records.py says why); the snapshots Pulsar reads hold real entry ids with
the batch index in an extension field (bucket/codec.py). This module names those helpers for
the writer's intake and releases and the delay-level rule.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .records import BATCH_BITS, MAX_BATCH_INDEX, MAX_INDEXABLE_ENTRY_ID, index_id, split_index_id

__all__ = ["BATCH_BITS", "MAX_BATCH_INDEX", "MAX_INDEXABLE_ENTRY_ID", "encode", "decode", "format_user_id"]


def encode(entry_id: int, batch_index: int) -> Optional[int]:
    """The index id of a message, or None when it does not fit."""
    return index_id(entry_id, batch_index)


def decode(index_entry_id: int) -> Tuple[int, int]:
    """(entry_id, batch_index) of an index id."""
    return split_index_id(index_entry_id)


def format_user_id(ledger_id: int, index_entry_id: int) -> str:
    """The id users see (what `delayed send` prints and `delayed cancel` takes) of an index
    position: `<ledger>:<entry>`, or `<ledger>:<entry>:<batch>` for a batch index above 0 (the
    index id cannot tell a batch's first message from one that was not batched)."""
    entry, batch = split_index_id(index_entry_id)
    return f"{ledger_id}:{entry}:{batch}" if batch else f"{ledger_id}:{entry}"
