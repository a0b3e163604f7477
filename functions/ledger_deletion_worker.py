"""LedgerDeletionWorker: phase two of two-phase ledger deletion (PIP-186).

Consumes the `__ledger_deletion` and `__ledger_deletion-RETRY` partitions; for each
PendingDeleteLedgerInfo it checks in-use (internalStats ledgersCache), verifies ownership from
the ledger's own metadata and deletes from BookKeeper or tiered storage, up to
`maxDeletionsInFlight` at once, acking each request itself once its outcome is durable
(`processingGuarantees: MANUAL`). Retries and the DLQ are done here (the Python runtime rejects
maxMessageRetries/deadLetterTopic). All logic lives in pulsar_lifecycle.deletion; this module
only wires it up.
"""
from __future__ import annotations

from typing import Any, Optional


class LedgerDeletionWorker:
    """Pulsar Function entry class (`className: ledger_deletion_worker.LedgerDeletionWorker`)."""

    def __init__(self) -> None:
        # Trivial on purpose: the runtime silently switches to pure-function mode if this raises.
        self._runner: Optional[Any] = None

    def process(self, input: Any, context: Any) -> None:  # noqa: A002 - Pulsar's parameter name
        if self._runner is None:
            from pulsar_lifecycle.deletion.worker import build_worker

            self._runner = build_worker(context)
        return self._runner.process(input, context)

    def close(self) -> None:
        """Let the deletions in flight finish and close the producers (the local runner calls it on
        stop; Pulsar's Python runtime has no close, and what a killed instance left unacked is
        redelivered)."""
        if self._runner is not None:
            self._runner.close()
