"""The standalones in order (BrokerConf) and their broker configuration.

Trackers run as an operator runs them: the "defaults" profile is Pulsar 4.0's own pulsar_env.sh
(2 GB heap, 4 GB direct memory, ZGC) and standalone.conf (the bookie's caches sized from the direct
memory); the delayed-delivery settings are the defaults (tick 1 s, non-strict) unless a standalone says
otherwise. Each tracker runs non-strict and strict (`isDelayedDeliveryDeliverAtTimeStrict`), at ticks
1,000, 100 and 10 ms (`delayedDeliveryTickTimeMillis`, a standalone each: a namespace policy's 100 ms
tick on a 1 s broker left a strict Bucket tracker at the 1 s tick's lateness, p99 about 1,000 ms), and
with TUNED, what a Pulsar engineer would try for this load.
Our contenders' lateness runs on the tick-1 s standalones only (it does not depend on the tick).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

# Ledgers roll over every 50,000 entries (managedLedgerMaxEntriesPerLedger, the default) without
# waiting the default 10 minutes first: the bucket tracker seals a bucket only when a message of a
# newer ledger arrives, so a topic younger than 10 minutes keeps every index in its mutable bucket
# (a plain in-memory queue). A topic that has run for a while rolls its ledgers anyway.
BROKER_CONFIG = {"managedLedgerMinLedgerRolloverTimeMinutes": "0"}
# The tuned variant: due messages are dispatched 500 entries per read instead of 100, and stay in the
# broker's entry cache until acknowledged (eviction by the mark-delete position, not the read
# position) for 10 minutes, longer than any lead time here, instead of being read back from the bookie
# one entry at a time; the Bucket tracker's snapshot segments hold 50,000 indexes instead of 5,000.
TUNED = {
    "dispatcherMaxReadBatchSize": "500",
    "cacheEvictionByMarkDeletedPosition": "true",
    "managedLedgerCacheEvictionTimeThresholdMillis": "600000",
    "delayedDeliveryMaxIndexesPerBucketSnapshotSegment": "50000",
}
TICKS_MS = (1000, 100, 10)
PAYLOADS = (100, 1024)
# Parts whose contenders run in alternating order across runs, each after a warm-up pass on its JVM.
ALTERNATING = ("saturated", "lateness", "dedup")


# -- broker plan ---------------------------------------------------------------------------------------
# The lateness contender that shows the floor of any release path on a standalone: messages
# published at their deliver-at instant, read by the same consumer (lateness.py).
PUBLISH = "publish at deliver-at"


@dataclass(frozen=True)
class BrokerConf:
    """One standalone configuration and what runs on it: (part, contender) in order."""

    label: str
    tracker: str
    tick_ms: int
    dedup: bool
    tasks: Tuple[Tuple[str, str], ...]
    strict: bool = False
    tuned: bool = False
    profile: str = "defaults"  # PulsarStandalone.profile

    @property
    def short(self) -> str:
        """The tracker's name in contender labels: "bucket", "inmemory strict", "bucket tuned"."""
        return self.tracker + (" strict" if self.strict else "") + (" tuned" if self.tuned else "")

    def broker_config(self) -> Dict[str, str]:
        conf = dict(BROKER_CONFIG)
        if self.strict:
            conf["isDelayedDeliveryDeliverAtTimeStrict"] = "true"
        if self.tuned:
            conf.update(TUNED)
        return conf


def sat(who: str, payloads: Sequence[int]) -> Tuple[Tuple[str, str], ...]:
    """Saturated tasks of one contender, one per payload size: "bucket, 100 B"."""
    return tuple(("saturated", f"{who}, {p} B") for p in payloads)


def late(short: str, ticks: Sequence[int]) -> Tuple[Tuple[str, str], ...]:
    """Lateness tasks of one tracker, one per tick: "inmemory strict, tick 100 ms"."""
    return tuple(("lateness", f"{short}, tick {t} ms") for t in ticks)


def payload_of_label(label: str) -> Tuple[str, int]:
    """("bucket", 1024) of "bucket, 1024 B"; a label without a size is 100 B."""
    m = re.fullmatch(r"(.*), (\d+) B", label)
    return (m.group(1), int(m.group(2))) if m else (label, 100)


def tick_of_label(label: str) -> int:
    """The tick of a lateness label ("..., tick 100 ms"); 0 for the writer."""
    m = re.search(r"tick (\d+) ms", label)
    return int(m.group(1)) if m else 0


def plan(smoke: bool, payloads: Sequence[int] = PAYLOADS, ticks: Sequence[int] = TICKS_MS) -> List[BrokerConf]:
    """The standalones in order. On each, the tracker's memory is read first, on a broker that has
    run nothing else yet (an earlier part's leftovers on the heap blur a reading after a full GC),
    and its recovery restarts it before the other parts run."""
    if smoke:  # one standalone for everything: the code paths, not the figures
        return [BrokerConf("bucket, tick 100 ms, dedup on", "bucket", 100, True, (
            ("memory", "control"), ("memory", "bucket"), ("recovery", "bucket"),
            *sat("batched-pipe", payloads), *sat("writer", payloads), *sat("bucket", payloads),
            ("lateness", "writer"), ("lateness", PUBLISH), ("lateness", "bucket, tick 100 ms"),
            ("dedup", "DedupPublisher"), ("dedup", "broker dedup"), ("dedup", "broker dedup, Java client"),
            ("memory", "writer"), ("recovery", "writer"), ("memory", "writer, table service")), profile="small")]
    P = payloads
    T = [t for t in ticks if t == 1000]
    slow = [t for t in ticks if t != 1000]  # a standalone each: the tick is a broker setting
    return [
        BrokerConf("inmemory, tick 1 s", "inmemory", 1000, False, (
            ("memory", "control"), ("memory", "inmemory"), ("recovery", "inmemory"),
            *sat("batched-pipe", P), *sat("writer", P), *sat("inmemory", P),
            ("lateness", "writer"), *late("inmemory", T),
            ("dedup", "DedupPublisher"),
            ("memory", "writer"), ("recovery", "writer"), ("memory", "writer, table service"))),
        BrokerConf("inmemory strict, tick 1 s", "inmemory", 1000, False, (
            ("lateness", "writer"), *late("inmemory strict", T)), strict=True),
        BrokerConf("bucket, tick 1 s", "bucket", 1000, False, (
            ("memory", "control"), ("memory", "bucket"), ("recovery", "bucket"), *sat("writer", P), *sat("bucket", P),
            ("lateness", "writer"), *late("bucket", T))),
        BrokerConf("bucket strict, tick 1 s", "bucket", 1000, False, (
            ("lateness", "writer"), ("lateness", PUBLISH), *late("bucket strict", T)), strict=True),
        *[BrokerConf(f"{tracker}{' strict' if strict else ''}, tick {tick} ms", tracker, tick, False,
                     late(tracker + (" strict" if strict else ""), [tick]), strict=strict)
          for tick in slow for tracker in ("inmemory", "bucket") for strict in (False, True)],
        BrokerConf("inmemory tuned, tick 1 s", "inmemory", 1000, False, (
            *sat("writer", P), *sat("inmemory tuned", P)), tuned=True),
        BrokerConf("bucket tuned, tick 1 s", "bucket", 1000, False, (
            *sat("writer", P), *sat("bucket tuned", P)), tuned=True),
        BrokerConf("inmemory, tick 1 s, dedup on", "inmemory", 1000, True, (
            ("dedup", "broker dedup"), ("dedup", "broker dedup, Java client"), ("dedup", "broker dedup, unbatched"),
            ("dedup", "broker dedup, batched, from checkpoint"))),
    ]
