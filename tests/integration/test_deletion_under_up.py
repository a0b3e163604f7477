"""`deletion enqueue` against `up` on the embedded broker: the worker `up` runs there has no in-use
oracle or bookie for a MANAGED_LEDGER ledger (pulsar-lite serves neither), so the request is
refused before anything is sent, saying what to set, instead of being dead-lettered by the worker
while the status view counted it as done; the phase-one delay goes through the worker's own
backend (the writer), not the broker's delayed delivery, which pulsar-lite ignores."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import List

import pytest
from prometheus_client import CollectorRegistry

from pulsar_lifecycle.cli.deletion_cli import WorkerTerms, resolve_delay
from pulsar_lifecycle.cli.status import _in_out, _worker_note
from pulsar_lifecycle.cli.up import WORKER
from pulsar_lifecycle.runtime.metrics import FunctionMetrics
from support.cli import CLI, cli_env, run_cli
from support.helpers import stop_process, wait_for
from support.paths import REPO


@pytest.mark.lite_only("up's embedded broker is pulsar-lite")
def test_enqueue_against_up_is_refused_before_sending_when_the_worker_cannot_serve_it(tmp_path):
    data = tmp_path / "data"
    configs = [REPO / "function-configs" / f for f in ("bucket-snapshot-writer.yaml", "ledger-deletion-worker.yaml")]
    args = [a for c in configs for a in ("--function-config-file", str(c))]
    proc = subprocess.Popen([*CLI, "up", *args, "--data-dir", str(data), "--metrics-port", "0"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True, env=cli_env(tmp_path))
    lines: List[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout or []), daemon=True).start()
    try:
        urls: List[str] = []
        assert wait_for(lambda: urls.extend(m.group(1) for m in map(re.compile(r"^broker (pulsar://\S+?);").match,
                                                                          lines) if m) or urls or proc.poll() is not None,
                        timeout=120, interval=0.2) and urls, lines
        assert (data / "up-functions.json").is_file()
        res = run_cli("deletion", "enqueue", "--topic", "public/default/orders", "--ledger-id", "5",
                      "--service-url", urls[0], "--data-dir", str(data), "--connect-timeout", "10",
                      tmp_path=tmp_path, cwd=REPO)
        assert res.returncode == 1, (res.stdout, res.stderr)
        err = " ".join(res.stderr.split())
        for needle in ("ledger 5 NOT enqueued", "pulsarAdminUrl", "bookieHttpUrls", "embedded broker",
                       "up --broker-service-url"):
            assert needle in err, err
        assert res.stdout == ""  # nothing was sent: no message id
        # A writer's snapshot (DELAYED_INDEX_BUCKET) is served here: the in-use oracle is the writer's
        # manifest. Bucket 77 is in no manifest and not stored: deleted as already gone, end to end.
        res = run_cli("deletion", "enqueue", "--topic", "public/default/delayed-scheduling", "--ledger-id", "77",
                      "--component", "DELAYED_INDEX_BUCKET", "--send-delay-seconds", "0", "--service-url", urls[0],
                      "--data-dir", str(data), "--connect-timeout", "10", tmp_path=tmp_path, cwd=REPO)
        assert res.returncode == 0, res.stderr[-2000:]
        assert any("bucketSnapshotHooks" in line for line in lines), lines
        found: List[str] = []
        assert wait_for(lambda: found.extend(m.group(1) for m in map(re.compile(r"^metrics (http://\S+)").match,
                                                                     lines) if m) or found, timeout=30, interval=0.2)
        metrics = found[0]

        def done() -> bool:
            text = urllib.request.urlopen(metrics, timeout=10).read().decode()
            return any(line.startswith("pulsar_function_user_metric_sum{") and "ledger_deletion_" in line
                       and ('already_gone"' in line or 'deleted"' in line or 'dead_lettered"' in line)
                       for line in text.splitlines())
        assert wait_for(done, timeout=60, interval=0.5)
    finally:
        rc = stop_process(proc, signal.SIGINT, timeout=60)
    assert rc == 0
    assert not (data / "up-functions.json").exists()  # removed when up stops
    row = next((line for line in reversed(lines) if "ledger-deletion-worker" in line), "")
    cells = [c.strip() for c in row.split("│")]
    assert cells[3:5] == ["1", "1"] and "dead-lettered" not in row, lines[-12:]  # in 1, out 1: deleted


def test_enqueue_delays_through_the_worker_backend_by_default():
    shipped = WorkerTerms("shipped", {"delayBackend": "scheduler",
                                      "schedulingTopic": "persistent://public/default/delayed-scheduling"},
                          authoritative=False)
    assert resolve_delay(None, None, shipped) == ("scheduler", "persistent://public/default/delayed-scheduling")
    assert resolve_delay("broker", None, shipped) == ("broker", None)
    assert resolve_delay(None, None, None) == ("broker", None)


class _Runner:
    def __init__(self, metrics: FunctionMetrics) -> None:
        self.metrics = metrics


def test_status_counts_dead_letters_apart_from_deletions():
    fqfn = "pulsar/system/ledger-deletion-worker"
    metrics = FunctionMetrics(fqfn, CollectorRegistry())
    metrics.received.labels(fqfn, "0").inc()
    metrics.processed.labels(fqfn, "0").inc()  # the worker acks a dead-lettered request too
    metrics.record_user_metric("ledger_deletion_dead_lettered", 1.0)
    runner = _Runner(metrics)
    assert _in_out(runner, WORKER) == (1.0, None)  # type: ignore[arg-type]
    assert _worker_note(runner).startswith("1 dead-lettered")  # type: ignore[arg-type]
    metrics.record_user_metric("ledger_deletion_deleted", 1.0)
    assert _in_out(runner, WORKER) == (1.0, 1.0)  # type: ignore[arg-type]


def test_up_manifest_names_only_its_own_broker(tmp_path: Path):
    from pulsar_lifecycle.cli.up_manifest import MANIFEST_NAME, running_function

    (tmp_path / MANIFEST_NAME).write_text(json.dumps({
        "broker": "pulsar://127.0.0.1:1", "embedded": True,
        "functions": [{"name": "w", "className": WORKER, "config": "c.yaml", "userConfig": {"x": 1}}]}))
    assert running_function(tmp_path, "pulsar://127.0.0.1:2", WORKER) is None
    found = running_function(tmp_path, "pulsar://127.0.0.1:1", WORKER)
    assert found is not None and found.embedded and found.user_config == {"x": 1}
