"""`pulsar-admin functions create` against this repository's reproduction of Pulsar's Python runtime.

`FunctionWorker.create(py, config_file)` does what `functions create` and a function worker with
the process runtime do with a Python function: the YAML becomes FunctionDetails
(`FunctionConfigUtils.convert`), the package is "downloaded" under its original file name into
a fresh directory per instance, and `parallelism` instances of
support/pulsar_python_instance/python_instance_main.py start with the command line of
`RuntimeUtils.getCmd`, `--state_storage_serviceurl` included when the worker has function state.
`restart(i)` starts instance i again in a new directory, as a worker elsewhere would.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from pulsar_lifecycle.config.function_config import load_function_config

INSTANCE_MAIN = Path(__file__).resolve().parent / "pulsar_python_instance" / "python_instance_main.py"
RUNNING_LINE = "event=instance_running"


def function_details(cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """FunctionDetails (proto3 JSON, defaults omitted as the worker's printer omits them) of a
    Python function config, as FunctionConfigUtils.convert builds them."""
    class_name = str(cfg["className"])
    specs: Dict[str, Dict[str, Any]] = {}
    for topic in cfg.get("inputs") or []:
        specs[topic] = {}
    for topic, serde in (cfg.get("customSerdeInputs") or {}).items():
        specs[topic] = {"serdeClassName": serde}
    for topic, spec in (cfg.get("inputSpecs") or {}).items():
        spec = spec or {}
        out: Dict[str, Any] = {}
        for key in ("serdeClassName", "schemaType"):
            if spec.get(key):
                out[key] = spec[key]
        if spec.get("receiverQueueSize") is not None:
            out["receiverQueueSize"] = {"value": int(spec["receiverQueueSize"])}
        if spec.get("regexPattern"):
            out["isRegexPattern"] = True
        specs[topic] = out
    source: Dict[str, Any] = {"inputSpecs": specs, "cleanupSubscription": True}
    if cfg.get("subName"):
        source["subscriptionName"] = cfg["subName"]
    if cfg.get("retainOrdering"):
        source["subscriptionType"] = "FAILOVER"
    if cfg.get("subscriptionPosition") == "Earliest":
        source["subscriptionPosition"] = "EARLIEST"
    if cfg.get("timeoutMs"):
        source["timeoutMs"] = int(cfg["timeoutMs"])
    guarantees = cfg.get("processingGuarantees") or "ATLEAST_ONCE"
    details: Dict[str, Any] = {
        "tenant": cfg.get("tenant") or "public", "namespace": cfg.get("namespace") or "default",
        "name": cfg.get("name") or class_name.rsplit(".", 1)[-1], "className": class_name, "runtime": "PYTHON",
        "parallelism": int(cfg.get("parallelism") or 1), "source": source,
        "autoAck": False if guarantees == "MANUAL" else bool(cfg.get("autoAck", True)),
    }
    if guarantees != "ATLEAST_ONCE":
        details["processingGuarantees"] = guarantees
    if cfg.get("userConfig"):
        details["userConfig"] = json.dumps(cfg["userConfig"])
    if cfg.get("output"):
        details["sink"] = {"topic": cfg["output"], "serdeClassName": cfg.get("outputSerdeClassName") or ""}
    return details


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_env() -> Dict[str, str]:
    # The worker's Python sees nothing of this test run's PYTHONPATH.
    return {k: v for k, v in os.environ.items()
            if not (k.startswith(("PYTHON", "PIP_")) or k in ("VIRTUAL_ENV", "__PYVENV_LAUNCHER__"))}


@dataclass
class Instance:
    """One running instance process: its directory, ports, log and process."""

    index: int
    directory: Path
    metrics_port: int
    proc: subprocess.Popen
    log_path: Path
    stdout_path: Path

    def log_text(self) -> str:
        """The instance's log file and its stdout/stderr (pip, client lines), as far as written."""
        parts = [p.read_text(errors="replace") for p in (self.log_path, self.stdout_path) if p.exists()]
        return "\n".join(parts)

    def metrics(self) -> str:
        """The Prometheus text the instance serves on its metrics port."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return resp.read().decode()

    def wait_running(self, timeout_s: float) -> None:
        """Until the instance has subscribed its inputs and serves metrics; AssertionError with
        the log when it exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"instance {self.index} exited rc={self.proc.returncode}:\n{self.log_text()[-4000:]}")
            if self.log_path.exists() and RUNNING_LINE in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise AssertionError(f"instance {self.index} not running after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        """Signal the instance's process group; SIGKILL when it has not exited in time."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout_s)
            except ProcessLookupError:
                pass


@dataclass
class DeployedFunction:
    """A created function: its details and its instances."""

    worker: "FunctionWorker"
    package: Path
    details: Dict[str, Any]
    function_id: str
    instances: List[Instance] = field(default_factory=list)
    starts: int = 0

    @property
    def fqfn(self) -> str:
        """tenant/namespace/name."""
        return f"{self.details['tenant']}/{self.details['namespace']}/{self.details['name']}"

    def start_instance(self, index: int) -> Instance:
        """Start instance `index` in a directory of its own, as a worker would (getCmd)."""
        self.starts += 1
        d = self.worker.work_dir / "download" / self.fqfn / f"start-{self.starts}-instance-{index}"
        d.mkdir(parents=True)
        code = d / self.package.name  # the worker keeps the uploaded file's original name
        shutil.copy2(self.package, code)
        logs = self.worker.work_dir / "logs"
        port = _free_port()
        cmd = [self.worker.python, str(INSTANCE_MAIN), "--py", str(code), "--logging_directory", str(logs),
               "--logging_file", self.details["name"], "--logging_config_file", str(logs / "logging.ini"),
               "--instance_id", str(index), "--function_id", self.function_id, "--function_version", "1",
               "--function_details", json.dumps(self.details), "--pulsar_serviceurl", self.worker.service_url,
               "--use_tls", "false", "--tls_allow_insecure", "false", "--hostname_verification_enabled", "false",
               "--max_buffered_tuples", "1024", "--port", str(_free_port()), "--metrics_port", str(port)]
        if self.worker.state_storage_url:
            cmd += ["--state_storage_serviceurl", self.worker.state_storage_url]
        cmd += ["--expected_healthcheck_interval", "30", "--cluster_name", self.worker.cluster_name]
        stdout = d / "stdout.log"
        with stdout.open("ab") as out:
            proc = subprocess.Popen(cmd, cwd=d, env=_worker_env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        log_path = logs / self.fqfn / f"{self.details['name']}-{index}.log"
        instance = Instance(index, d, port, proc, log_path, stdout)
        self.worker.running.append(instance)
        return instance

    def restart(self, index: int, sig: int = signal.SIGKILL) -> Instance:
        """Stop instance `index` with `sig` and start it again elsewhere (a new directory)."""
        old = self.instances[index]
        old.stop(sig)
        self.instances[index] = self.start_instance(index)
        return self.instances[index]

    def stop(self) -> None:
        """SIGTERM every instance (SIGKILL the ones that do not exit)."""
        for instance in self.instances:
            instance.stop()


@dataclass
class FunctionWorker:
    """A function worker with the process runtime: the broker, the state service it passes on."""

    service_url: str
    state_storage_url: Optional[str]
    work_dir: Path
    cluster_name: str = "standalone"
    python: str = sys.executable
    running: List[Instance] = field(default_factory=list)

    def create(self, py: Path, config_file: Path) -> DeployedFunction:
        """`pulsar-admin functions create --py PY --function-config-file CONFIG_FILE`: every instance started."""
        details = function_details(load_function_config(config_file))
        fn = DeployedFunction(self, Path(py), details, str(uuid.uuid4()))
        fn.instances = [fn.start_instance(i) for i in range(details["parallelism"])]
        return fn

    def stop_all(self) -> None:
        """Stop every instance this worker started (for a test's teardown)."""
        for instance in self.running:
            instance.stop(signal.SIGKILL, timeout_s=10)
