"""Bucket keys as Pulsar writes them into the cursor properties."""
from __future__ import annotations

from typing import Tuple

# ManagedCursorImpl.CURSOR_INTERNAL_PROPERTY_PREFIX + "delayed.bucket"
CURSOR_INTERNAL_PROPERTY_PREFIX = "#pulsar.internal."
DELAYED_BUCKET_KEY_PREFIX = CURSOR_INTERNAL_PROPERTY_PREFIX + "delayed.bucket"
DELIMITER = "_"


def bucket_key(start_ledger_id: int, end_ledger_id: int) -> str:
    """`#pulsar.internal.delayed.bucket_<startLedgerId>_<endLedgerId>` (Bucket.bucketKey())."""
    for name, value in (("start_ledger_id", start_ledger_id), ("end_ledger_id", end_ledger_id)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"bucket key {name} must be a non-negative int, got {value!r}")
    if start_ledger_id > end_ledger_id:
        raise ValueError(f"bucket key range is empty: start {start_ledger_id} > end {end_ledger_id}")
    return DELIMITER.join((DELAYED_BUCKET_KEY_PREFIX, str(start_ledger_id), str(end_ledger_id)))


def parse_bucket_key(key: str) -> Tuple[int, int]:
    """(start, end) of a bucket key; ValueError naming the key when it is not one.

    Pulsar's recovery splits on '_' and requires exactly three parts (the prefix contains none).
    """
    parts = key.split(DELIMITER) if isinstance(key, str) else []
    if len(parts) != 3 or parts[0] != DELAYED_BUCKET_KEY_PREFIX:
        raise ValueError(f"not a delayed-index bucket key: {key!r}")
    try:
        if not (parts[1].isdigit() and parts[2].isdigit()):
            raise ValueError
        start, end = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"bucket key {key!r} has a non-numeric ledger id") from None
    if start > end:
        raise ValueError(f"bucket key {key!r} has start ledger > end ledger")
    return start, end


def is_bucket_key(key: str) -> bool:
    """True for a cursor-property name that is a delayed-index bucket key."""
    try:
        parse_bucket_key(key)
    except ValueError:
        return False
    return True
