"""Pulsar's real function worker for tests: an Apache Pulsar 4.0.0 standalone with its function
worker (process runtime, function state on the table service) and the real `pulsar-admin` CLI.

* `python_instance_dir(release, dest)`: what the worker's `pythonInstanceLocation` points at.
  Pulsar's Python instance is not in the Maven artifacts; the directory holds this repository's
  reproduction (support/pulsar_python_instance/python_instance_main.py) and the gRPC modules of
  Pulsar's own InstanceCommunication.proto, generated with grpc_tools from the .proto the
  release's pulsar-functions-proto jar carries (the worker asks each instance for status,
  metrics and health over it).
* `worker_env()`: the worker JVM's environment. Its instances inherit it; the worker runs the
  first `python3` on PATH, so this test run's interpreter (the project's .venv) comes first, and
  nothing of this run's PYTHONPATH or virtualenv variables leaks in.
* `start_worker_standalone(...)`: the standalone with its worker on free loopback ports.
* `PulsarAdmin`: `java -cp <pulsar-client-tools 4.0.8> org.apache.pulsar.admin.cli.PulsarAdminTool`
  (runtime/pulsar_release.resolve_client_tools), with `functions create|update|status|stats|
  restart|delete` and the worker's `/metrics/`.
* the `real_worker` fixture (module scope: one standalone per test module, stopped with it);
  skipped when this run leaves out real Pulsar (TEST_BROKERS=lite).
* the secured variant: `start_secured_worker_standalone(...)` (TLS, token authentication,
  authorization, the worker running instances with their submitter's token) and
  `PulsarAdmin.secured(standalone, work_dir, role)`: `pulsar-admin --admin-url https://...
  --auth-plugin AuthenticationToken --auth-params token:... --tls-trust-cert-path CA`.

A cluster of two workers (this standalone's and a second FunctionWorkerStarter) is
support/worker_cluster.py, built on `functions_worker_config` (runtime/pulsar_standalone.py).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import pytest

from pulsar_lifecycle.runtime.pulsar_release import PulsarRelease, java_executable, resolve, resolve_client_tools
from pulsar_lifecycle.runtime.pulsar_security import AUTH_TOKEN_PLUGIN
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone, SecuritySetup
from support.broker_fixtures import broker_kinds

INSTANCE_MAIN = Path(__file__).resolve().parent / "pulsar_python_instance" / "python_instance_main.py"
PROTO = "InstanceCommunication.proto"
ADMIN_TOOL = "org.apache.pulsar.admin.cli.PulsarAdminTool"
# A short liveness check: a dead instance is started again within seconds (the instances'
# health-check interval follows it; an instance unchecked for 3 intervals stops itself).
LIVENESS_CHECK_MS = 5_000
_ADMIN_LOG4J = """status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %-5p %c{1} - %m%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
"""


def python_instance_dir(release: PulsarRelease, dest: Path) -> Path:
    """Build the Python instance directory in `dest`; the path of its python_instance_main.py."""
    dest.mkdir(parents=True, exist_ok=True)
    jar = next((j for j in release.classpath if Path(j).name.startswith("pulsar-functions-proto-")), None)
    if jar is None:
        raise AssertionError(f"no pulsar-functions-proto jar in the classpath of Pulsar {release.version}")
    with zipfile.ZipFile(jar) as zf:
        (dest / PROTO).write_bytes(zf.read(PROTO))
    import grpc_tools  # the test extra's grpcio-tools: protoc and the well-known protos

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    res = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{dest}", f"-I{well_known}",
                          f"--python_out={dest}", f"--grpc_python_out={dest}", str(dest / PROTO)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise AssertionError(f"protoc {PROTO} failed: {res.stderr[-2000:]}")
    main = dest / INSTANCE_MAIN.name
    shutil.copy2(INSTANCE_MAIN, main)
    return main


def worker_env() -> Dict[str, str]:
    """The worker JVM's environment: this interpreter's bin first on PATH, no Python variables."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("PYTHON", "PIP_")) or k in ("VIRTUAL_ENV", "__PYVENV_LAUNCHER__"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def start_worker_standalone(data_dir: Path, liveness_check_ms: int = LIVENESS_CHECK_MS,
                            worker_config: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> PulsarStandalone:
    """A standalone with its function worker (process runtime, state on its table service), started."""
    release = resolve()
    config = {"pythonInstanceLocation": python_instance_dir(release, data_dir / "python-instance"),
              "instanceLivenessCheckFreqMs": liveness_check_ms, **(worker_config or {})}
    standalone = PulsarStandalone(data_dir=data_dir / "pulsar", function_worker=True, worker_config=config,
                                  env=worker_env(), log_level=os.environ.get("TEST_PULSAR_LOG_LEVEL", "warn"),
                                  **kwargs)
    standalone.start()
    try:
        wait_worker_ready(standalone.admin_url)
    except BaseException:
        standalone.stop()
        raise
    return standalone


def start_secured_worker_standalone(data_dir: Path, liveness_check_ms: int = LIVENESS_CHECK_MS,
                                    worker_config: Optional[Mapping[str, Any]] = None,
                                    env: Optional[Mapping[str, str]] = None, **kwargs: Any) -> PulsarStandalone:
    """A secured standalone (runtime/pulsar_security.py: TLS, token authentication and
    authorization, super user `superuser`) with its function worker, started: the worker's REST
    API wants a token, and instances run with their submitter's token
    (ClearTextFunctionTokenAuthProvider) over pulsar+ssl://, trusting the cluster's CA. `env` is
    added to the worker's environment, which its instances inherit."""
    release = resolve()
    config = {"pythonInstanceLocation": python_instance_dir(release, data_dir / "python-instance"),
              "instanceLivenessCheckFreqMs": liveness_check_ms, **(worker_config or {})}
    standalone = PulsarStandalone(data_dir=data_dir / "pulsar", function_worker=True, worker_config=config,
                                  security=SecuritySetup(), env={**worker_env(), **(env or {})},
                                  log_level=os.environ.get("TEST_PULSAR_LOG_LEVEL", "warn"), **kwargs)
    standalone.start()
    try:
        wait_worker_ready(standalone.admin_url_tls, headers=standalone.admin_headers(),
                          context=standalone.ssl_context())
    except BaseException:
        standalone.stop()
        raise
    return standalone


# What a worker that is not (yet) the leader answers a create with (FunctionsImpl, HTTP 503).
LEADER_NOT_READY = "Leader not yet ready"

def wait_worker_ready(admin_url: str, timeout_s: float = 180, headers: Optional[Mapping[str, str]] = None,
                      context: Any = None) -> None:
    """Until the worker answers `functions list` (it refuses with 503 while it initializes);
    `headers` and the ssl `context` for a secured worker."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(f"{admin_url}/admin/v3/functions/public/default", headers=dict(headers or {}))
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise AssertionError(f"the function worker at {admin_url} did not finish initializing within {timeout_s}s ({last})")


@dataclass
class PulsarAdmin:
    """The real `pulsar-admin` (pulsar-client-tools) against one standalone's admin API."""

    admin_url: str
    service_url: str
    work_dir: Path
    timeout_s: float = 180.0
    # pulsar-admin's global options after --admin-url (a secured cluster's --auth-plugin ...).
    global_args: Tuple[str, ...] = ()
    # What the admin REST API wants besides the URL (a secured worker: the token's header, an ssl
    # context trusting its CA): the waits below read the function's status from it directly.
    rest_headers: Mapping[str, str] = field(default_factory=dict)
    rest_context: Any = None
    _java: str = field(default="", init=False, repr=False)
    _classpath: str = field(default="", init=False, repr=False)
    last_status_error: Optional[str] = field(default=None, init=False, repr=False)  # status_rest's last failure

    def __post_init__(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "client.conf").write_text(f"webServiceUrl={self.admin_url}/\nbrokerServiceUrl={self.service_url}\n")
        (self.work_dir / "log4j2.properties").write_text(_ADMIN_LOG4J)
        self._java = java_executable()
        self._classpath = resolve_client_tools().classpath_arg
        (self.work_dir / "classpath.args").write_text(f'-cp "{self._classpath}"\n')

    def command(self) -> List[str]:
        """The `pulsar-admin` command line (arguments follow)."""
        return [self._java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                f"-Dlog4j.configurationFile={self.work_dir / 'log4j2.properties'}",
                f"@{self.work_dir / 'classpath.args'}", ADMIN_TOOL, str(self.work_dir / "client.conf"),
                "--admin-url", self.admin_url, *self.global_args]

    @classmethod
    def secured(cls, standalone: PulsarStandalone, work_dir: Path, role: Optional[str] = None) -> "PulsarAdmin":
        """`pulsar-admin` against a secured standalone as an operator types it: the https admin
        URL, a token for `role` (default: the super user) and the cluster's CA."""
        return cls(standalone.admin_url_tls, standalone.service_url_tls, work_dir,
                   global_args=("--auth-plugin", AUTH_TOKEN_PLUGIN,
                                "--auth-params", f"token:{standalone.token(role or standalone.super_user)}",
                                "--tls-trust-cert-path", str(standalone.ca_path)),
                   rest_headers={"Authorization": f"Bearer {standalone.token(role or standalone.super_user)}"},
                   rest_context=standalone.ssl_context())

    def write_shim(self, bin_dir: Path) -> Path:
        """A `pulsar-admin` script in `bin_dir` running this CLI, for commands run as a shell runs them."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        shim = bin_dir / "pulsar-admin"
        # Like create(): retried (bounded) while a fresh worker answers "Leader not yet ready".
        # Its output comes out on stdout, stderr included.
        shim.write_text(
            "#!/bin/sh\ntries=0\nwhile :; do\n"
            f"  out=$({' '.join(shlex.quote(a) for a in self.command())} \"$@\" 2>&1); rc=$?\n"
            f'  case "$out" in *"{LEADER_NOT_READY}"*) if [ "$tries" -lt 120 ]; then tries=$((tries + 1)); sleep 1; continue; fi;; esac\n'
            '  [ -n "$out" ] && printf \'%s\\n\' "$out"\n  exit "$rc"\ndone\n')
        shim.chmod(0o755)
        return shim

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`pulsar-admin ARGS`; AssertionError with its output when it fails and `check`."""
        cmd = [*self.command(), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"pulsar-admin {' '.join(args)} exited {res.returncode}:\n"
                                 f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res

    @staticmethod
    def _fn(fqfn: str) -> List[str]:
        tenant, namespace, name = fqfn.split("/")
        return ["--tenant", tenant, "--namespace", namespace, "--name", name]

    def create(self, py: Path, config_file: Path, *extra: str, leader_wait_s: float = 120.0) -> str:
        """`functions create --py PY --function-config-file CONFIG [EXTRA]`: its output line.

        Retried, as the worker asks, while it answers "Leader not yet ready": a fresh worker
        answers `functions list` before its leader service has taken the leadership, and only
        the leader accepts a new function."""
        args = ["functions", "create", "--py", str(py), "--function-config-file", str(config_file), *extra]
        deadline = time.monotonic() + leader_wait_s
        while True:
            res = self.run(*args, check=False)
            if res.returncode == 0 or LEADER_NOT_READY not in res.stdout + res.stderr \
                    or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if res.returncode != 0:
            raise AssertionError(f"pulsar-admin {' '.join(args)} exited {res.returncode}:\n"
                                 f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res.stdout.strip()

    def update(self, fqfn: str, *extra: str) -> str:
        """`functions update --tenant T --namespace N --name X EXTRA` (e.g. --user-config JSON)."""
        return self.run("functions", "update", *self._fn(fqfn), *extra).stdout.strip()

    def status(self, fqfn: str) -> Dict[str, Any]:
        """`functions status`, parsed."""
        return json.loads(self.run("functions", "status", *self._fn(fqfn)).stdout)

    def get(self, fqfn: str) -> Dict[str, Any]:
        """`functions get`: the function's config as the worker holds it, parsed."""
        return json.loads(self.run("functions", "get", *self._fn(fqfn)).stdout)

    def update_user_config(self, fqfn: str, **overrides: Any) -> str:
        """Change some userConfig keys the way an operator does: `functions get`, the whole map with
        the keys changed, `functions update --user-config` (which replaces the whole map)."""
        user = dict(self.get(fqfn).get("userConfig") or {}, **overrides)
        return self.update(fqfn, "--user-config", json.dumps(user))

    def stats(self, fqfn: str) -> Dict[str, Any]:
        """`functions stats`, parsed."""
        return json.loads(self.run("functions", "stats", *self._fn(fqfn)).stdout)

    def restart(self, fqfn: str, instance_id: Optional[int] = None) -> str:
        """`functions restart` (one instance when `instance_id` is given)."""
        extra = ["--instance-id", str(instance_id)] if instance_id is not None else []
        return self.run("functions", "restart", *self._fn(fqfn), *extra).stdout.strip()

    def delete(self, fqfn: str) -> str:
        """`functions delete`."""
        return self.run("functions", "delete", *self._fn(fqfn)).stdout.strip()

    def list(self, tenant: str = "public", namespace: str = "default") -> List[str]:
        """`functions list`: the function names of a namespace."""
        out = self.run("functions", "list", "--tenant", tenant, "--namespace", namespace).stdout
        return [ln.strip() for ln in out.splitlines() if ln.strip()]

    def worker_metrics(self) -> str:
        """The Prometheus text of the worker's /metrics/ (the broker's web service in a standalone)."""
        with urllib.request.urlopen(f"{self.admin_url}/metrics/", timeout=30) as resp:
            return resp.read().decode()

    def status_rest(self, fqfn: str) -> Optional[Dict[str, Any]]:
        """The function's status as `functions status` gets it (GET /admin/v3/functions/<fqfn>/status,
        the same FunctionStatus JSON), read without starting the CLI's JVM; None while the worker
        does not answer it (not yet scheduled, leader not ready)."""
        req = urllib.request.Request(f"{self.admin_url}/admin/v3/functions/{fqfn}/status", headers=dict(self.rest_headers))
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.rest_context) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # kept for wait_running's message: what the worker said
            self.last_status_error = f"HTTP {exc.code}: {exc.read()[:500]!r}"
        except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors
            self.last_status_error = repr(exc)
        return None

    def wait_running(self, fqfn: str, instances: int, timeout_s: float = 300,
                     since_restarts: Optional[Dict[int, int]] = None) -> Dict[str, Any]:
        """Until the function's status (`status_rest`: what `functions status` prints) shows
        `instances` running (each past `since_restarts[i]` restarts when given); AssertionError
        with the last status. Polled over REST: a `pulsar-admin` run costs a JVM start, about 3 s
        of CPU, each second of a wait; the tests run the CLI's own `functions status` where they
        check it."""
        deadline = time.monotonic() + timeout_s
        last: Dict[str, Any] = {}
        while time.monotonic() < deadline:
            got = self.status_rest(fqfn)
            if got is not None:
                last = got
                running = [i for i in last.get("instances", []) if i.get("status", {}).get("running")]
                fresh = [i for i in running if since_restarts is None
                         or i["status"].get("numRestarts", 0) > since_restarts.get(i["instanceId"], -1)]
                if len(fresh) >= instances and last.get("numRunning", 0) >= instances:
                    return last
            time.sleep(1.0)
        raise AssertionError(f"{fqfn}: {instances} instances not running within {timeout_s}s; last status "
                             f"{json.dumps(last)[:3000]}; last unanswered status request: "
                             f"{self.last_status_error}")


@dataclass
class RealWorker:
    """A standalone with its function worker, and `pulsar-admin` against it."""

    standalone: PulsarStandalone
    admin: PulsarAdmin

    @property
    def service_url(self) -> str:
        """The broker's pulsar:// URL."""
        return self.standalone.service_url

    @property
    def state_storage_url(self) -> str:
        """The table service holding function state (the worker's stateStorageServiceUrl)."""
        return self.standalone.state_storage_url

    def instance_log(self, fqfn: str, instance_id: int) -> Path:
        """The instance's own log file (the worker's logDirectory/<fqfn>/<name>-<i>.log)."""
        name = fqfn.split("/")[-1]
        return self.standalone.worker_log_dir / fqfn / f"{name}-{instance_id}.log"

    def instance_log_text(self, fqfn: str, instance_id: int) -> str:
        """The instance log as far as written ('' before it exists)."""
        path = self.instance_log(fqfn, instance_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def instance_processes(self, fqfn: str, instance_id: int) -> Dict[int, List[str]]:
        """pid -> command line of the live processes of one instance the worker started."""
        found = {}
        for pid, argv in _instance_processes():
            if "--instance_id" not in argv or argv[argv.index("--instance_id") + 1] != str(instance_id):
                continue
            # Only this worker's: another module's worker (an xdist neighbour) may run the same
            # function names. The process runtime starts instances in the standalone's process group.
            try:
                if os.getpgid(pid) != self.standalone.pid:
                    continue
            except ProcessLookupError:
                continue
            if _fqfn_of(argv) == fqfn:
                found[pid] = argv
        return found

    def instance_pids(self, fqfn: str, instance_id: int) -> List[int]:
        """The live processes of one instance the worker started (by their command line)."""
        return sorted(self.instance_processes(fqfn, instance_id))

    def instance_process(self, fqfn: str, instance_id: int, timeout_s: float = 60.0) -> Tuple[int, List[str]]:
        """(pid, command line) of the one live process of an instance, waiting (bounded) while
        there are none or two: on a loaded machine the worker's liveness check can start an
        instance again (its health checks missed) while the process it replaces still exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.instance_processes(fqfn, instance_id)
            if len(found) == 1:
                return next(iter(found.items()))
            if time.monotonic() > deadline:
                raise AssertionError(f"{fqfn} instance {instance_id}: {len(found)} processes after {timeout_s:.0f} s: "
                                     + "; ".join(f"{pid}: {' '.join(argv)[:300]}" for pid, argv in found.items()))
            time.sleep(0.5)

    def kill_instance(self, fqfn: str, instance_id: int, sig: int = signal.SIGKILL) -> int:
        """Signal the one process of an instance; its pid."""
        pid, _argv = self.instance_process(fqfn, instance_id)
        os.kill(pid, sig)
        return pid


def _instance_processes() -> Iterator[Tuple[int, List[str]]]:
    """(pid, argv) of every live process started from a python_instance_main.py."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(INSTANCE_MAIN.name):
            yield int(proc.name), argv


def _fqfn_of(argv: Sequence[str]) -> str:
    if "--function_details" not in argv:
        return ""
    details = json.loads(argv[argv.index("--function_details") + 1].strip("'"))
    return f"{details.get('tenant')}/{details.get('namespace')}/{details.get('name')}"


def instance_command_lines(fqfn: str) -> List[List[str]]:
    """The command lines of the live instance processes of `fqfn` (what the worker passes)."""
    return [argv for _pid, argv in _instance_processes() if _fqfn_of(argv) == fqfn]


def skip_unless_real_pulsar() -> None:
    """Skip when this run leaves real Pulsar out (TEST_BROKERS=lite)."""
    if "pulsar" not in broker_kinds():
        pytest.skip("not on lite: Pulsar's function worker runs on the real standalone only")


@pytest.fixture(scope="module")
def real_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealWorker]:
    """One standalone with its function worker per test module, and `pulsar-admin` for it."""
    skip_unless_real_pulsar()
    d = tmp_path_factory.mktemp("real-worker")
    standalone = start_worker_standalone(d)
    try:
        yield RealWorker(standalone, PulsarAdmin(standalone.admin_url, standalone.service_url, d / "admin"))
    finally:
        standalone.stop(remove_data=not os.environ.get("TEST_KEEP_BROKER_DATA"))
