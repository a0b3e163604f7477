"""Real Apache Pulsar on 127.0.0.1: a standalone (broker, bookie, BookKeeper table service) from Maven jars.

The counterpart of the embedded broker (runtime/broker.py) for tests, benchmarks and the demo
that need what pulsar-lite lacks: delayed delivery (InMemory or Bucket tracker), broker-side
de-duplication, the admin REST API, the bookie's HTTP admin API and the table service that holds
function state. The release is resolved once per machine (runtime/pulsar_release.py) and started
with `org.apache.pulsar.PulsarStandaloneStarter` on free loopback ports, with a configuration we
write ourselves into the run's own data directory.

`PULSAR_STANDALONE_USE_ZOOKEEPER=1` is set because only the ZooKeeper flavour of the standalone
starts the table service (the default RocksDB metadata flavour starts bookies without it). The
bookie reads its settings from the same file as the broker (PulsarStandalone loads it into the
bookie's ServerConfiguration), which is how its HTTP admin API is turned on.

No JVM outlives its owner: the JVM runs in a session of its own, `stop()` sends SIGTERM (the
standalone's shutdown hook closes broker and bookie) and SIGKILL after a grace period, an atexit
hook stops what is still running, and a watchdog process kills the JVM when the owning process
dies without running either (SIGKILL of a test run included).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Mapping, Optional

from .broker import free_port, port_open
from .local_paths import absolute
from .pulsar_release import PulsarRelease, PulsarSetupError, java_executable, resolve
from .pulsar_security import SecuritySetup

log = logging.getLogger(__name__)

TRACKERS = {
    "inmemory": "org.apache.pulsar.broker.delayed.InMemoryDelayedDeliveryTrackerFactory",
    "bucket": "org.apache.pulsar.broker.delayed.BucketDelayedDeliveryTrackerFactory",
}

# What Pulsar's bin/pulsar gives the JVM on Java 17 (netty, metrics and the bookie reach into
# JDK internals); the heap and GC come from the profile (PROFILES). A second function worker of the
# same release takes them too (tests/support/worker_cluster.py).
JVM_OPTS = [
    "--add-opens", "java.base/java.lang=ALL-UNNAMED", "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.management/sun.management=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dzookeeper.admin.enableServer=false",  # ZooKeeper's AdminServer would take 0.0.0.0:8080
    "-Dzookeeper.4lw.commands.whitelist=ruok",
    "-Djava.net.preferIPv4Stack=true",
]

# Memory and GC per profile. "small" (the default): a small heap, one standalone per test run on a
# 2-core machine, with small bookie caches (_SMALL_BOOKIE_CACHES). "defaults": what Pulsar 4.0's
# conf/pulsar_env.sh gives `bin/pulsar standalone` (PULSAR_MEM, PULSAR_GC, PULSAR_EXTRA_OPTS), with
# the bookie's caches left to standalone.conf's defaults (sized from the direct memory).
PROFILES: Dict[str, List[str]] = {
    "small": ["-Xms256m", "-Xmx1g", "-XX:MaxDirectMemorySize=1g", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError"],
    "defaults": ["-Xms2g", "-Xmx2g", "-XX:MaxDirectMemorySize=4g",
                 "-XX:+UseZGC", "-XX:+PerfDisableSharedMem", "-XX:+AlwaysPreTouch",
                 "-Dpulsar.allocator.exit_on_oom=true", "-Dio.netty.recycler.maxCapacityPerThread=4096"],
}
_SMALL_BOOKIE_CACHES = {
    "dbStorage_writeCacheMaxSizeMb": "32",
    "dbStorage_readAheadCacheMaxSizeMb": "32",
    "dbStorage_rocksDB_blockCacheSize": "16777216",
}

LOG4J_FILE = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %-5p [%t] %c{{1}} - %m%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""

PROCESS_RUNTIME = "org.apache.pulsar.functions.runtime.process.ProcessRuntimeFactory"


def functions_worker_config(*, worker_id: str, host: str, web_port: int, service_url: str, admin_url: str,
                            state_storage_url: Optional[str], download_dir: Path, cluster: str = "standalone",
                            python_instance: Optional[Path] = None, java_instance_jar: Optional[Path] = None,
                            log_dir: Optional[Path] = None,
                            liveness_check_ms: int = 30_000, extra: Optional[Mapping[str, Any]] = None) -> str:
    """functions_worker.yml for a function worker with the process runtime (as JSON, which YAML
    reads): `python_instance` is the `python_instance_main.py` the worker starts each Python
    instance with (`pythonInstanceLocation`), `liveness_check_ms` how often it restarts dead
    instances (the instances' health-check interval follows it), `extra` adds or overrides keys.
    The process runtime refuses to start without `java_instance_jar` (javaInstanceJarLocation),
    even when it only ever runs Python functions."""
    factory: Dict[str, Any] = {}
    if java_instance_jar is not None:
        factory["javaInstanceJarLocation"] = str(java_instance_jar)
    if python_instance is not None:
        factory["pythonInstanceLocation"] = str(python_instance)
    if log_dir is not None:
        factory["logDirectory"] = str(log_dir)
    conf: Dict[str, Any] = {
        "workerId": worker_id, "workerHostname": host, "workerPort": web_port,
        "pulsarServiceUrl": service_url, "pulsarWebServiceUrl": admin_url,
        "pulsarFunctionsNamespace": "public/functions", "pulsarFunctionsCluster": cluster,
        "downloadDirectory": str(download_dir), "numFunctionPackageReplicas": 1,
        # The distribution's functions_worker.yml sets these; WorkerConfig has no defaults for
        # the topic names (a worker without them fails to start on `.../public/functions/null`).
        "functionMetadataTopicName": "metadata", "functionAssignmentTopicName": "assignments",
        "clusterCoordinationTopicName": "coordinate", "failureCheckFreqMs": 30_000, "rescheduleTimeoutMs": 60_000,
        "initialBrokerReconnectMaxRetries": 60, "assignmentWriteMaxRetries": 60, "topicCompactionFrequencySec": 1800,
        "schedulerClassName": "org.apache.pulsar.functions.worker.scheduler.RoundRobinScheduler",
        "connectorsDirectory": str(download_dir.parent / "connectors"),
        "functionsDirectory": str(download_dir.parent / "functions"),
        "instanceLivenessCheckFreqMs": int(liveness_check_ms),
        "functionRuntimeFactoryClassName": PROCESS_RUNTIME,
        "functionRuntimeFactoryConfigs": factory,
    }
    if state_storage_url:
        conf["stateStorageServiceUrl"] = state_storage_url
    conf.update(extra or {})
    return json.dumps(conf, indent=2) + "\n"


# Kills the JVM when its owner dies without stopping it (the owner's SIGKILL included).
_WATCHDOG = "while kill -0 {owner} 2>/dev/null; do sleep 0.5; done; kill -9 -{pgid} 2>/dev/null"


@dataclass
class PulsarStandalone:
    """A real Apache Pulsar standalone owned by this object.

    `tracker` chooses the broker's delayed-delivery tracker ("inmemory" or "bucket"),
    `deduplication` the broker's de-duplication, `function_worker` whether the standalone runs
    its function worker (process runtime; `worker_config` adds or overrides functions_worker.yml
    keys, see functions_worker_config; `env` replaces the JVM's environment, which the worker's
    instances inherit: their `python3` is the first on its PATH); `config` adds or overrides
    standalone.conf keys; `profile` the JVM's memory and GC and the bookie's caches ("small", the
    default, or "defaults": Pulsar's own pulsar_env.sh and standalone.conf, see PROFILES); `stream_storage=False` starts no table service (a worker without
    function state: the standalone hands its worker the table service whenever it runs one).
    `security` (a SecuritySetup) secures it: a CA, a broker certificate and a token secret key
    generated into `<data_dir>/security`, TLS on two more ports (service_url_tls, admin_url_tls),
    token authentication, authorization with the setup's super-user role (the health check and
    `admin_headers()` authenticate as it) and, with `function_worker`, a worker that runs each
    instance with its submitter's token. `data_dir` is kept
    across restarts when given (a data dir that ran before starts on the ports it ran on, kept in
    its ports.json), otherwise a temporary directory is used and removed on stop.
    """

    data_dir: Optional[Path] = None
    tracker: str = "inmemory"
    tick_millis: int = 1000
    deduplication: bool = False
    function_worker: bool = False
    stream_storage: bool = True
    worker_config: Dict[str, Any] = field(default_factory=dict)
    env: Optional[Dict[str, str]] = None
    config: Dict[str, str] = field(default_factory=dict)
    profile: str = "small"
    log_level: str = "warn"
    start_timeout: float = 180.0
    version: Optional[str] = None
    broker_port: int = 0
    web_port: int = 0
    host: str = "127.0.0.1"
    security: Optional[SecuritySetup] = None
    _proc: Optional[subprocess.Popen] = field(default=None, init=False, repr=False)
    _watchdog: Optional[subprocess.Popen] = field(default=None, init=False, repr=False)
    _log_file: Optional[IO[bytes]] = field(default=None, init=False, repr=False)
    _tmp: Optional[str] = field(default=None, init=False, repr=False)
    ports: Dict[str, int] = field(default_factory=dict, init=False)
    release: Optional[PulsarRelease] = field(default=None, init=False, repr=False)
    startup_seconds: float = field(default=0.0, init=False)

    # -- addresses ----------------------------------------------------------------------------
    @property
    def service_url(self) -> str:
        """The pulsar:// URL clients connect to."""
        return f"pulsar://{self.host}:{self.ports['broker']}"

    @property
    def admin_url(self) -> str:
        """The broker's admin REST API (and web service)."""
        return f"http://{self.host}:{self.ports['web']}"

    @property
    def service_url_tls(self) -> str:
        """The pulsar+ssl:// URL (secured standalones only)."""
        return f"pulsar+ssl://{self.host}:{self._secured_port('broker_tls')}"

    @property
    def admin_url_tls(self) -> str:
        """The admin REST API over TLS (secured standalones only)."""
        return f"https://{self.host}:{self._secured_port('web_tls')}"

    @property
    def ca_path(self) -> Path:
        """The CA certificate clients trust (secured standalones only)."""
        return self._security().ca_path

    def token(self, role: str) -> str:
        """A token for `role` this standalone accepts (secured standalones only)."""
        return self._security().token(role)

    @property
    def super_user(self) -> str:
        """The super-user role (secured standalones only)."""
        return self._security().super_user

    def admin_headers(self) -> Dict[str, str]:
        """HTTP headers for the admin REST API: the super user's Bearer token when secured."""
        return {"Authorization": f"Bearer {self.token(self.super_user)}"} if self.security else {}

    def ssl_context(self) -> Any:
        """An ssl.SSLContext trusting this standalone's CA (None when it is not secured)."""
        if self.security is None:
            return None
        import ssl

        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        ctx.check_hostname = False  # the certificate names 127.0.0.1 and localhost; urllib asks by IP
        return ctx

    def _security(self) -> SecuritySetup:
        if self.security is None:
            raise PulsarSetupError("this standalone runs without security (PulsarStandalone(security=...))")
        return self.security

    def _secured_port(self, name: str) -> int:
        self._security()
        return self.ports[name]

    @property
    def bookie_http_url(self) -> str:
        """The bookie's HTTP admin API (`/api/v1/ledger/...`)."""
        return f"http://{self.host}:{self.ports['bookie_http']}"

    @property
    def state_storage_url(self) -> str:
        """The BookKeeper table service, as `--state-storage-service-url` takes it."""
        return f"bk://{self.host}:{self.ports['stream']}"

    @property
    def pid(self) -> Optional[int]:
        """The JVM's process id while it runs."""
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        """The standalone's log (broker, bookie, ZooKeeper, table service)."""
        assert self.data_dir is not None
        return Path(self.data_dir) / "logs" / "pulsar-standalone.log"

    @property
    def name(self) -> str:
        """`pulsar`: the broker kind, as test ids and skip reasons name it."""
        return "pulsar"

    def rss_bytes(self) -> int:
        """The JVM's resident set size now (0 when it is not running)."""
        if self._proc is None:
            return 0
        try:
            with open(f"/proc/{self._proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0

    # -- configuration ------------------------------------------------------------------------
    def _ports_file(self) -> Optional[Path]:
        return Path(self.data_dir) / "ports.json" if self.data_dir is not None else None

    def _reuse_ports(self) -> bool:
        """The ports this data dir last ran on, when it ran before: the bookie registered itself
        and the table service its ZooKeeper under them, so a restart must keep them."""
        path = self._ports_file()
        if path is None or not path.is_file():
            return False
        ports = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        busy = [f"{name} {port}" for name, port in ports.items() if port_open(self.host, port)]
        if busy:
            raise PulsarSetupError(f"{self.data_dir} last ran on fixed ports and {', '.join(busy)} is now in use "
                                   "on 127.0.0.1: stop what listens there, or start on a fresh data dir")
        self.ports = ports
        for name in ("broker_tls", "web_tls") if self.security is not None else ():
            if name not in self.ports:  # a data dir that last ran unsecured
                self.ports[name] = free_port(self.host)
        return True

    def _pick_ports(self) -> None:
        if self._reuse_ports():
            return
        wanted = {"broker": self.broker_port, "web": self.web_port}
        for name, port in wanted.items():
            if port and port_open(self.host, port):
                raise PulsarSetupError(f"port {self.host}:{port} ({name}) is already in use: stop what listens "
                                       "there or leave the port unset so a free one is picked")
        taken: List[int] = []
        names = ["broker", "web", "zookeeper", "bookie", "bookie_http", "stream"]
        if self.security is not None:
            names += ["broker_tls", "web_tls"]
        for name in names:
            port = wanted.get(name) or 0
            while not port or port in taken:
                port = free_port(self.host)
            taken.append(port)
            self.ports[name] = port

    def _standalone_conf(self) -> str:
        if self.profile not in PROFILES:
            raise PulsarSetupError(f"unknown standalone profile {self.profile!r}: use one of {sorted(PROFILES)}")
        if self.tracker not in TRACKERS:
            raise PulsarSetupError(f"unknown delayed-delivery tracker {self.tracker!r}: use one of {sorted(TRACKERS)}")
        assert self.data_dir is not None
        d = Path(self.data_dir)
        conf: Dict[str, str] = {
            "clusterName": "standalone",
            "advertisedAddress": self.host,
            "bindAddress": self.host,
            "brokerServicePort": str(self.ports["broker"]),
            "webServicePort": str(self.ports["web"]),
            "managedLedgerDefaultEnsembleSize": "1",
            "managedLedgerDefaultWriteQuorum": "1",
            "managedLedgerDefaultAckQuorum": "1",
            "brokerDeduplicationEnabled": str(self.deduplication).lower(),
            "delayedDeliveryEnabled": "true",
            "delayedDeliveryTrackerFactoryClassName": TRACKERS[self.tracker],
            "delayedDeliveryTickTimeMillis": str(self.tick_millis),
            # Topics stay until a test deletes them: an idle topic deleted by the broker would
            # take its ledgers along while a test still counts on them.
            "brokerDeleteInactiveTopicsEnabled": "false",
            "allowAutoTopicCreationType": "non-partitioned",
            "brokerShutdownTimeoutMs": "5000",
            "loadBalancerEnabled": "false",
            "webSocketServiceEnabled": "false",
            # The bookie reads this file too (PulsarStandalone): its HTTP admin API on loopback.
            "httpServerEnabled": "true",
            "httpServerPort": str(self.ports["bookie_http"]),
            "httpServerHost": self.host,
            "httpServerClass": "org.apache.bookkeeper.http.vertx.VertxHttpServer",
            "allowLoopback": "true",
            "statsProviderClass": "org.apache.bookkeeper.stats.NullStatsProvider",
            **(_SMALL_BOOKIE_CACHES if self.profile == "small" else {}),
            "journalDirectory": str(d / "bookkeeper" / "journal"),
            "ledgerDirectories": str(d / "bookkeeper" / "ledgers"),
        }
        if self.security is not None:
            conf.update(self.security.broker_config(broker_tls_port=self.ports["broker_tls"],
                                                    web_tls_port=self.ports["web_tls"]))
        conf.update({k: str(v) for k, v in self.config.items()})
        return "".join(f"{k}={v}\n" for k, v in conf.items())

    @property
    def worker_log_dir(self) -> Path:
        """Where the function worker's instances log (`<tenant>/<namespace>/<name>/<name>-<i>.log`):
        the process runtime's logDirectory (the standalone's logs/) plus `functions`."""
        assert self.data_dir is not None
        return Path(self.data_dir) / "logs" / "functions"

    def _functions_worker_yml(self) -> str:
        assert self.data_dir is not None
        extra: Dict[str, Any] = {}
        if self.security is not None:
            extra.update(self.security.worker_config(service_url_tls=self.service_url_tls,
                                                     admin_url_tls=self.admin_url_tls))
        extra.update(self.worker_config)
        python_instance = extra.pop("pythonInstanceLocation", None)
        liveness = extra.pop("instanceLivenessCheckFreqMs", 30_000)
        assert self.release is not None
        # Pulsar's java-instance.jar is the distribution's shaded build of this artifact; Python
        # functions never use it, but the process runtime wants a path.
        java_instance = next((Path(j) for j in self.release.classpath
                              if Path(j).name.startswith("pulsar-functions-instance-")), None)
        return functions_worker_config(
            worker_id="standalone", host=self.host, web_port=self.ports["web"], service_url=self.service_url,
            admin_url=self.admin_url, state_storage_url=self.state_storage_url if self.stream_storage else None,
            download_dir=Path(self.data_dir) / "functions-download", python_instance=python_instance,
            java_instance_jar=java_instance,
            log_dir=self.worker_log_dir.parent, liveness_check_ms=liveness, extra=extra)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "PulsarStandalone":
        """Resolve the release (first run only), start the standalone and wait for its health check."""
        if self._proc is not None:
            raise PulsarSetupError("this standalone is already running")
        java = java_executable()
        if not self.ports:
            self._pick_ports()  # a busy port is refused before anything is resolved or started
        self.release = resolve(self.version)
        if self.data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="pulsar-lifecycle-pulsar-")
            self.data_dir = Path(self._tmp)
        # Absolute: the JVM runs with the data dir as working directory, where a relative path
        # written into its configuration would name a directory nested inside it.
        self.data_dir = d = absolute(self.data_dir)
        (d / "logs").mkdir(parents=True, exist_ok=True)
        if self.security is not None:
            self.security.write(d / "security")
        (d / "ports.json").write_text(json.dumps(self.ports))
        conf = d / "standalone.conf"
        conf.write_text(self._standalone_conf())
        (d / "log4j2.properties").write_text(LOG4J_FILE.format(log=self.log_path, level=self.log_level.upper()))
        args = ["--config", str(conf), "--zookeeper-port", str(self.ports["zookeeper"]),
                "--bookkeeper-port", str(self.ports["bookie"]), "--stream-storage-port", str(self.ports["stream"]),
                "--zookeeper-dir", str(d / "zookeeper"), "--bookkeeper-dir", str(d / "bookkeeper"),
                "--advertised-address", self.host]
        if not self.stream_storage:
            args.append("--no-stream-storage")
        if self.function_worker:
            fw = d / "functions_worker.yml"
            fw.write_text(self._functions_worker_yml())
            args += ["--functions-worker-conf", str(fw)]
        else:
            args.append("--no-functions-worker")
        # The ~300-jar classpath goes through a Java argument file, so `ps` shows a readable command.
        (d / "classpath.args").write_text(f'-cp "{self.release.classpath_arg}"\n')
        cmd = [java, *PROFILES[self.profile], *JVM_OPTS, f"-Dlog4j.configurationFile={d / 'log4j2.properties'}",
               f"-Dpulsar.log.dir={d / 'logs'}", f"@{d / 'classpath.args'}",
               "org.apache.pulsar.PulsarStandaloneStarter", *args]
        env = dict(os.environ if self.env is None else self.env, PULSAR_STANDALONE_USE_ZOOKEEPER="1")
        self._log_file = open(d / "logs" / "stdout.log", "ab")
        t0 = time.monotonic()
        # cwd = data dir: the standalone resolves relative paths (data/, conf/) against it.
        self._proc = subprocess.Popen(cmd, cwd=d, env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self._watchdog = subprocess.Popen(
            ["sh", "-c", _WATCHDOG.format(owner=os.getpid(), pgid=self._proc.pid)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)
        log.info("event=pulsar_starting version=%s pid=%d data_dir=%s ports=%s", self.release.version,
                 self._proc.pid, d, self.ports)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        log.info("event=pulsar_started version=%s url=%s admin=%s seconds=%.1f rss_mb=%d", self.release.version,
                 self.service_url, self.admin_url, self.startup_seconds, self.rss_bytes() // 2**20)
        return self

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + self.start_timeout
        # Secured: over TLS with the super user's token (which also proves the broker's own
        # client, which the health check produces and consumes with, authenticates).
        base = self.admin_url_tls if self.security is not None else self.admin_url
        health = f"{base}/admin/v2/brokers/health"
        request = urllib.request.Request(health, headers=self.admin_headers())
        # The health check passes on the broker's own heartbeat namespace, before the standalone has
        # created public/default (a subscribe then gets TopicNotFound "Namespace not found"): ready
        # means that namespace answers too.
        namespace = urllib.request.Request(f"{base}/admin/v2/namespaces/public/default", headers=self.admin_headers())
        healthy = False
        while True:
            assert self._proc is not None
            rc = self._proc.poll()
            if rc is not None:
                raise PulsarSetupError(f"Apache Pulsar exited with rc={rc} while starting: {self._failure_line()} "
                                       f"(log: {self.log_path})")
            stream_up = port_open(self.host, self.ports["stream"]) if self.stream_storage else True
            if stream_up and port_open(self.host, self.ports["bookie_http"]):
                try:
                    if not healthy:
                        with urllib.request.urlopen(request, timeout=5, context=self.ssl_context()) as resp:
                            healthy = resp.status == 200 and resp.read().strip() == b"ok"
                    if healthy:
                        with urllib.request.urlopen(namespace, timeout=5, context=self.ssl_context()) as resp:
                            if resp.status == 200:
                                return
                except (urllib.error.URLError, OSError):
                    pass
            if time.monotonic() > deadline:
                raise PulsarSetupError(f"Apache Pulsar did not pass {health} (and serve public/default) within "
                                       f"{self.start_timeout:.0f} s: "
                                       f"{self._failure_line()} (log: {self.log_path})")
            time.sleep(0.5)

    def _failure_line(self) -> str:
        """The first telling line of the logs (an address in use, an exception), else the last one."""
        text = ""
        for path in (self.log_path, Path(self.data_dir or ".") / "logs" / "stdout.log"):
            try:
                text += path.read_text(errors="replace")[-200_000:]
            except OSError:
                pass
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        for needle in ("Address already in use", "BindException", "NoSuchMethodError", "ClassNotFoundException",
                       "Failed to start"):
            for ln in lines:
                if needle in ln:
                    if needle in ("Address already in use", "BindException"):
                        return f"a port is already in use ({ln[-200:]}): stop what listens there and retry"
                    return ln[-300:]
        return lines[-1][-300:] if lines else "(empty log)"

    def stop(self, kill: bool = False, remove_data: Optional[bool] = None, timeout: float = 30.0) -> None:
        """Stop the JVM (SIGTERM, SIGKILL after `timeout` or at once with `kill`); wait until it is gone."""
        proc = self._proc
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("event=pulsar_stop_forced pid=%d after_seconds=%.0f", proc.pid, timeout)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
            try:  # anything the JVM forked stays in its process group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc = None
            log.info("event=pulsar_stopped url=pulsar://%s:%s kill=%s", self.host, self.ports.get("broker"), kill)
        if self._watchdog is not None:
            try:
                os.killpg(self._watchdog.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._watchdog.wait(timeout=5)
            self._watchdog = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        atexit.unregister(self.stop)
        if remove_data is None:
            remove_data = self._tmp is not None
        if remove_data and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self._tmp = None

    def restart(self, kill: bool = False) -> None:
        """Stop (or kill) and start again on the same ports and data directory."""
        self.stop(kill=kill, remove_data=False)
        self.start()

    def __enter__(self) -> "PulsarStandalone":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["PROFILES", "PulsarStandalone", "PulsarSetupError", "SecuritySetup", "TRACKERS", "functions_worker_config"]
