"""The standalones in order (BrokerConf) and their broker configuration."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

# Ledgers roll over every 50,000 entries (managedLedgerMaxEntriesPerLedger, the default) without
# waiting the default 10 minutes first: the bucket tracker seals a bucket only when a message of a
# newer ledger arrives, so a topic younger than 10 minutes keeps every index in its mutable bucket
# (a plain in-memory queue). A topic that has run for a while rolls its ledgers anyway.
BROKER_CONFIG = {"managedLedgerMinLedgerRolloverTimeMinutes": "0"}


# -- broker plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerConf:
    """One standalone configuration and what runs on it: (part, contender) in order."""

    label: str
    tracker: str
    tick_ms: int
    dedup: bool
    tasks: Tuple[Tuple[str, str], ...]


def plan(smoke: bool) -> List[BrokerConf]:
    """The standalones in order. On each, the tracker's memory is read first, on a broker that has
    run nothing else yet (an earlier part's leftovers on the heap blur a reading after a full GC),
    and its recovery restarts it before the other parts run."""
    if smoke:  # one standalone for everything: the code paths, not the figures
        return [BrokerConf("bucket, tick 100 ms, dedup on", "bucket", 100, True, (
            ("memory", "bucket"), ("recovery", "bucket"),
            ("saturated", "batched-pipe"), ("saturated", "writer"), ("saturated", "bucket"),
            ("lateness", "writer"), ("lateness", "bucket, tick 100 ms"),
            ("dedup", "DedupPublisher"), ("dedup", "broker dedup"),
            ("memory", "writer"), ("recovery", "writer")))]
    return [
        BrokerConf("inmemory, tick 1 s", "inmemory", 1000, False, (
            ("memory", "inmemory"), ("recovery", "inmemory"),
            ("saturated", "batched-pipe"), ("saturated", "writer"), ("saturated", "inmemory"),
            ("lateness", "writer"), ("lateness", "inmemory, tick 1 s"),
            ("dedup", "DedupPublisher"),
            ("memory", "writer"), ("recovery", "writer"))),
        BrokerConf("inmemory, tick 100 ms", "inmemory", 100, False, (("lateness", "inmemory, tick 100 ms"),)),
        BrokerConf("bucket, tick 1 s", "bucket", 1000, False, (
            ("memory", "bucket"), ("recovery", "bucket"), ("saturated", "bucket"), ("lateness", "bucket, tick 1 s"))),
        BrokerConf("bucket, tick 100 ms", "bucket", 100, False, (("lateness", "bucket, tick 100 ms"),)),
        BrokerConf("inmemory, tick 1 s, dedup on", "inmemory", 1000, True, (
            ("dedup", "broker dedup"), ("dedup", "broker dedup, unbatched"),
            ("dedup", "broker dedup, batched, from checkpoint"))),
    ]


