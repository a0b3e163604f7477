"""What the functions export, found by running the code that records it, and what the
dashboard and alert rules ask for, found by reading their PromQL.

Recorded names come from the recorders themselves (the writer's metric_values and
counter_values, the syncer service's metrics(), DeletionMetrics.inc), so renaming a metric in the
code changes them. Series names come from two runtimes:

- local run mode (`localrun`, `up`): a FunctionMetrics registry fed every recorded name, scraped;
- Pulsar's Python function runtime: the series its instance exports (function_stats.py: the
  counters and their 1-minute twins, process latency, last invocation; contextimpl.py: the
  user-metric Summary `pulsar_function_user_metric`, labels tenant, namespace, name,
  instance_id, cluster, fqfn, and metric on user metrics).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Dict, List, Set, Tuple

from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, MemorySnapshotStorage
from pulsar_lifecycle.delaylevel.config import parse_syncer_config
from pulsar_lifecycle.delaylevel.forwarder import ForwarderStats
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.deletion.metrics import METRICS, DeletionMetrics
from pulsar_lifecycle.runtime.metrics import FunctionMetrics
from pulsar_lifecycle.scheduler.service import (
    HELD_RELEASES_METRIC,
    HELD_TARGETS_METRIC,
    PENDING_METRIC,
    PERSIST_FAILURES_METRIC,
    LatenessHistogram,
    SchedulerService,
    metric_values,
)

PULSAR_PYTHON_RUNTIME_SERIES: Set[str] = {
    "pulsar_function_processed_successfully_total", "pulsar_function_system_exceptions_total",
    "pulsar_function_user_exceptions_total", "pulsar_function_received_total",
    "pulsar_function_process_latency_ms", "pulsar_function_process_latency_ms_sum",
    "pulsar_function_process_latency_ms_count", "pulsar_function_last_invocation",
    "pulsar_function_processed_successfully_1min_total", "pulsar_function_system_exceptions_1min_total",
    "pulsar_function_user_exceptions_1min_total", "pulsar_function_received_1min_total",
    "pulsar_function_process_latency_ms_1min", "pulsar_function_process_latency_ms_1min_sum",
    "pulsar_function_process_latency_ms_1min_count",
    "pulsar_function_user_metric_sum", "pulsar_function_user_metric_count",
}
PULSAR_PYTHON_RUNTIME_LABELS: Set[str] = {"tenant", "namespace", "name", "instance_id", "cluster", "fqfn", "metric"}


class _Recorder:
    def __init__(self) -> None:
        self.names: List[str] = []

    def record_metric(self, name: str, value: float) -> None:
        self.names.append(name)


def recorded_user_metrics() -> Set[str]:
    """Every name the functions pass to context.record_metric (labels in braces included)."""
    names: Set[str] = {PERSIST_FAILURES_METRIC, PENDING_METRIC, HELD_TARGETS_METRIC, HELD_RELEASES_METRIC}
    names.update(name for name, _ in LatenessHistogram().values())
    engine = BucketIndex(MemorySnapshotStorage(), BucketConfig())
    engine.recover()
    names.update(name for name, _ in metric_values(engine.stats()))
    counters = SimpleNamespace(received=0, released=0, cancelled=0, invalid=0, dead_lettered=0)
    names.update(name for name, _ in SchedulerService.counter_values(counters))  # type: ignore[arg-type]
    cfg = parse_syncer_config({"delayLevelTopic": "persistent://public/default/t-delay-level",
                               "schedulingTopic": "persistent://public/default/s"})
    syncer = DelayLevelSyncerService(cfg, None, subscription="s", producer_prefix="p", state=None,  # type: ignore[arg-type]
                                     record_metric=lambda n, v: None)
    syncer.forwarders = [SimpleNamespace(k=0, stats=ForwarderStats())]  # type: ignore[list-item]
    names.update(syncer.metrics())
    recorder = _Recorder()
    deletion = DeletionMetrics()
    for key in METRICS:
        deletion.inc(key, 1, context=recorder)
    names.update(recorder.names)
    return names


def local_run_series(user_metrics: Set[str]) -> Tuple[Set[str], Set[str]]:
    """(series names, label names) a local-run FunctionMetrics exports once every runtime counter
    moved and every user metric was recorded."""
    metrics = FunctionMetrics("public/default/f")
    for counter in (metrics.received, metrics.processed, metrics.user_exceptions, metrics.system_exceptions):
        counter.labels("public/default/f", "0").inc()
    for name in sorted(user_metrics):
        metrics.record_user_metric(name, 1.0)
    series, labels = set(), set()
    for family in metrics.registry.collect():
        for sample in family.samples:
            series.add(sample.name)
            labels.update(sample.labels)
    return series, labels


# -- PromQL ---------------------------------------------------------------------------------------

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_MATCHER = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*")
_BY = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Selector:
    """One vector selector: a metric name and its label matchers (label, op, value)."""

    name: str
    matchers: Tuple[Tuple[str, str, str], ...]


def _string(expr: str, i: int) -> Tuple[str, int]:
    """The PromQL string literal starting at expr[i] (", ' or `), unescaped, and the index after it."""
    quote = expr[i]
    out, j = [], i + 1
    while expr[j] != quote:
        if quote != "`" and expr[j] == "\\":
            nxt = expr[j + 1]
            out.append({"n": "\n", "t": "\t"}.get(nxt, nxt) if nxt in "\"'\\nt" else "\\" + nxt)
            j += 2
            continue
        out.append(expr[j])
        j += 1
    return "".join(out), j + 1


def selectors(expr: str) -> List[Selector]:
    """Every selector of `expr` whose metric name starts with `pulsar_`."""
    found: List[Selector] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            _, i = _string(expr, i)
            continue
        m = _IDENT.match(expr, i)
        if not m or (i > 0 and (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
            i += 1
            continue
        name, i = m.group(0), m.end()
        matchers: List[Tuple[str, str, str]] = []
        j = i
        while j < len(expr) and expr[j] == " ":
            j += 1
        if j < len(expr) and expr[j] == "{":
            j += 1
            while True:
                while expr[j] in " ,":
                    j += 1
                if expr[j] == "}":
                    i = j + 1
                    break
                mm = _MATCHER.match(expr, j)
                assert mm, f"cannot parse a label matcher at {expr[j:j + 40]!r} in {expr!r}"
                value, j = _string(expr, mm.end())
                matchers.append((mm.group(1), mm.group(2), value))
        if name.startswith("pulsar_"):
            found.append(Selector(name, tuple(matchers)))
    return found


def grouping_labels(expr: str) -> Set[str]:
    """Label names in by(...), without(...), on(...) and the like."""
    return {label.strip() for group in _BY.findall(expr) for label in group.split(",") if label.strip()}


def problems(exprs: Dict[str, str], series_by_runtime: Dict[str, Set[str]], labels_by_runtime: Dict[str, Set[str]],
             user_metrics: Set[str]) -> List[str]:
    """Why an expression (name -> PromQL) asks for something a runtime does not export."""
    out: List[str] = []
    for where, expr in exprs.items():
        sels = selectors(expr)
        if not sels:
            out.append(f"{where}: no pulsar_* series in {expr!r}")
        for sel in sels:
            for runtime, series in series_by_runtime.items():
                if sel.name not in series:
                    out.append(f"{where}: {sel.name} is not exported under {runtime}")
            for label, op, value in sel.matchers:
                for runtime, labels in labels_by_runtime.items():
                    if label not in labels:
                        out.append(f"{where}: label {label} of {sel.name} is not exported under {runtime}")
                if label != "metric" or op not in ("=", "=~"):
                    continue
                if op == "=" and value not in user_metrics:
                    out.append(f"{where}: no function records the metric {value!r}")
                if op == "=~" and not any(re.fullmatch(value, name) for name in user_metrics):
                    out.append(f"{where}: no recorded metric matches {value!r}")
        for label in grouping_labels(expr):
            for runtime, labels in labels_by_runtime.items():
                if label not in labels:
                    out.append(f"{where}: grouping label {label} is not exported under {runtime}")
    return out
