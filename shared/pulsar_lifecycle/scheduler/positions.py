"""Index positions for batched scheduling messages.

The bucket index keys items by (ledgerId, entryId) with entry ids in 32-bit RoaringBitmaps, as
Pulsar does; Pulsar's broker can do that because it dispatches whole entries. A function sees
individual messages, and a batch shares one entry. The embedded broker dispatches unbatched
messages about 100x slower than batched ones, so producers batch, and we index
`entry_id << BATCH_BITS | batch_index` instead: unique per message, ordered like the topic,
and still a 32-bit value for entry ids below 2**22 (Pulsar rolls ledgers at 50,000 entries).
"""
from __future__ import annotations

from typing import Optional, Tuple

BATCH_BITS = 10
MAX_BATCH_INDEX = (1 << BATCH_BITS) - 1
MAX_ENTRY_ID = (1 << (32 - BATCH_BITS)) - 1


def encode(entry_id: int, batch_index: int) -> Optional[int]:
    """The index entry id of a message, or None when it does not fit."""
    batch = max(batch_index, 0)
    if entry_id < 0 or entry_id > MAX_ENTRY_ID or batch > MAX_BATCH_INDEX:
        return None
    return (entry_id << BATCH_BITS) | batch


def decode(index_entry_id: int) -> Tuple[int, int]:
    """(entry_id, batch_index) of an index entry id."""
    return index_entry_id >> BATCH_BITS, index_entry_id & MAX_BATCH_INDEX


def format_message_ref(ledger_id: int, entry_id: int, batch_index: int) -> str:
    """"<ledgerId>:<entryId>" or "<ledgerId>:<entryId>:<batchIndex>" for a batched message."""
    base = f"{ledger_id}:{entry_id}"
    return f"{base}:{batch_index}" if batch_index >= 0 else base
