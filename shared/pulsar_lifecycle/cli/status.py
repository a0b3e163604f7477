"""The status view of `up`: per function, whether it runs, messages in and out, pending, lag.

In and out come from each function's metrics in this process (the same registry `localrun
--metrics-port-start` serves): the runtime's counters, and the writer's and syncer's own
counters where their intake and output bypass the runtime. Pending and lag come from the
`inspect` views, refreshed in the background every `probe_interval_s` (they read stores and
topics): the writer's pending messages and how far its next release is overdue, the syncer's
parked messages and its largest forward lag. A column a function has no such number for shows
"-".
"""
from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from prometheus_client import CollectorRegistry
from rich.table import Table

from ..clock import wall_clock_ms
from ..runtime.client import make_client
from ..runtime.localrun import LocalRunner
from .common import InspectError, open_state_reader
from .syncer_view import inspect_syncer
from .up import SYNCER, WORKER, WRITER, LocalService
from .writer_view import inspect_writer

log = logging.getLogger(__name__)

__all__ = ["FunctionStatus", "StatusBoard", "metric_total"]


@dataclass(frozen=True)
class FunctionStatus:
    """One row of the view."""

    name: str
    kind: str
    running: int
    instances: int
    messages_in: Optional[float]
    messages_out: Optional[float]
    pending: Optional[int]
    lag_ms: Optional[int]
    note: str = ""


def metric_total(registry: CollectorRegistry, name: str, **labels: str) -> Optional[float]:
    """The sum of every sample `name` with these labels (None when there is none yet)."""
    total, found = 0.0, False
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
                found = True
    return total if found else None


def metric_max(registry: CollectorRegistry, name: str) -> Optional[float]:
    """The largest sample `name` (None when there is none yet)."""
    values = [s.value for family in registry.collect() for s in family.samples if s.name == name]
    return max(values) if values else None


def _in_out(runner: LocalRunner, kind: str) -> tuple:
    reg = runner.metrics.registry if runner.metrics is not None else CollectorRegistry()
    if kind == WRITER:  # direct intake: the runtime's counter sees ticks only
        return (metric_total(reg, "pulsar_lifecycle_scheduler_received_total"),
                metric_total(reg, "pulsar_lifecycle_scheduler_released_total"))
    if kind == SYNCER:
        forwarded = metric_total(reg, "pulsar_delay_level_forwarded_total")
        dead = metric_total(reg, "pulsar_delay_level_dead_lettered_total") or 0.0
        cancelled = metric_total(reg, "pulsar_delay_level_cancelled_total") or 0.0
        taken = None if forwarded is None else forwarded + dead + cancelled
        return taken, forwarded
    if kind == WORKER:  # out: requests done (deleted or already gone); dead letters are not (note)
        done = [user_metric_total(reg, f"ledger_deletion_{k}") for k in ("deleted", "already_gone")]
        return (metric_total(reg, "pulsar_function_received_total"),
                None if all(v is None for v in done) else sum(v or 0.0 for v in done))
    return (metric_total(reg, "pulsar_function_received_total"),
            metric_total(reg, "pulsar_function_processed_successfully_total"))


def user_metric_total(registry: CollectorRegistry, metric: str) -> Optional[float]:
    """The total a function recorded under `metric` (the user-metric Summary's sum; for a
    running total or a level recorded repeatedly it is not the value: use the gauge)."""
    return metric_total(registry, "pulsar_function_user_metric_sum", metric=metric)


def _worker_note(runner: LocalRunner) -> str:
    """Dead letters and retries of a deletion worker, apart from what it deleted."""
    reg = runner.metrics.registry if runner.metrics is not None else CollectorRegistry()
    dead = user_metric_total(reg, "ledger_deletion_dead_lettered") or 0.0
    retried = user_metric_total(reg, "ledger_deletion_retried") or 0.0
    parts = [f"{int(dead)} dead-lettered: `deletion dlq list`"] if dead else []
    if retried:
        parts.append(f"{int(retried)} retried")
    return "; ".join(parts + ["pending: `inspect deletion`"])


class StatusBoard:
    """Rows for the status view of a running LocalService, with a background prober."""

    def __init__(self, service: LocalService, probe_interval_s: float = 5.0) -> None:
        self.service = service
        self.probe_interval_s = probe_interval_s
        self._probed: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "StatusBoard":
        """Start the background prober (probes once at once)."""
        self._thread = threading.Thread(target=self._run, name="up-status-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the prober and wait for it (a probe in flight finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _probes(self) -> Dict[str, Callable[[], Dict[str, Any]]]:
        out: Dict[str, Callable[[], Dict[str, Any]]] = {}
        for plan in self.service.plans:
            spec = plan.spec
            if spec.class_name == WRITER:
                out[spec.name] = functools.partial(self._probe_writer, spec)
            elif spec.class_name == SYNCER:
                out[spec.name] = functools.partial(self._probe_syncer, spec)
        return out

    def _probe_writer(self, spec: Any) -> Dict[str, Any]:
        report = inspect_writer(spec, data_dir=Path(self.service.data_dir),
                                state_url=self.service.state_storage_service_url)
        heads = [r.index.next_release_ms for r in report.indexes if r.index is not None and r.index.next_release_ms]
        now = wall_clock_ms()
        return {"pending": report.pending, "lag_ms": max(0, now - min(heads)) if heads else 0}

    def _probe_syncer(self, spec: Any) -> Dict[str, Any]:
        state = open_state_reader(spec, Path(self.service.data_dir), self.service.state_storage_service_url)
        client = make_client(self.service.client_settings)
        try:
            report = inspect_syncer(spec, client, state, timeout_s=self.probe_interval_s * 2)
        finally:
            client.close()
            if state is not None:
                state.close()
        return {"pending": report.parked}

    def _run(self) -> None:
        probes = self._probes()
        while not self._stop.is_set():
            for name, probe in probes.items():
                if self._stop.is_set():
                    return
                try:
                    result = probe()
                except InspectError:  # the function has not written its store or state yet
                    result = {"note": "starting: nothing stored yet"}
                except Exception as exc:  # a store mid-write or a broker hiccup: shown, retried next round
                    log.debug("event=up_probe_failed function=%s error=%r", name, exc)
                    result = {"note": f"probe: {type(exc).__name__}"}
                with self._lock:
                    self._probed[name] = result
            self._stop.wait(self.probe_interval_s)

    def rows(self) -> list:
        """The current status of every function."""
        out = []
        for plan in self.service.plans:
            spec = plan.spec
            runner = self.service.runners.get(spec.name)
            with self._lock:
                probed = dict(self._probed.get(spec.name, {}))
            if runner is None:
                out.append(FunctionStatus(spec.name, spec.class_name, 0, int(spec.parallelism or 1), None, None,
                                          None, None, "stopped"))
                continue
            msg_in, msg_out = _in_out(runner, spec.class_name)
            lag = probed.get("lag_ms")
            if spec.class_name == SYNCER and runner.metrics is not None:
                forward_lag = metric_max(runner.metrics.registry, "pulsar_delay_level_forward_lag_ms")
                lag = int(forward_lag) if forward_lag is not None else None
            note = probed.get("note", "")
            if spec.class_name == WORKER and not note:
                note = _worker_note(runner)
            out.append(FunctionStatus(spec.name, spec.class_name, runner.instances_running(),
                                      int(spec.parallelism or 1), msg_in, msg_out, probed.get("pending"), lag, note))
        return out

    def table(self) -> Table:
        """The rows as a rich table."""
        table = Table(title=f"pulsar-lifecycle up: broker {self.service.service_url}, data {self.service.data_dir}",
                      title_justify="left", caption="Ctrl-C stops everything; the next `up` with this --data-dir "
                                                    "continues", caption_justify="left")
        for col in ("function", "running", "in", "out", "pending", "lag", "note"):
            table.add_column(col, justify="left" if col in ("function", "note") else "right")
        for r in self.rows():
            state = f"{r.running}/{r.instances}" if r.running else f"[red]0/{r.instances}[/red]"
            table.add_row(r.name, state, _num(r.messages_in), _num(r.messages_out),
                          "-" if r.pending is None else str(r.pending),
                          "-" if r.lag_ms is None else f"{r.lag_ms / 1000:.1f} s", r.note)
        return table


def _num(value: Optional[float]) -> str:
    return "-" if value is None else str(int(value))
