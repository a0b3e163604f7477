"""A cluster of two Pulsar function workers for tests: the standalone's own worker and a second
worker, `org.apache.pulsar.functions.worker.FunctionWorkerStarter` from the same Apache Pulsar
release (the standalone's classpath), with its own functions_worker.yml, web port and workerId, on
the same cluster (`pulsarFunctionsCluster`), broker, metadata store and table service, with the
process runtime.

Both workers join the membership on `public/functions/coordinate` (a failover subscription: the
active consumer is the leader) and follow the assignments topic `public/functions/assignments`.
When a worker's consumer goes (its JVM died), the leader's failure check (every
`failureCheckFreqMs`) reassigns that worker's instances once they have been unassigned for
`rescheduleTimeoutMs`; `pulsar-admin functions-worker rebalance` spreads instances again.

* `SecondWorker`: one extra worker JVM, started in a session (process group) of its own, so
  `kill()` SIGKILLs it together with the instance processes it started (a lost machine), and
  `stop()` leaves no JVM and no instance behind; a watchdog kills the group when this test process
  dies without stopping it.
* `WorkerCluster`: the standalone with its worker and one `SecondWorker`, `pulsar-admin` against
  the standalone's worker, the leader and the assignments as the workers report them, and the
  live instance processes of each worker (by process group).
* `start_worker_cluster(dir, ...)`: both workers started, with the failure-check settings given
  to both (the leader can be either).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Mapping, Optional, Tuple

from pulsar_lifecycle.runtime.broker import free_port
from pulsar_lifecycle.runtime.pulsar_release import java_executable
from pulsar_lifecycle.runtime.pulsar_standalone import JVM_OPTS, LOG4J_FILE, PulsarStandalone, functions_worker_config
from support.real_worker import (
    INSTANCE_MAIN,
    LIVENESS_CHECK_MS,
    PulsarAdmin,
    RealWorker,
    _fqfn_of,
    _instance_processes,
    start_worker_standalone,
    wait_worker_ready,
    worker_env,
)

log = logging.getLogger(__name__)

WORKER_STARTER = "org.apache.pulsar.functions.worker.FunctionWorkerStarter"
_JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:+ExitOnOutOfMemoryError",
             *JVM_OPTS]
# Kills the worker's process group (the JVM and its instances) when the test process dies.
_WATCHDOG = "while kill -0 {owner} 2>/dev/null; do sleep 0.5; done; kill -9 -{pgid} 2>/dev/null"


@dataclass
class SecondWorker:
    """One more function worker JVM (FunctionWorkerStarter) beside a running standalone."""

    standalone: PulsarStandalone
    data_dir: Path
    worker_id: str = "worker-2"
    worker_config: Dict[str, Any] = field(default_factory=dict)
    start_timeout_s: float = 240.0
    web_port: int = 0
    _proc: Optional["subprocess.Popen[bytes]"] = field(default=None, init=False, repr=False)
    _watchdog: Optional["subprocess.Popen[bytes]"] = field(default=None, init=False, repr=False)
    _out: Optional[IO[bytes]] = field(default=None, init=False, repr=False)

    @property
    def admin_url(self) -> str:
        """This worker's own REST API (functions admin and /metrics/)."""
        return f"http://{self.standalone.host}:{self.web_port}"

    @property
    def log_dir(self) -> Path:
        """The process runtime's logDirectory; instances log under `functions/<fqfn>/`."""
        return self.data_dir / "logs"

    @property
    def log_path(self) -> Path:
        """The worker JVM's own log."""
        return self.log_dir / "worker.log"

    @property
    def pid(self) -> Optional[int]:
        """The JVM's pid (also its process group id) while it runs."""
        return self._proc.pid if self._proc is not None else None

    def config_text(self) -> str:
        """This worker's functions_worker.yml: the standalone worker's keys with its own id, port,
        directories and log directory."""
        sa = self.standalone
        assert sa.release is not None, "the standalone must be started first"
        extra = dict(sa.worker_config)
        python_instance = extra.pop("pythonInstanceLocation", None)
        liveness = extra.pop("instanceLivenessCheckFreqMs", LIVENESS_CHECK_MS)
        extra.update(self.worker_config)
        java_instance = next((Path(j) for j in sa.release.classpath
                              if Path(j).name.startswith("pulsar-functions-instance-")), None)
        # The same metadata store as the standalone (its ZooKeeper): what a worker of the cluster
        # reads for authorization and the function packages' DistributedLog namespace.
        extra.setdefault("configurationMetadataStoreUrl", f"zk:{sa.host}:{sa.ports['zookeeper']}")
        return functions_worker_config(
            worker_id=self.worker_id, host=sa.host, web_port=self.web_port, service_url=sa.service_url,
            admin_url=sa.admin_url, state_storage_url=sa.state_storage_url if sa.stream_storage else None,
            download_dir=self.data_dir / "functions-download", python_instance=python_instance,
            java_instance_jar=java_instance, log_dir=self.log_dir, liveness_check_ms=liveness, extra=extra)

    def start(self) -> "SecondWorker":
        """Start the JVM and wait until its REST API answers `functions list`."""
        if self._proc is not None:
            raise AssertionError(f"worker {self.worker_id} is already running (pid {self._proc.pid})")
        sa = self.standalone
        assert sa.release is not None, "the standalone must be started first"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self.web_port:
            self.web_port = free_port(sa.host)
        conf = self.data_dir / "functions_worker.yml"
        conf.write_text(self.config_text())
        (self.data_dir / "log4j2.properties").write_text(
            LOG4J_FILE.format(log=self.log_path, level=os.environ.get("TEST_PULSAR_LOG_LEVEL", "info").upper()))
        (self.data_dir / "classpath.args").write_text(f'-cp "{sa.release.classpath_arg}"\n')
        cmd = [java_executable(), *_JVM_OPTS, f"-Dlog4j.configurationFile={self.data_dir / 'log4j2.properties'}",
               f"-Dpulsar.log.dir={self.log_dir}", f"@{self.data_dir / 'classpath.args'}", WORKER_STARTER,
               "--conf", str(conf)]
        self._out = open(self.log_dir / "stdout.log", "ab")
        t0 = time.monotonic()
        # A session of its own: its process group is the JVM and every instance it starts.
        self._proc = subprocess.Popen(cmd, cwd=self.data_dir, env=worker_env(), stdout=self._out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._watchdog = subprocess.Popen(["sh", "-c", _WATCHDOG.format(owner=os.getpid(), pgid=self._proc.pid)],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_worker_ready(self.admin_url, timeout_s=self.start_timeout_s)
        except BaseException:
            self.stop(kill=True)
            raise AssertionError(f"worker {self.worker_id} did not start: see {self.log_path}") from None
        log.info("event=worker_started worker=%s pid=%d url=%s seconds=%.1f", self.worker_id, self._proc.pid,
                 self.admin_url, time.monotonic() - t0)
        return self

    def instance_pids(self) -> List[int]:
        """The live instance processes this worker started (its process group)."""
        if self._proc is None:
            return []
        out = []
        for pid, _argv in _instance_processes():
            try:
                if os.getpgid(pid) == self._proc.pid:
                    out.append(pid)
            except ProcessLookupError:
                continue
        return sorted(out)

    def kill(self) -> List[int]:
        """SIGKILL the JVM and every instance process it started at once (a lost machine); the
        pids killed. Waits (bounded) until the JVM is reaped."""
        proc = self._proc
        if proc is None:
            return []
        pids = [proc.pid, *self.instance_pids()]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        self._proc = None
        self._stop_watchdog()
        log.info("event=worker_killed worker=%s pids=%s", self.worker_id, pids)
        return pids

    def stop(self, kill: bool = False, timeout_s: float = 30.0) -> None:
        """SIGTERM (the worker stops its instances), SIGKILL of the whole group after `timeout_s`
        or at once with `kill`; nothing of the group is left."""
        proc = self._proc
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
            try:  # instances the JVM left behind stay in its group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc = None
        self._stop_watchdog()
        if self._out is not None:
            self._out.close()
            self._out = None

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            try:
                os.killpg(self._watchdog.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._watchdog.wait(timeout=5)
            self._watchdog = None


@dataclass
class WorkerCluster:
    """The standalone's worker and a second worker: `pulsar-admin` goes to the standalone's."""

    real: RealWorker
    second: SecondWorker

    @property
    def admin(self) -> PulsarAdmin:
        """`pulsar-admin` against the standalone's worker (any worker forwards to the leader)."""
        return self.real.admin

    @property
    def standalone(self) -> PulsarStandalone:
        """The standalone (broker, bookie, table service, first worker)."""
        return self.real.standalone

    @property
    def standalone_worker_id(self) -> str:
        """The standalone's own worker's workerId (the standalone sets it: c-<cluster>-fw-<host>-<port>)."""
        return standalone_worker_id(self.standalone)

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.standalone.admin_url}{path}", timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def leader(self) -> str:
        """The workerId of the current leader (`functions-worker get-cluster-leader`)."""
        return str(self._get("/admin/v2/worker/cluster/leader")["workerId"])

    def members(self) -> List[str]:
        """The workerIds in the membership (`functions-worker get-cluster`)."""
        return sorted(str(w["workerId"]) for w in self._get("/admin/v2/worker/cluster"))

    def assignments(self) -> Dict[str, List[str]]:
        """workerId -> fully qualified instance ids assigned to it (`get-function-assignments`)."""
        return {str(k): sorted(v) for k, v in (self._get("/admin/v2/worker/assignments") or {}).items()}

    def worker_of(self, fqfn: str, instance_id: int) -> Optional[str]:
        """The workerId `fqfn:instance_id` is assigned to, or None."""
        want = f"{fqfn}:{instance_id}"
        return next((w for w, ids in self.assignments().items() if want in ids), None)

    def instance_workers(self, fqfn: str) -> Dict[int, List[str]]:
        """instance id -> the workers whose process groups run a process of it now (by pgid)."""
        groups = {self.standalone.pid: self.standalone_worker_id, self.second.pid: self.second.worker_id}
        out: Dict[int, List[str]] = {}
        for pid, argv in _instance_processes():
            if _fqfn_of(argv) != fqfn or "--instance_id" not in argv:
                continue
            try:
                who = groups.get(os.getpgid(pid))
            except ProcessLookupError:
                continue
            if who is None:  # another cluster's (an xdist neighbour running the same function names)
                continue
            out.setdefault(int(argv[argv.index("--instance_id") + 1]), []).append(who)
        return out

    def instance_log_text(self, fqfn: str, instance_id: int) -> str:
        """The instance's logs on both workers, as far as written."""
        name = fqfn.split("/")[-1]
        texts = [self.real.instance_log_text(fqfn, instance_id)]
        path = self.second.log_dir / "functions" / fqfn / f"{name}-{instance_id}.log"
        if path.exists():
            texts.append(path.read_text(errors="replace"))
        return "\n".join(texts)

    def wait_members(self, want: List[str], timeout_s: float = 120.0) -> None:
        """Until the membership is exactly `want` (bounded)."""
        deadline = time.monotonic() + timeout_s
        last: List[str] = []
        while time.monotonic() < deadline:
            try:
                last = self.members()
            except OSError:
                last = []
            if last == sorted(want):
                return
            time.sleep(0.5)
        raise AssertionError(f"worker membership {last}, expected {sorted(want)} within {timeout_s:.0f} s")


def standalone_worker_id(standalone: PulsarStandalone) -> str:
    """The workerId a standalone gives its own worker (PulsarStandalone: c-<cluster>-fw-<host>-<web port>)."""
    return f"c-standalone-fw-{standalone.host}-{standalone.ports['web']}"


def start_worker_cluster(data_dir: Path, worker_config: Optional[Mapping[str, Any]] = None) -> WorkerCluster:
    """The standalone with its worker and a second worker, both with `worker_config` (e.g.
    failureCheckFreqMs, rescheduleTimeoutMs), started; both members of the cluster."""
    standalone = start_worker_standalone(data_dir / "standalone", worker_config=dict(worker_config or {}))
    second = SecondWorker(standalone, data_dir / "worker-2")
    try:
        second.start()
        cluster = WorkerCluster(RealWorker(standalone, PulsarAdmin(standalone.admin_url, standalone.service_url,
                                                                    data_dir / "admin")), second)
        cluster.wait_members([cluster.standalone_worker_id, second.worker_id])
    except BaseException:
        second.stop(kill=True)
        standalone.stop(remove_data=True)
        raise
    return cluster


def stop_worker_cluster(cluster: WorkerCluster, remove_data: bool = True) -> None:
    """Stop the second worker and the standalone; no JVM, no instance process left."""
    try:
        cluster.second.stop()
    finally:
        cluster.standalone.stop(remove_data=remove_data)


def processes_left(cluster: WorkerCluster) -> List[Tuple[int, str]]:
    """(pid, command) of anything either worker's process group still runs."""
    groups = {g for g in (cluster.standalone.pid, cluster.second.pid) if g}
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) in groups:
                left.append((int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]))
        except (ProcessLookupError, OSError):
            continue
    return left


__all__ = ["INSTANCE_MAIN", "SecondWorker", "WorkerCluster", "start_worker_cluster", "stop_worker_cluster"]
