"""The Grafana dashboard and the Prometheus alert rules in deploy/ ask only for what the code exports.

Every series a query names must exist under local run mode (`localrun`, `up`) and under Pulsar's
Python function runtime, every label it matches or groups by must be one both attach, and every
`metric="..."` (or `metric=~...`) must be a name some function records. The recorded names are
found by running the recorders (support/exported_metrics.py), so renaming a metric in the code
fails this test until the dashboard and the rules follow.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator

import pytest
import yaml

from support.exported_metrics import (
    PULSAR_PYTHON_RUNTIME_LABELS,
    PULSAR_PYTHON_RUNTIME_SERIES,
    local_run_series,
    problems,
    recorded_user_metrics,
    selectors,
)
from support.paths import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "pulsar-lifecycle.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"


def _panel_exprs(panels: Any) -> Iterator[tuple]:
    for panel in panels:
        yield from _panel_exprs(panel.get("panels", []))
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]


def dashboard_exprs() -> Dict[str, str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = dict(_panel_exprs(doc["panels"]))
    for var in doc["templating"]["list"]:
        if var.get("type") == "query":
            exprs[f"variable {var['name']}"] = var["definition"].replace("label_values(", "").split(",")[0] + "{}"
    return exprs


def alert_exprs() -> Dict[str, str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {f"alert {rule['alert']}": rule["expr"] for group in doc["groups"] for rule in group["rules"]}


@pytest.fixture(scope="module")
def exported() -> Dict[str, Any]:
    user = recorded_user_metrics()
    local_series, local_labels = local_run_series(user)
    return {"user": user,
            "series": {"local run mode": local_series, "Pulsar's Python runtime": PULSAR_PYTHON_RUNTIME_SERIES},
            "labels": {"local run mode": local_labels, "Pulsar's Python runtime": PULSAR_PYTHON_RUNTIME_LABELS}}


def test_the_recorders_name_every_function_s_metrics(exported):
    user = exported["user"]
    for name in ("pulsar_lifecycle_scheduler_released_total", "pulsar_delayed_message_index_loaded",
                 "pulsar_delay_level_forwarded_total", 'pulsar_delay_level_forward_lag_ms{partition="0"}',
                 "ledger_deletion_dead_lettered", "pulsar_delayed_message_index_bucket_op_count{type=create,state=failed}"):
        assert name in user
    # local run mode exports the Summary as Pulsar's Python instance names it (one underscore)
    assert {"pulsar_function_user_metric_sum", "pulsar_function_user_metric_count"} <= exported["series"]["local run mode"]


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_query_asks_for_exported_series_labels_and_metrics(exported, source):
    exprs = dashboard_exprs() if source == "dashboard" else alert_exprs()
    assert len(exprs) >= (20 if source == "dashboard" else 8)
    found = problems(exprs, exported["series"], exported["labels"], exported["user"])
    assert found == [], "\n".join(found)


def test_a_renamed_metric_is_caught(exported):
    """The check itself: a metric the code no longer records, or a series one runtime lacks, is reported."""
    exprs = alert_exprs()
    renamed = {n for n in exported["user"] if n != "ledger_deletion_ownership_mismatch"} | {"ledger_deletion_owner_mismatch"}
    found = problems(exprs, exported["series"], exported["labels"], renamed)
    assert any("ledger_deletion_ownership_mismatch" in p for p in found), found
    java_like = {k: {s.replace("user_metric_", "user_metric__") for s in v} for k, v in exported["series"].items()}
    assert any("pulsar_function_user_metric_count is not exported" in p for p in
               problems(exprs, java_like, exported["labels"], exported["user"]))


def test_the_promql_reader_sees_names_labels_and_strings():
    sels = selectors('sum by (fqfn) (rate(pulsar_function_user_metric_sum{fqfn=~"$fqfn",metric=~`a\\{b=".*"\\}`}[5m]))'
                     ' / pulsar_function_received_total')
    assert [s.name for s in sels] == ["pulsar_function_user_metric_sum", "pulsar_function_received_total"]
    assert sels[0].matchers == (("fqfn", "=~", "$fqfn"), ("metric", "=~", 'a\\{b=".*"\\}'))
