"""`pulsar-lifecycle up`: the broker and the shipped functions as one local service; Ctrl-C stops
it, and a restart with the same --data-dir continues (a pending delayed message is released by
the next run)."""
from __future__ import annotations

import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.runtime.client import quiet_client
from support.cli import CLI, assert_no_client_log_lines, assert_one_line_error, cli_env, run_cli, run_json
from support.helpers import stop_process, wait_for
from support.paths import REPO

BROKER_LINE = re.compile(r"^broker (pulsar://\S+);")


class UpProcess:
    """A running `up`, its stdout collected line by line."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.lines: List[str] = []
        self.proc = subprocess.Popen([*CLI, "up", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, env=cli_env(tmp_path))
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def url(self, timeout: float = 120) -> str:
        """The broker URL `up` prints once everything started."""
        found: List[str] = []

        def printed() -> bool:
            found.extend(m.group(1) for m in map(BROKER_LINE.match, self.lines) if m)
            assert self.proc.poll() is None, self.stop()
            return bool(found)
        assert wait_for(printed, timeout=timeout, interval=0.2), self.lines
        return found[0]

    def stop(self, sig: int = signal.SIGINT) -> int:
        rc = stop_process(self.proc, sig, timeout=60)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        return rc

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines)


def _receive(consumer: pulsar.Consumer, into: List[bytes], want: int, timeout: float) -> bool:
    def more() -> bool:
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            return len(into) >= want
        consumer.acknowledge(m)
        into.append(m.data())
        return len(into) >= want
    return wait_for(more, timeout=timeout, interval=0)


def _delayed(url: str, tmp_path: Path, target: str, payload: str, delay: str) -> str:
    res = run_cli("delayed", "send", target, payload, "--in", delay, "--service-url", url, tmp_path=tmp_path, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


@pytest.mark.lite_only("up starts its own embedded broker here; test_up_on_an_external_broker covers both kinds")
def test_up_runs_every_shipped_function_and_a_restart_continues(broker, tmp_path, unique):
    data = tmp_path / "data"
    target = f"persistent://public/default/up-orders-{unique}"
    first = UpProcess(tmp_path, "--data-dir", str(data), "--refresh", "0.5")
    got: List[bytes] = []
    try:
        url = first.url()
        # a second `up` on the same data dir is refused with one line naming the holder
        assert_one_line_error(run_cli("up", "--data-dir", str(data), "--run-seconds", "1", tmp_path=tmp_path,
                                      cwd=REPO), "in use by another localrun", "process")
        client = quiet_client(url)
        consumer = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        try:
            _delayed(url, tmp_path, target, "soon", "1s")
            assert _receive(consumer, got, 1, 60), got
            _delayed(url, tmp_path, target, "later", "20s")
        finally:
            consumer.close()
            client.close()
    finally:
        rc = first.stop()
    assert rc == 0, first.stderr[-3000:]
    assert got == [b"soon"]
    out = first.stdout
    for name in ("bucket-snapshot-writer", "delay-level-syncer", "ledger-deletion-worker", "example-function"):
        assert re.search(rf"{name}\S*\s*│\s*\d+/\d+", out), out
    # the shipped set: one config per name, and it joins up (nothing skipped, no dead end)
    assert "skipped" not in out and "dead end" not in out and "stopped" in out
    assert_no_client_log_lines(first)
    assert "Traceback" not in first.stderr
    # stopped: the index still holds the later message
    report = run_json("inspect", "writer", "--data-dir", str(data), "--json", tmp_path=tmp_path, cwd=REPO)
    assert report["pending"] == 1
    second = UpProcess(tmp_path, "--data-dir", str(data), "--refresh", "0.5")
    try:
        url = second.url()
        client = quiet_client(url)
        consumer = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        try:
            assert _receive(consumer, got, 2, 90), got
        finally:
            consumer.close()
            client.close()
    finally:
        rc = second.stop(signal.SIGTERM)
    assert rc == 0, second.stderr[-3000:]
    assert got == [b"soon", b"later"]
    assert_no_client_log_lines(second)


def _config(tmp_path: Path, name: str, unique: str, edit: Dict[str, Any], user: Optional[Dict[str, Any]] = None) -> Path:
    cfg = load_function_config(REPO / "function-configs" / f"{name}.yaml")
    cfg.update(edit)
    cfg["name"] = f"{cfg['name']}-{unique}"
    cfg["userConfig"] = dict(cfg.get("userConfig") or {}, **(user or {}))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _example_and_writer(tmp_path: Path, unique: str) -> Tuple[Path, Path]:
    """The shipped example function and writer configs on this test's topics (in-/out-/ticks-/
    sched-/released-<unique> in public/default)."""
    ns = "persistent://public/default"
    example = _config(tmp_path, "example-function", unique,
                      {"inputs": [f"{ns}/in-{unique}"], "output": f"{ns}/out-{unique}", "subName": f"ex-{unique}"})
    writer = _config(tmp_path, "bucket-snapshot-writer", unique,
                     {"inputSpecs": {f"{ns}/ticks-{unique}": {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}},
                      "output": f"{ns}/released-{unique}"},
                     {"tickTopic": f"{ns}/ticks-{unique}", "schedulingTopic": f"{ns}/sched-{unique}"})
    return example, writer


def test_up_on_an_external_broker(broker, tmp_path, unique):
    ns = "persistent://public/default"
    example, writer = _example_and_writer(tmp_path, unique)
    up = UpProcess(tmp_path, "--broker-service-url", broker.service_url, "--function-config-file", str(example),
                   "--function-config-file", str(writer), "--data-dir", str(tmp_path / "data"))
    got: List[bytes] = []
    try:
        assert up.url() == broker.service_url
        client = quiet_client(broker.service_url)
        out = client.subscribe(f"{ns}/out-{unique}", "check", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest)
        try:
            client.create_producer(f"{ns}/in-{unique}").send(b"hello")
            assert _receive(out, got, 1, 60), got
        finally:
            out.close()
            client.close()
    finally:
        rc = up.stop(signal.SIGTERM)
    assert rc == 0, up.stderr[-3000:]
    assert got == [b"hello!"]
    assert re.search(rf"example-function-{re.escape(unique)}\S*\s*│\s*1/1\s*│\s*1\s*│\s*1", up.stdout), up.stdout
    assert_no_client_log_lines(up)


def test_up_errors_are_one_line_before_anything_starts(tmp_path, silent_broker):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("up", "--config-dir", str(tmp_path / "empty"), tmp_path=tmp_path), "no *.yaml")
    assert_one_line_error(run_cli("up", "--broker-service-url", "localhost:6650", tmp_path=tmp_path, cwd=REPO),
                          "--broker-service-url")
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "function-configs" / "example-function.yaml").read_text().replace("prefix:", "prefixx:"))
    res = run_cli("up", "--function-config-file", str(bad), "--data-dir", str(tmp_path / "d"), tmp_path=tmp_path)
    assert res.returncode == 1 and "prefixx" in res.stderr and "nothing started" in res.stderr, res.stderr
    assert_one_line_error(run_cli("up", "--broker-service-url", silent_broker.url, "--function-config-file",
                                  str(REPO / "function-configs" / "example-function.yaml"), "--data-dir",
                                  str(tmp_path / "d"), tmp_path=tmp_path), silent_broker.url, "did not answer")


def _scrape(url: str) -> Dict[str, Dict[str, float]]:
    """{family name: {sample name and labels: value}} of one scrape (the text must parse: no name twice)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: Dict[str, Dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"{family.name} twice in one scrape"
        out[family.name] = {f"{s.name}{sorted(s.labels.items())}": s.value for s in family.samples}
    return out


@pytest.mark.lite_only("the endpoint is up's own, whatever the broker")
def test_up_metrics_port_serves_every_function_with_the_writer_lateness(broker, tmp_path, unique):
    ns = "persistent://public/default"
    example, writer = _example_and_writer(tmp_path, unique)
    up = UpProcess(tmp_path, "--broker-service-url", broker.service_url, "--function-config-file", str(example),
                   "--function-config-file", str(writer), "--data-dir", str(tmp_path / "data"), "--metrics-port", "0")
    writer_fqfn, example_fqfn = f"public/default/bucket-snapshot-writer-{unique}", f"public/default/example-function-{unique}"
    try:
        up.url()
        line = re.compile(r"^metrics (http://127\.0\.0\.1:\d+/metrics)")
        found: List[str] = []
        assert wait_for(lambda: found.extend(m.group(1) for m in map(line.match, up.lines) if m) or found,
                        timeout=30, interval=0.2), up.lines
        res = run_cli("delayed", "send", f"{ns}/released-{unique}", "x", "--in", "1s", "--service-url",
                      broker.service_url, "--scheduling-topic", f"{ns}/sched-{unique}", tmp_path=tmp_path, cwd=REPO)
        assert res.returncode == 0, res.stderr[-2000:]
        seen: Dict[str, Dict[str, float]] = {}

        def released_and_recorded() -> bool:
            seen.clear()
            seen.update(_scrape(found[0]))
            count = seen.get("pulsar_lifecycle_scheduler_release_lateness_ms_count", {})
            return any(v >= 1 for v in count.values())
        assert wait_for(released_and_recorded, timeout=60, interval=0.5), sorted(seen)
        received = seen["pulsar_function_received"]  # both functions, one family (counters exist from the start)
        assert any(example_fqfn in k for k in received) and any(writer_fqfn in k for k in received), received
        assert "pulsar_lifecycle_scheduler_pending" in seen
        assert any("le', '+Inf'" in k for k in seen["pulsar_lifecycle_scheduler_release_lateness_ms_bucket"])
    finally:
        rc = up.stop(signal.SIGTERM)
    assert rc == 0, up.stderr[-3000:]
