"""The embedded default broker: pulsar-lite started on a free 127.0.0.1 port.

pulsar-lite binds its metrics listener to 0.0.0.0:8080 unless told otherwise and silently
ignores unknown config keys, so we always write the whole config file ourselves.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, List, Optional, Tuple

from ..exceptions import PulsarLifecycleError

log = logging.getLogger(__name__)


class BrokerError(PulsarLifecycleError, RuntimeError):
    """The embedded broker could not be started or stopped, or no broker is reachable."""


def broker_hosts(service_url: str) -> List[Tuple[str, int]]:
    """(host, port) pairs of a pulsar:// or pulsar+ssl:// URL (several hosts separated by commas)."""
    rest = service_url.split("://", 1)[-1].split("/", 1)[0]
    out = []
    for host in filter(None, rest.split(",")):
        name, _, port = host.rpartition(":")
        if not name:
            name, port = host, "6651" if service_url.startswith("pulsar+ssl") else "6650"
        if port.isdigit():
            out.append((name.strip("[]"), int(port)))
    return out


def wait_for_broker(service_url: str, timeout_s: float, interval_s: float = 0.2) -> float:
    """Wait until a broker of `service_url` accepts TCP connections; returns the seconds waited.

    Raises BrokerError naming the URL and the time waited when none does within `timeout_s`.
    """
    hosts = broker_hosts(service_url)
    if not hosts:
        raise BrokerError(f"not a broker service URL: {service_url!r} (expected pulsar://host:port)")
    t0 = time.monotonic()
    while True:
        if any(port_open(h, p, timeout=min(1.0, max(0.1, timeout_s))) for h, p in hosts):
            return time.monotonic() - t0
        waited = time.monotonic() - t0
        if waited >= timeout_s:
            raise BrokerError(f"no broker reachable at {service_url}: nothing accepted a connection on "
                              f"{', '.join(f'{h}:{p}' for h, p in hosts)} within {waited:.1f} s")
        time.sleep(interval_s)


def lock_holder(path: Path) -> Optional[int]:
    """The PID holding a flock/fcntl lock on `path` (from /proc/locks), or None if unknown."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (blocked waiters have "->" in front)
        if "->" in parts or len(parts) < 6:
            continue
        try:
            pid = int(parts[4])
            inode = int(parts[5].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        if inode == st.st_ino:
            return pid
    return None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else "(empty log)"


def find_binary() -> Path:
    """Locate the pulsar-lite executable shipped in the pulsar-lite wheel (or $PULSAR_LITE_BINARY)."""
    env = os.environ.get("PULSAR_LITE_BINARY")
    if env:
        if Path(env).is_file():
            return Path(env)
        raise BrokerError(f"PULSAR_LITE_BINARY={env} does not exist")
    try:
        import pulsar_lite  # type: ignore
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the pulsar-lite package: pip install 'pulsar-lifecycle[local]' "
            "(or pass --broker-service-url pulsar://host:6650 to use a real Pulsar)"
        ) from exc
    binary = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    if not binary.is_file():
        found = shutil.which("pulsar-lite")
        if not found:
            raise BrokerError(f"pulsar-lite binary not found at {binary} nor on PATH")
        binary = Path(found)
    return binary


# When the owning process dies (even by SIGKILL) its broker must not keep holding the db lock.
# The broker is stopped a grace period *after* the owner is gone, so it handles the dead client's
# connection close (and redelivers what that client had not acked) before it goes down itself;
# the next run waits for the previous broker's grace period (EmbeddedBroker.start).
_WATCHDOG = (
    "while kill -0 {owner} 2>/dev/null; do sleep 0.2; done; sleep {grace}; kill -9 {broker} 2>/dev/null"
)


def _start_watchdog(owner_pid: int, broker_pid: int, grace_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        ["sh", "-c", _WATCHDOG.format(owner=owner_pid, broker=broker_pid, grace=grace_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class EmbeddedBroker:
    """A pulsar-lite process owned by this object.

    `data_dir` is kept across restarts when given; otherwise a temporary directory is used and
    removed on stop. Metrics are off unless `metrics_port` is set, and then bound to 127.0.0.1.
    """

    data_dir: Optional[Path] = None
    port: int = 0
    host: str = "127.0.0.1"
    log_level: str = "warn"
    metrics_port: Optional[int] = None
    start_timeout: float = 15.0
    die_with_parent: bool = False
    orphan_grace_seconds: float = 1.0
    _watchdog: Optional[subprocess.Popen] = field(default=None, init=False, repr=False)
    _proc: Optional[subprocess.Popen] = field(default=None, init=False, repr=False)
    _tmp: Optional[str] = field(default=None, init=False, repr=False)
    _log_file: Optional[IO[bytes]] = field(default=None, init=False, repr=False)

    @property
    def service_url(self) -> str:
        """The pulsar:// URL clients connect to."""
        return f"pulsar://{self.host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        """Where the broker's stderr goes (pulsar-lite writes no log file of its own)."""
        assert self.data_dir is not None
        return Path(self.data_dir) / "pulsar-lite.log"

    def _write_config(self) -> Path:
        assert self.data_dir is not None
        metrics = (
            f'[metrics]\nenabled = true\naddr = "127.0.0.1:{self.metrics_port}"\n'
            if self.metrics_port
            else "[metrics]\nenabled = false\n"
        )
        cfg = Path(self.data_dir) / "pulsar-lite.toml"
        cfg.write_text(
            f'addr = "{self.host}:{self.port}"\n'
            f'db_path = "{Path(self.data_dir) / "pulsar-lite.db"}"\n'
            f'log_level = "{self.log_level}"\n'
            "default_partitions = 0\n" + metrics
        )
        return cfg

    def start(self, wait_for_previous: float = 0.0) -> "EmbeddedBroker":
        """Start the broker and wait until its port accepts connections.

        `wait_for_previous` > 0: if the port is taken or the data directory locked (a previous
        owner's broker in its orphan grace period), keep trying that many seconds.
        """
        deadline = time.monotonic() + wait_for_previous
        while True:
            try:
                return self._start_once()
            except BrokerError as exc:
                busy = "already in use" in str(exc) or "locked by another broker" in str(exc)
                if not busy or time.monotonic() >= deadline:
                    raise
                log.info("event=broker_waiting_for_previous data_dir=%s reason=%s", self.data_dir, exc)
                time.sleep(0.25)

    def _start_once(self) -> "EmbeddedBroker":
        if self._proc is not None:
            raise BrokerError("embedded broker already started")
        binary = find_binary()
        if self.data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="pulsar-lifecycle-broker-")
            self.data_dir = Path(self._tmp)
        self.data_dir = Path(self.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        elif port_open(self.host, self.port):
            raise BrokerError(f"port {self.host}:{self.port} is already in use")
        cfg = self._write_config()
        self._log_file = open(self.log_path, "ab")
        cmd = [
            str(binary), "--config", str(cfg), "--addr", f"{self.host}:{self.port}",
            "--db-path", str(self.data_dir / "pulsar-lite.db"), "--log-level", self.log_level,
        ]
        # cwd = data dir so a stray ./pulsar-lite.toml elsewhere is never picked up.
        self._proc = subprocess.Popen(
            cmd, cwd=self.data_dir, stdout=self._log_file, stderr=self._log_file,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        if self.die_with_parent:
            self._watchdog = _start_watchdog(os.getpid(), self._proc.pid, self.orphan_grace_seconds)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                tail = self._log_tail()
                self._cleanup_proc()
                if "LOCK" in tail or "lock file" in tail.lower():
                    holder = lock_holder(self.data_dir / "pulsar-lite.db" / "LOCK")
                    who = f"process {holder}" if holder else "another process"
                    raise BrokerError(f"data directory {self.data_dir} is locked by another broker ({who}); "
                                      f"broker log: {self.log_path}")
                raise BrokerError(f"pulsar-lite exited with rc={rc} before opening its port: "
                                  f"{_last_line(tail)} (full log: {self.log_path})")
            if port_open(self.host, self.port):
                log.info("event=broker_started url=%s pid=%s data_dir=%s", self.service_url, self._proc.pid, self.data_dir)
                return self
            time.sleep(0.02)
        self.stop()
        raise BrokerError(f"pulsar-lite did not open {self.host}:{self.port} within {self.start_timeout:.0f}s; log: {self.log_path}")

    def _log_tail(self) -> str:
        """The end of this run's broker log (what the console must not be flooded with)."""
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _cleanup_proc(self) -> None:
        self._proc = None
        if self._watchdog is not None:
            try:
                os.killpg(self._watchdog.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._watchdog.wait(timeout=5)
            self._watchdog = None
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    def stop(self, kill: bool = False, remove_data: Optional[bool] = None) -> None:
        """Stop the broker by its own PID (SIGTERM, or SIGKILL when `kill`)."""
        if self._proc is not None:
            try:
                self._proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            except ProcessLookupError:
                pass
            log.info("event=broker_stopped url=%s kill=%s", self.service_url, kill)
            self._cleanup_proc()
        if remove_data is None:
            remove_data = self._tmp is not None
        if remove_data and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self._tmp = None

    def restart(self) -> None:
        """Stop and start again on the same port and data directory."""
        self.stop(remove_data=False)
        self.start()

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
