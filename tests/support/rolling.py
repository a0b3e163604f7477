"""Broker settings under which a real Pulsar standalone makes PIP-186 orphans quickly.

Ledgers roll every ENTRIES_PER_LEDGER entries and nothing is retained, so a consumed ledger is
trimmed, and its delete attempted, right away. Used by the real-Pulsar deletion tests and the
deletion benchmark's real-storage mode (bench/_real_orphans.py).
"""
from __future__ import annotations

from typing import Dict

ENTRIES_PER_LEDGER = 5
ROLLING: Dict[str, str] = {
    "managedLedgerMaxEntriesPerLedger": str(ENTRIES_PER_LEDGER),
    "managedLedgerMinLedgerRolloverTimeMinutes": "0",
    "defaultRetentionTimeInMinutes": "0",
    "defaultRetentionSizeInMB": "0",
}
