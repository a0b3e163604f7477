"""Each alert in deploy/prometheus/alerts.yml fires on the condition it names, and not without it,
evaluated by Prometheus' own rule evaluator (`promtool test rules`; Debian's `prometheus` package,
which scripts/setup.sh test installs).

The inputs are the series the runtimes export (support/exported_metrics.py): a value a function
records every metricsIntervalSeconds is a series of the user-metric Summary, whose `_count` grows
by one and `_sum` by the value at each recording (here: one recording a minute).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence

import pytest
import yaml

from support.paths import REPO

ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
MINUTES = 45
WRITER = "public/default/bucket-snapshot-writer"
SYNCER = "public/default/delay-level-syncer"
WORKER = "pulsar/system/ledger-deletion-worker"
FQFNS = (WRITER, SYNCER, WORKER)


def _values(values: Sequence[float]) -> str:
    return " ".join(f"{v:g}" for v in values)


def recorded(fqfn: str, metric: str, values: Sequence[float]) -> List[Dict[str, str]]:
    """The user-metric Summary series of `metric` recorded once a minute with `values`."""
    quoted = metric.replace('"', '\\"')
    labels = f'fqfn="{fqfn}",metric="{quoted}"'
    sums, total = [], 0.0
    for v in values:
        total += v
        sums.append(total)
    return [{"series": f"pulsar_function_user_metric_sum{{{labels}}}", "values": _values(sums)},
            {"series": f"pulsar_function_user_metric_count{{{labels}}}", "values": _values(range(1, len(values) + 1))}]


def level(v: float) -> List[float]:
    return [v] * MINUTES


def growing(per_minute: float) -> List[float]:
    """A running total growing by `per_minute`."""
    return [per_minute * i for i in range(MINUTES)]


def counter(fqfn: str, name: str, per_minute: float) -> Dict[str, str]:
    return {"series": f'{name}{{fqfn="{fqfn}"}}', "values": f"0+{per_minute:g}x{MINUTES}"}


def running(*fqfns: str) -> List[Dict[str, str]]:
    """The runtime's counters of instances that run (and receive nothing)."""
    return [counter(f, "pulsar_function_received_total", 0) for f in fqfns]


@dataclass
class Case:
    """Series, and the alerts (with their labels besides alertname and severity) expected at `at`."""

    alert: str
    series: List[Dict[str, str]]
    fires: List[Dict[str, str]] = field(default_factory=list)
    at: str = "40m"


LATE = "pulsar_lifecycle_scheduler_release_lateness_ms"
CASES: List[Case] = [
    Case("PulsarLifecycleFunctionExceptions",
         running(*FQFNS) + [counter(WRITER, "pulsar_function_user_exceptions_total", 1),
                            counter(WRITER, "pulsar_function_system_exceptions_total", 0)], [{"fqfn": WRITER}]),
    Case("PulsarLifecycleFunctionExceptions",
         running(*FQFNS) + [counter(WRITER, "pulsar_function_user_exceptions_total", 0),
                            counter(WRITER, "pulsar_function_system_exceptions_total", 0)]),
    Case("PulsarLifecycleWriterCannotPersist",
         running(*FQFNS) + recorded(WRITER, "pulsar_lifecycle_scheduler_persist_failures", [1] * 3), [{"fqfn": WRITER}],
         at="3m"),
    Case("PulsarLifecycleWriterCannotPersist", running(*FQFNS), at="3m"),
    # the instance runs (its series are there) and records no index metric any more
    Case("PulsarLifecycleWriterNotRunning",
         running(*FQFNS) + [{"series": f'pulsar_function_user_metric_count{{fqfn="{WRITER}",'
                                       f'metric="pulsar_delayed_message_index_loaded"}}', "values": f"7x{MINUTES}"}],
         [{"fqfn": WRITER}]),
    Case("PulsarLifecycleWriterNotRunning",
         running(*FQFNS) + recorded(WRITER, "pulsar_delayed_message_index_loaded", level(1))),
    # instances gone: no series at all
    Case("PulsarLifecycleFunctionGone", running(SYNCER), [{"fqfn": WRITER}, {"fqfn": WORKER}], at="10m"),
    Case("PulsarLifecycleFunctionGone", running(*FQFNS), at="10m"),
    # 10% of the releases later than a second; then every release on time
    Case("PulsarLifecycleWriterReleasesLate",
         running(*FQFNS) + recorded(WRITER, f"{LATE}_count", growing(600))
         + recorded(WRITER, f"{LATE}_bucket{{le=1000}}", growing(540)), [{"fqfn": WRITER}]),
    Case("PulsarLifecycleWriterReleasesLate",
         running(*FQFNS) + recorded(WRITER, f"{LATE}_count", growing(600))
         + recorded(WRITER, f"{LATE}_bucket{{le=1000}}", growing(600))),
    Case("PulsarLifecycleWriterRefusesMessages",
         running(*FQFNS) + recorded(WRITER, "pulsar_lifecycle_scheduler_invalid_total", growing(3)), [{"fqfn": WRITER}]),
    Case("PulsarLifecycleWriterRefusesMessages",
         running(*FQFNS) + recorded(WRITER, "pulsar_lifecycle_scheduler_invalid_total", level(3))),
    Case("PulsarLifecycleWriterTargetRefused",
         running(*FQFNS) + recorded(WRITER, "pulsar_lifecycle_scheduler_held_targets", level(1)), [{"fqfn": WRITER}]),
    Case("PulsarLifecycleWriterTargetRefused",
         running(*FQFNS) + recorded(WRITER, "pulsar_lifecycle_scheduler_dead_lettered_total", growing(3)),
         [{"fqfn": WRITER}]),
    Case("PulsarLifecycleWriterTargetRefused",
         running(*FQFNS) + recorded(WRITER, "pulsar_lifecycle_scheduler_held_targets", level(0))
         + recorded(WRITER, "pulsar_lifecycle_scheduler_dead_lettered_total", level(3))),
    Case("PulsarLifecycleBucketOperationsFailing",
         running(*FQFNS) + recorded(WRITER, "pulsar_delayed_message_index_bucket_op_count{type=create,state=failed}",
                                    growing(1)),
         [{"fqfn": WRITER, "metric": "pulsar_delayed_message_index_bucket_op_count{type=create,state=failed}"}]),
    Case("PulsarLifecycleBucketOperationsFailing",
         running(*FQFNS) + recorded(WRITER, "pulsar_delayed_message_index_bucket_op_count{type=create,state=failed}",
                                    level(2))),
    Case("PulsarLifecycleSyncerForwardsLate",
         running(*FQFNS) + recorded(SYNCER, 'pulsar_delay_level_forward_lag_ms{partition="3"}', level(90_000)),
         [{"fqfn": SYNCER}]),
    Case("PulsarLifecycleSyncerForwardsLate",
         running(*FQFNS) + recorded(SYNCER, 'pulsar_delay_level_forward_lag_ms{partition="3"}', level(2_000))),
    Case("PulsarLifecycleSyncerRetentionProblem",
         running(*FQFNS) + recorded(SYNCER, "pulsar_delay_level_retention_problems", level(1)), [{"fqfn": SYNCER}]),
    Case("PulsarLifecycleSyncerRetentionProblem",
         running(*FQFNS) + recorded(SYNCER, "pulsar_delay_level_retention_problems", level(0))),
    Case("PulsarLifecycleSyncerDeadLetters",
         running(*FQFNS) + recorded(SYNCER, "pulsar_delay_level_dead_lettered_total", growing(2)), [{"fqfn": SYNCER}]),
    Case("PulsarLifecycleSyncerDeadLetters",
         running(*FQFNS) + recorded(SYNCER, "pulsar_delay_level_dead_lettered_total", level(2))),
    # a forward refused for a while (a partition's stuck_ms level), or refused forwards dead-lettered
    Case("PulsarLifecycleSyncerForwardStuck",
         running(*FQFNS) + recorded(SYNCER, 'pulsar_delay_level_forward_stuck_ms{partition="2"}', growing(60_000)),
         [{"fqfn": SYNCER}]),
    Case("PulsarLifecycleSyncerForwardStuck",
         running(*FQFNS) + recorded(SYNCER, "pulsar_delay_level_forward_refused_dead_lettered_total", growing(1)),
         [{"fqfn": SYNCER}]),
    Case("PulsarLifecycleSyncerForwardStuck",
         running(*FQFNS) + recorded(SYNCER, 'pulsar_delay_level_forward_stuck_ms{partition="2"}', level(0))
         + recorded(SYNCER, "pulsar_delay_level_forward_refused_dead_lettered_total", level(4))),
    # the deletion worker records each event once, as it happens (value: how many)
    Case("PulsarLifecycleDeletionDeadLetters",
         running(*FQFNS) + recorded(WORKER, "ledger_deletion_dead_lettered", [1] * 20), [{"fqfn": WORKER}], at="15m"),
    Case("PulsarLifecycleDeletionDeadLetters", running(*FQFNS), at="15m"),
    Case("PulsarLifecycleDeletionOwnershipMismatch",
         running(*FQFNS) + recorded(WORKER, "ledger_deletion_ownership_mismatch", [1] * 20), [{"fqfn": WORKER}],
         at="15m"),
    Case("PulsarLifecycleDeletionOwnershipMismatch", running(*FQFNS), at="15m"),
]


def _rules() -> List[Dict[str, object]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _expected(case: Case, rules: List[Dict[str, object]]) -> List[Dict[str, object]]:
    out = []
    for labels in case.fires:
        # PulsarLifecycleFunctionGone has one rule per function: the one naming this fqfn
        rule = next(r for r in rules if r["alert"] == case.alert and labels.get("fqfn", "") in str(r["expr"])
                    or r["alert"] == case.alert and "absent(" not in str(r["expr"]))
        every = dict(labels, severity=str(rule["labels"]["severity"]))  # type: ignore[index]
        annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m, e=every: e[m.group(1)], str(v))
                       for k, v in dict(rule.get("annotations") or {}).items()}  # type: ignore[call-overload]
        out.append({"exp_labels": every, "exp_annotations": annotations})
    return out


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    names = {str(r["alert"]) for r in _rules()}
    fires = {c.alert for c in CASES if c.fires}
    quiet = {c.alert for c in CASES if not c.fires}
    assert names == fires == quiet, (names ^ fires, names ^ quiet)


def test_each_alert_fires_on_its_condition_under_promtool(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `scripts/setup.sh test` installs it (Debian package prometheus)")
    rules = _rules()
    tests = [{"interval": "1m", "input_series": case.series,
              "alert_rule_test": [{"eval_time": case.at, "alertname": case.alert,
                                   "exp_alerts": _expected(case, rules)}]} for case in CASES]
    (tmp_path / "rules.yml").write_text(ALERTS.read_text())
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                                      "tests": tests}, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
