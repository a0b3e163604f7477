"""Deletion metrics: prometheus-client counters (own registry, no globals) and the same events
through the function Context's record_metric."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from prometheus_client import CollectorRegistry, Counter

from .engine import Action, Decision, DeletionOutcome

PREFIX = "pulsar_ledger_deletion"

# metric key -> help text; the Prometheus name is f"{PREFIX}_{key}_total".
METRICS: Dict[str, str] = {
    "deleted": "Ledgers deleted from storage",
    "already_gone": "Requests whose ledger was already gone (counted as deleted)",
    "in_use_skipped": "Requests postponed because the ledger is still in use or the cache was stale",
    "retried": "Requests sent to the RETRY topic (reconsume later)",
    "dead_lettered": "Requests sent to the DLQ",
    "ownership_mismatch": "Requests refused because the ledger belongs to another topic",
    "cache_hits": "ledgersCache lookups answered from the cache",
    "cache_misses": "ledgersCache lookups that loaded from the admin API",
    "internal_stats_calls": "Pulsar admin internalStats HTTP calls",
    "pending_sent": "Phase-one PendingDeleteLedgerInfo messages sent",
}


@dataclass
class DeletionMetrics:
    """Counters for one worker or service; `registry` may be scraped or read in tests."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    counters: Dict[str, Counter] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for key, doc in METRICS.items():
            self.counters[key] = Counter(f"{PREFIX}_{key}", doc, registry=self.registry)

    def inc(self, key: str, amount: float = 1.0, context: Optional[Any] = None) -> None:
        """Count `amount` under `key`, and record it on the function context when given."""
        if amount <= 0:
            return
        self.counters[key].inc(amount)
        if context is not None and hasattr(context, "record_metric"):
            context.record_metric(f"ledger_deletion_{key}", amount)

    def value(self, key: str) -> float:
        """Current value of a counter (for tests and benchmarks)."""
        return self.registry.get_sample_value(f"{PREFIX}_{key}_total") or 0.0

    def observe(self, decision: Decision, context: Optional[Any] = None) -> None:
        """Count everything one decision implies."""
        v = decision.verdict
        if v is not None:
            if v.cache_hit is True:
                self.inc("cache_hits", 1, context)
            elif v.cache_hit is False:
                self.inc("cache_misses", 1, context)
            self.inc("internal_stats_calls", v.admin_calls, context)
        if decision.outcome is DeletionOutcome.DELETED:
            self.inc("deleted", 1, context)
        elif decision.outcome is DeletionOutcome.ALREADY_GONE:
            self.inc("already_gone", 1, context)
        elif decision.outcome in (DeletionOutcome.IN_USE, DeletionOutcome.STALE_CACHE):
            self.inc("in_use_skipped", 1, context)
        elif decision.outcome is DeletionOutcome.OWNER_MISMATCH:
            self.inc("ownership_mismatch", 1, context)
        if decision.action is Action.RETRY:
            self.inc("retried", 1, context)
        elif decision.action is Action.DEAD_LETTER:
            self.inc("dead_lettered", 1, context)

    def snapshot(self) -> Dict[str, float]:
        """All counters as a dict."""
        return {k: self.value(k) for k in METRICS}
