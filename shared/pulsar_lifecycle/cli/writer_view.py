"""`inspect writer`: a BucketSnapshotWriter's index and dedup state, read without changing them.

Where the writer keeps them follows from its function config, as its wiring
(scheduler/factory.py) decides: the snapshot store is `snapshotDir`, or under `localrun`
`<data-dir>/buckets/<tenant>_<namespace>_<name>[-instance-<i>]`, or with `snapshotStorage:
bookkeeper` the table `<name>_buckets` of the table service; a partitioned writer keeps one index
per partition (`partition-<k>`). The function state (the dedup snapshot of the release publisher
and the id of the index it follows) is the function's state table: `<data-dir>/state/...` under
`localrun`, or the table service of `--state-storage-service-url`.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..bucket.inspection import IndexView, view_index
from ..bucket.storage import BucketSnapshotStorage, DirectorySnapshotStorage, bookkeeper_snapshot_reader
from ..dedup.publisher import snapshot_key
from ..dedup.sequence_map import DedupSnapshot, SnapshotFormatError
from ..exceptions import PulsarLifecycleError
from ..scheduler.config import WriterConfig, parse_writer_config, scheduling_input
from ..scheduler.context_state import ContextStateStore
from ..scheduler.factory import default_snapshot_dir
from ..scheduler.index_identity import STATE_KEY
from ..scheduler.partition_assignment import partition_label
from ..scheduler.service import STATUS_KEY
from ..state import StateStore
from ..topics import normalize_topic
from .common import InspectError, StateReader, open_state_reader

log = logging.getLogger(__name__)

__all__ = ["DedupView", "WriterIndexReport", "WriterReport", "inspect_writer", "read_dedup", "report_dict"]


@dataclass(frozen=True)
class DedupView:
    """The release publisher's dedup snapshot: the highest sequence id it knew on the topic."""

    producer: str
    topic: str
    highest_seq: Optional[int]  # None: no snapshot stored yet
    position: Optional[str]  # the output topic position the snapshot is exact up to
    index_id: Optional[str]  # the index id the dedup state follows
    problem: str = ""


@dataclass(frozen=True)
class WriterIndexReport:
    """One index of the writer (an instance's, or a partition's)."""

    label: str  # "instance-<i>" or "partition-<k>"
    store: str  # where the index lives
    index: Optional[IndexView]
    dedup: Optional[DedupView]
    problem: str = ""
    # Targets whose releases the writer holds (it cannot publish to them): target, reason, held,
    # since_ms, attempts, next_try_ms; from the status the release thread stores while one is held.
    held_targets: List[Dict[str, Any]] = field(default_factory=list)
    dead_lettered: int = 0
    dead_letter_topic: str = ""

    @property
    def identity_ok(self) -> Optional[bool]:
        """Whether the index is the one the dedup state follows (None: unknown)."""
        if self.index is None or self.dedup is None or not self.dedup.index_id or not self.index.index_id:
            return None
        return self.dedup.index_id == self.index.index_id


@dataclass
class WriterReport:
    """Everything `inspect writer` shows."""

    fqfn: str
    output: str
    indexes: List[WriterIndexReport] = field(default_factory=list)

    @property
    def pending(self) -> int:
        """Pending messages over every index."""
        return sum(r.index.pending for r in self.indexes if r.index is not None)

    @property
    def problem(self) -> str:
        """What is wrong, over every index ("" when nothing is known to be)."""
        return "; ".join(f"{r.label}: {r.problem}" for r in self.indexes if r.problem)


def read_release_status(state: Optional[StateStore], prefix: str) -> Dict[str, Any]:
    """The release status the writer stores while a target is held (empty: none stored)."""
    if state is None:
        return {}
    raw = ContextStateStore(StateReader(state), prefix=prefix).get(STATUS_KEY)
    if raw is None:
        return {}
    try:
        status = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def held_problem(held: List[Dict[str, Any]], now_ms: int) -> str:
    """One line naming the targets the writer holds releases for."""
    parts = []
    for h in held:
        since = h.get("since_ms")
        age = f" for {max(0, now_ms - int(since)) / 1000:.0f} s" if since is not None else ""
        parts.append(f"target {h.get('target')} refuses releases{age} ({h.get('held', 0)} held, "
                     f"{h.get('attempts', 0)} attempts): {h.get('reason', '')}")
    return "; ".join(parts)


@dataclass(frozen=True)
class _Identity:
    """The Context methods default_snapshot_dir reads: the writer's identity and --data-dir."""

    tenant: str
    namespace: str
    name: str
    instance: int
    data_dir: Path

    def get_function_tenant(self) -> str:
        return self.tenant

    def get_function_namespace(self) -> str:
        return self.namespace

    def get_function_name(self) -> str:
        return self.name

    def get_instance_id(self) -> int:
        return self.instance


def read_dedup(state: Optional[StateStore], prefix: str, producer: str, topic: str) -> DedupView:
    """The dedup snapshot and the followed index id kept under `prefix` in the function state."""
    if state is None:
        return DedupView(producer, topic, None, None, None, problem="no function state found")
    store = ContextStateStore(StateReader(state), prefix=prefix)
    raw_id = store.get(STATE_KEY)
    index_id = raw_id.decode("ascii", "replace").strip() if raw_id is not None else None
    raw = store.get(snapshot_key(producer, topic))
    if raw is None:
        return DedupView(producer, topic, None, None, index_id)
    try:
        snap = DedupSnapshot.from_bytes(raw)
    except SnapshotFormatError as exc:
        return DedupView(producer, topic, None, None, index_id, problem=f"unreadable dedup snapshot: {exc}")
    pos = snap.position
    where = f"{pos.ledger_id}:{pos.entry_id}:{pos.batch_index}" if pos is not None else None
    return DedupView(producer, topic, snap.producers.get(producer), where, index_id)


def _open_store(cfg: WriterConfig, ident: _Identity, label: Optional[str], store_override: Optional[str],
                partitioned: bool) -> BucketSnapshotStorage:
    # `auto` with snapshotStorageServiceUrl is that table service too (scheduler/snapshot_location.py).
    on_table_service = cfg.snapshot_storage == "bookkeeper" or (
        cfg.snapshot_storage == "auto" and bool(cfg.snapshot_storage_service_url) and not cfg.snapshot_dir)
    if on_table_service and not store_override:
        return bookkeeper_snapshot_reader(cfg.snapshot_storage_service_url, ident.tenant, ident.namespace,
                                          ident.name, label)
    if store_override:
        base = Path(store_override)
    elif cfg.snapshot_dir:
        base = Path(cfg.snapshot_dir)
    else:
        base = default_snapshot_dir(ident, per_instance=not partitioned)
    root = base / label if (partitioned and label) else base
    if not (root / "snapshots").is_dir():
        raise InspectError(f"no bucket snapshot store at {root} (the writer has not run with this "
                           "--data-dir / snapshotDir, or --store points elsewhere)")
    return DirectorySnapshotStorage(root)


def _describe(storage: BucketSnapshotStorage) -> str:
    describe = getattr(storage, "describe", None)
    return describe() if callable(describe) else repr(storage)


def inspect_writer(spec: Any, *, data_dir: Path, state_url: Optional[str] = None,
                   store: Optional[str] = None) -> WriterReport:
    """Read every index of the writer `spec` (a FunctionSpec) and its dedup state.

    Args:
        spec: the writer's function config (FunctionSpec).
        data_dir: its `localrun --data-dir` (default store and state locations).
        state_url: `bk://host:port` of the table service holding its function state.
        store: a snapshot store directory that replaces the configured one (one index).
    """
    fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
    try:
        scheduling, _direct = scheduling_input(spec.inputs, spec.user_config or {})
        cfg = parse_writer_config(spec.user_config or {}, topic=scheduling, cursor=fqfn)
    except ValueError as exc:
        raise InspectError(f"{fqfn} is not a BucketSnapshotWriter config: {exc}") from exc
    if not spec.output:
        raise InspectError(f"{fqfn} has no output topic: not a BucketSnapshotWriter config")
    output = normalize_topic(spec.output)
    report = WriterReport(fqfn, output)
    partitioned = cfg.scheduling_topic_partitions > 0
    # The names below are the writer's own (scheduler/factory.py build_service / _build_partitioned).
    if partitioned:
        units = [(partition_label(k), 0, f"dedup/{partition_label(k)}/",
                  f"{cfg.producer_name}-{partition_label(k)}" if cfg.producer_name
                  else f"{fqfn}-{partition_label(k)}-release") for k in range(cfg.scheduling_topic_partitions)]
    else:
        count = 1 if store else max(1, int(spec.parallelism or 1))
        units = [(f"instance-{i}", i, f"dedup/{i}/", cfg.producer_name or f"{fqfn}-{i}-release") for i in range(count)]
    state = open_state_reader(spec, data_dir, state_url)
    try:
        for label, instance, prefix, producer in units:
            ident = _Identity(spec.tenant, spec.namespace, spec.name, instance, Path(data_dir))
            dedup = read_dedup(state, prefix, producer, output)
            status = read_release_status(state, prefix)
            held = list(status.get("held_targets") or [])
            extra: Dict[str, Any] = {"held_targets": held, "dead_lettered": int(status.get("dead_lettered") or 0),
                     "dead_letter_topic": str(status.get("dead_letter_topic") or "")}
            stuck = held_problem(held, int(status.get("at_ms") or 0))
            try:
                storage = _open_store(cfg, ident, label if partitioned else None, store, partitioned)
            except PulsarLifecycleError as exc:
                report.indexes.append(WriterIndexReport(label, "", None, dedup, problem="; ".join(
                    p for p in (str(exc), stuck) if p), **extra))
                continue
            try:
                report.indexes.append(WriterIndexReport(label, _describe(storage), view_index(storage), dedup,
                                                        problem=stuck, **extra))
            finally:
                storage.close()
    finally:
        if state is not None:
            state.close()
    if all(r.index is None for r in report.indexes):
        raise InspectError("; ".join(sorted({r.problem for r in report.indexes})) or f"{fqfn}: nothing to inspect")
    return report


def report_dict(report: WriterReport) -> Dict[str, Any]:
    """The JSON form of a WriterReport."""
    out: Dict[str, Any] = {"function": report.fqfn, "output": report.output, "pending": report.pending,
                           "problem": report.problem, "indexes": []}
    for r in report.indexes:
        item: Dict[str, Any] = {"label": r.label, "store": r.store, "problem": r.problem,
                                "identity_ok": r.identity_ok, "held_targets": r.held_targets,
                                "dead_lettered": r.dead_lettered, "dead_letter_topic": r.dead_letter_topic}
        if r.index is not None:
            idx = asdict(r.index)
            idx["snapshot_bytes"] = r.index.snapshot_bytes
            idx["oldest_pending"] = str(r.index.oldest_pending) if r.index.oldest_pending else None
            item["index"] = idx
        item["dedup"] = asdict(r.dedup) if r.dedup is not None else None
        out["indexes"].append(item)
    return out
