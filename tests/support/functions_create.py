"""`pulsar-admin functions create` against this repository's reproduction of Pulsar's Python runtime.

`FunctionWorker.create(py, config_file)` does what `functions create` and a function worker with
the process runtime do with a Python function: the YAML becomes FunctionDetails
(`FunctionConfigUtils.convert`), the package is "downloaded" under its original file name into
a fresh directory per instance, and `parallelism` instances of
support/pulsar_python_instance/python_instance_main.py start with the command line of
`RuntimeUtils.getCmd`, `--state_storage_serviceurl` included when the worker has function state.
`restart(i)` starts instance i again in a new directory, as a worker elsewhere would. Like the
worker's RuntimeSpawner, a liveness check every `liveness_check_s` (the worker's
`instanceLivenessCheckFreqMs`, 30 s by default) starts an instance whose process died by itself
again with the same command line in the same directory: Pulsar's own Python runtime can die at
start-up (two instances of one function creating their state namespace at once: the loser's
retry raises `NamespaceExistsError`), and a worker deploys through that.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

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
    """One instance: its directory, ports, log and current process (a new one after each restart
    by the worker's liveness check)."""

    index: int
    directory: Path
    metrics_port: int
    cmd: Sequence[str]
    log_path: Path
    stdout_path: Path
    proc: subprocess.Popen = field(init=False)
    log_offset: int = field(init=False)  # where this instance's part of the (shared) log file starts
    restarts: int = 0
    stopped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        with self.stdout_path.open("ab") as out:
            return subprocess.Popen(list(self.cmd), cwd=self.directory, env=_worker_env(), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def restart_if_dead(self) -> bool:
        """What RuntimeSpawner's liveness check does: a process that died by itself is started
        again with the same command line; True when it was."""
        with self.lock:
            if self.stopped or self.proc.poll() is None:
                return False
            self.proc = self._spawn()
            self.restarts += 1
            return True

    def log_text(self) -> str:
        """This instance's part of its log file and its stdout/stderr (pip, client lines), as far as written."""
        parts = []
        if self.log_path.exists():
            with self.log_path.open("rb") as f:
                f.seek(self.log_offset)
                parts.append(f.read().decode(errors="replace"))
        if self.stdout_path.exists():
            parts.append(self.stdout_path.read_text(errors="replace"))
        return "\n".join(parts)

    def metrics(self) -> str:
        """The Prometheus text the instance serves on its metrics port."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return resp.read().decode()

    def wait_running(self, timeout_s: float, max_restarts: int = 2) -> None:
        """Until the instance has subscribed its inputs and serves metrics (after the worker's
        restarts, as on a cluster); AssertionError with the log when it is still dead after
        `max_restarts` restarts or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if RUNNING_LINE in self.log_text():
                return
            if self.proc.poll() is not None and self.restarts >= max_restarts:
                raise AssertionError(f"instance {self.index} exited rc={self.proc.returncode} after "
                                     f"{self.restarts} restarts:\n{self.log_text()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"instance {self.index} not running after {timeout_s}s "
                             f"({self.restarts} restarts):\n{self.log_text()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        """Signal the instance's process group (SIGKILL when it has not exited in time); the
        liveness check leaves it stopped."""
        with self.lock:
            self.stopped = True
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
        log_path = logs / self.fqfn / f"{self.details['name']}-{index}.log"
        instance = Instance(index, d, port, cmd, log_path, d / "stdout.log")
        self.worker.running.append(instance)
        self.worker.watch()
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
    liveness_check_s: float = 30.0  # functions_worker.yml instanceLivenessCheckFreqMs
    running: List[Instance] = field(default_factory=list)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    _checker: Optional[threading.Thread] = field(default=None, repr=False)

    def watch(self) -> None:
        """Start the liveness check (once)."""
        if self._checker is None:
            self._checker = threading.Thread(target=self._check_liveness, name="liveness-check", daemon=True)
            self._checker.start()

    def _check_liveness(self) -> None:
        while not self._closed.wait(self.liveness_check_s):
            for instance in list(self.running):
                if instance.restart_if_dead():
                    print(f"worker: instance {instance.index} ({instance.log_path.name}) was dead, "
                          f"started again (restart {instance.restarts})")

    def create(self, py: Path, config_file: Path) -> DeployedFunction:
        """`pulsar-admin functions create --py PY --function-config-file CONFIG_FILE`: every instance started."""
        details = function_details(load_function_config(config_file))
        fn = DeployedFunction(self, Path(py), details, str(uuid.uuid4()))
        fn.instances = [fn.start_instance(i) for i in range(details["parallelism"])]
        return fn

    def stop_all(self) -> None:
        """Stop the liveness check and every instance this worker started (for a test's teardown)."""
        self._closed.set()
        if self._checker is not None:
            self._checker.join(timeout=30)
        for instance in self.running:
            instance.stop(signal.SIGKILL, timeout_s=10)
