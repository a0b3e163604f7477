"""Ledger in-use oracles: is a ledger still referenced by its owner's metadata?

- InternalStatsOracle: Pulsar admin internalStats through the per-topic ledgersCache (seed 000).
- SnapshotManifestOracle: the bucket scheduler's manifest, through a callable (DESIGN §1, §7).
- ComponentOracle: picks one by the request's component.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Protocol, runtime_checkable

from .admin import PulsarAdminClient
from .cache import InUseSnapshot, InUseState, LedgersCache
from .model import InvalidRequestError, LedgerComponent, PendingDeleteLedgerInfo, TopicRef
from .ports import StorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InUseVerdict:
    """An oracle's answer; `cache_hit`/`admin_calls` feed the metrics."""

    state: InUseState
    detail: str = ""
    cache_hit: Optional[bool] = None
    admin_calls: int = 0


@runtime_checkable
class LedgerInUseOracle(Protocol):
    """Answers whether the request's ledger is still in use; raises StorageError when it cannot ask."""

    def check(self, request: PendingDeleteLedgerInfo) -> InUseVerdict:
        """The verdict for `request`."""


@dataclass
class InternalStatsOracle:
    """internalStats-backed oracle with the seed's ledgersCache (TTL, stale rule, single-flight)."""

    admin: PulsarAdminClient
    ttl_seconds: float = 600.0
    clock: Callable[[], float] = time.monotonic
    cache: LedgersCache = field(init=False)
    _calls_by_thread: Dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.cache = LedgersCache(loader=self._load, ttl_seconds=self.ttl_seconds, clock=self.clock)

    def _load(self, topic: str) -> InUseSnapshot:
        before = self.admin.calls
        try:
            ids = self.admin.in_use_ledger_ids(TopicRef.parse(topic))
        finally:
            with self._lock:
                tid = threading.get_ident()
                self._calls_by_thread[tid] = self._calls_by_thread.get(tid, 0) + (self.admin.calls - before)
        if ids is None:
            log.info("internalStats topic=%s not found: nothing of it is in use", topic)
            return InUseSnapshot(topic_exists=False)
        log.info("internalStats topic=%s loaded %d in-use ledgers", topic, len(ids))
        return InUseSnapshot.of(ids)

    def check(self, request: PendingDeleteLedgerInfo) -> InUseVerdict:
        """Look the ledger up in the cached set of its topic."""
        topic = request.topic.short_name
        try:
            snap, hit = self.cache.get(topic)
        finally:
            with self._lock:
                calls = self._calls_by_thread.pop(threading.get_ident(), 0)
        state = snap.verdict(request.ledger_id)
        if state is InUseState.STALE:
            detail = (
                f"ledger {request.ledger_id} is above the cached maximum {snap.max_id} of {topic}: cache stale"
            )
        elif state is InUseState.IN_USE:
            detail = f"ledger {request.ledger_id} is still in use by {topic}"
        else:
            detail = f"ledger {request.ledger_id} is not in use by {topic}" + ("" if snap.topic_exists else " (topic gone)")
        return InUseVerdict(state, detail, cache_hit=hit, admin_calls=calls)


@dataclass
class SnapshotManifestOracle:
    """The bucket scheduler's manifest: `is_in_use(bucket_id)` is True while a bucket is live."""

    is_in_use: Callable[[int], bool]

    def check(self, request: PendingDeleteLedgerInfo) -> InUseVerdict:
        """Ask the manifest about the bucket id carried as ledgerId."""
        try:
            used = bool(self.is_in_use(request.ledger_id))
        except Exception as exc:
            raise StorageError(f"bucket manifest lookup bucket={request.ledger_id}: {exc}") from exc
        if used:
            return InUseVerdict(InUseState.IN_USE, f"bucket {request.ledger_id} is in the scheduler's manifest")
        return InUseVerdict(InUseState.NOT_IN_USE, f"bucket {request.ledger_id} is not in the scheduler's manifest")


@dataclass
class ComponentOracle:
    """Routes a request to the oracle for its component (default for the PIP's components)."""

    default: Optional[LedgerInUseOracle] = None
    by_component: Dict[LedgerComponent, LedgerInUseOracle] = field(default_factory=dict)

    def check(self, request: PendingDeleteLedgerInfo) -> InUseVerdict:
        """Delegate; InvalidRequestError when no oracle serves the component."""
        oracle = self.by_component.get(request.ledger_component, None)
        if oracle is None and request.ledger_component is not LedgerComponent.DELAYED_INDEX_BUCKET:
            oracle = self.default
        if oracle is None:
            raise InvalidRequestError(
                f"no in-use oracle configured for component {request.ledger_component.value}"
            )
        return oracle.check(request)
