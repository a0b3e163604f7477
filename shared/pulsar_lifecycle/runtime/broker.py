"""The embedded default broker: pulsar-lite on a 127.0.0.1 port.

pulsar-lite binds its metrics listener to 0.0.0.0:8080 unless told otherwise and silently
ignores unknown config keys, so we always write the whole config file ourselves.

One store per data directory: the broker runs with its data directory as working directory, so
every path it is given is absolute (a relative one would name a directory nested inside it).
`--db-path <data dir>/pulsar-lite.db` makes it keep `pulsar-lite.rocksdb/` (and, once a topic is
partitioned, `pulsar-lite.metadata.json`) there. Older versions of this package passed a relative
path and so kept the store of a relative data directory nested inside it
(`<data dir>/<the relative path>/pulsar-lite.rocksdb`); a start finds such a store and moves it
into place, or refuses, naming both, when the directory holds two.

A kept data directory also keeps its port (`ports.json`): a restart serves the URL clients were
given, unless another program took the port meanwhile.
"""
from __future__ import annotations

import json
import logging
import os
import random
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
from .listeners import PortHolder, port_holder
from .local_paths import absolute

log = logging.getLogger(__name__)

DB_PATH = "pulsar-lite.db"  # what --db-path names; the broker derives the two below from it
STORE_DIR = "pulsar-lite.rocksdb"
STORE_METADATA = "pulsar-lite.metadata.json"
PORTS_FILE = "ports.json"


class BrokerError(PulsarLifecycleError, RuntimeError):
    """The embedded broker could not be started or stopped, or no broker is reachable."""


class BrokerBusy(BrokerError):
    """The port or the store is still held by the previous broker of the same data directory
    (in its orphan grace period): worth waiting for, unlike any other start failure."""


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


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "ip6-localhost")


def is_apache_pulsar(service_url: Optional[str], proc: Path = Path("/proc")) -> bool:
    """True when `service_url`'s broker is known to be Apache Pulsar, found without a round trip:
    every host of the URL is this machine and the process listening on its port is a JVM running
    Pulsar (its command line, read from /proc). A remote broker, a container's proxy or a
    listener of another user cannot be told apart: False, so the caller keeps what pulsar-lite
    needs (the consumer-id skip: subscribe.py)."""
    if not service_url:
        return False
    hosts = broker_hosts(service_url)
    if not hosts:
        return False
    for host, port in hosts:
        if host.lower() not in _LOCAL_HOSTS and not host.startswith("127."):
            return False
        try:
            holder = port_holder(port, proc)
        except OSError:
            return False
        if holder is None or not holder.argv:
            return False
        argv = " ".join(holder.argv)
        if "java" not in holder.argv[0] or "org.apache.pulsar" not in argv:
            return False
    return True


# How long a command waits for its broker when its --connect-timeout is not given.
DEFAULT_CONNECT_TIMEOUT_S = 30.0

REFUSED_HINT = (
    "nothing listens there. If it is the embedded broker of `pulsar-lifecycle up` or `localrun`, use the URL "
    "it printed at its start: its --data-dir keeps its port across restarts unless another program took "
    "the port meanwhile (then it printed the new one); `--embedded-broker-port N` pins the port")


def _connect(host: str, port: int, timeout: float) -> str:
    """"open", "refused" (nothing listens: known at once) or "no answer" for one TCP connect."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "no answer"


def wait_for_broker(service_url: str, timeout_s: float, interval_s: float = 0.2, refused_fails: bool = False) -> float:
    """Wait until a broker of `service_url` accepts TCP connections; returns the seconds waited.

    Raises BrokerError naming the URL and the time waited when none does within `timeout_s`.
    With `refused_fails`, a connection every host refuses fails at once (nothing listens: a
    command's user gave a wrong or stale URL) with what to do, instead of waiting it out.
    """
    hosts = broker_hosts(service_url)
    if not hosts:
        raise BrokerError(f"not a broker service URL: {service_url!r} (expected pulsar://host:port)")
    t0 = time.monotonic()
    while True:
        outcomes = [_connect(h, p, min(1.0, max(0.1, timeout_s))) for h, p in hosts]
        if "open" in outcomes:
            return time.monotonic() - t0
        if refused_fails and all(o == "refused" for o in outcomes):
            raise BrokerError(f"no broker at {service_url}: {', '.join(f'{h}:{p}' for h, p in hosts)} refused the "
                              f"connection: {REFUSED_HINT}")
        waited = time.monotonic() - t0
        if waited >= timeout_s:
            if all(o == "refused" for o in outcomes):
                raise BrokerError(f"no broker at {service_url}: {', '.join(f'{h}:{p}' for h, p in hosts)} still "
                                  f"refused the connection after {waited:.1f} s: {REFUSED_HINT}")
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


def _store_summary(store: Path) -> str:
    """`1.2 MB, last written 2026-01-31 12:00:00 UTC` of a store directory."""
    size, newest = 0, 0.0
    for root, _dirs, files in os.walk(store):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(newest)) if newest else "never"
    return f"{size / 1e6:.1f} MB, last written {when}"


def stray_stores(data_dir: Path) -> List[Path]:
    """Broker stores (`pulsar-lite.rocksdb` directories) below `data_dir` other than its own: what an
    older version kept nested inside the data dir of a relative --data-dir. Stores are not entered."""
    found = []
    for root, dirs, _files in os.walk(data_dir):
        if STORE_DIR in dirs:
            dirs.remove(STORE_DIR)
            if Path(root) != data_dir:
                found.append(Path(root) / STORE_DIR)
    return sorted(found)


def settle_store(data_dir: Path) -> None:
    """Make `data_dir` (absolute) hold at most one broker store, in place.

    A store an older version kept nested inside it (see the module docstring) is moved into place
    when it is the only one (logged, event=broker_store_moved). With two (or more) nothing is
    moved or started: BrokerError names each, with its size and last write, and what to do.
    """
    strays = stray_stores(data_dir)
    if not strays:
        return
    right = data_dir / STORE_DIR
    if right.exists() or len(strays) > 1:
        stores = ([right] if right.exists() else []) + strays
        listing = "; ".join(f"{p} ({_store_summary(p)})" for p in stores)
        nested_top = data_dir / strays[0].relative_to(data_dir).parts[0]
        raise BrokerError(
            f"{data_dir} holds {len(stores)} broker stores: {listing}. An older version of pulsar-lifecycle kept the "
            f"store of a relative --data-dir nested inside it, so runs with the relative and the absolute spelling "
            f"of one directory wrote different stores. Nothing was started. Keep the store that holds your data and "
            f"move the other out of {data_dir}: to keep the nested one, `mv {right} {right}.old && mv {strays[0]} "
            f"{right}` (and its {STORE_METADATA}, if any, beside it); to keep {right}, move {nested_top} away")
    stray = strays[0]
    os.rename(stray, right)
    meta = stray.parent / STORE_METADATA
    if meta.exists() and not (data_dir / STORE_METADATA).exists():
        os.rename(meta, data_dir / STORE_METADATA)
    parent = stray.parent
    while parent != data_dir:  # the nested directories the old version created, now empty
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent
    log.info("event=broker_store_moved from=%s to=%s reason='an older version kept the store of a relative "
             "--data-dir nested inside it'", stray, right)


# Listener ports are picked below the kernel's ephemeral range: a port the OS hands out (bind to
# port 0) is also where it puts the local end of outgoing connections, so between the pick and a
# JVM binding it 20-30 s later any connection on the machine could take it ("Failed to bind").
_LISTEN_PORTS_FLOOR = 10_000
_PORT_TRIES = 200


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago, below the ephemeral range where it can be
    (random, so that processes picking at once rarely pick the same); else one the OS hands out."""
    top = _ephemeral_floor()
    if top > _LISTEN_PORTS_FLOOR + 1000:
        rng = random.SystemRandom()
        for _ in range(_PORT_TRIES):
            port = rng.randrange(_LISTEN_PORTS_FLOOR, top)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
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
    _requested_port: Optional[int] = field(default=None, init=False, repr=False)
    # When the port this data dir last ran on was taken by another program: (that port, its holder).
    port_changed: Optional[Tuple[int, str]] = field(default=None, init=False)

    @property
    def service_url(self) -> str:
        """The pulsar:// URL clients connect to."""
        return f"pulsar://{self.host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc else None

    @property
    def db_path(self) -> Path:
        """What --db-path names (absolute): the store is `pulsar-lite.rocksdb` beside it."""
        assert self.data_dir is not None
        return absolute(self.data_dir) / DB_PATH

    def _ports_file(self) -> Optional[Path]:
        return None if self._tmp is not None or self.data_dir is None else Path(self.data_dir) / PORTS_FILE

    def remembered_port(self) -> Optional[int]:
        """The port this data directory's broker last ran on (None: never, or a temporary dir)."""
        path = self._ports_file()
        if path is None or not path.is_file():
            return None
        try:
            port = int(json.loads(path.read_text())["broker"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("event=broker_ports_unreadable path=%s error=%r", path, exc)
            return None
        return port if 0 < port < 65536 else None

    def _remember_port(self) -> None:
        path = self._ports_file()
        if path is None:
            return
        try:
            path.write_text(json.dumps({"broker": self.port}) + "\n")
        except OSError as exc:  # only the next start's port depends on it
            log.warning("event=broker_ports_unwritable path=%s error=%r", path, exc)

    def _is_previous_broker(self, holder: Optional[PortHolder]) -> bool:
        """Whether `holder` is a broker on this data directory's store (a previous owner's broker
        in its orphan grace period): its arguments hold this store's --db-path."""
        return holder is not None and str(self.db_path) in holder.argv  # started with this store's --db-path

    def _pick_port(self) -> int:
        """The port to start on: the one asked for; else the one this data dir last ran on; else a
        free one. A port held by the previous broker of this data dir raises BrokerBusy (start()
        waits for it); an asked-for port held by anything else raises BrokerError naming the
        holder; a remembered one held by anything else is given up for a free one (logged)."""
        asked = self._requested_port or 0
        port = asked or self.remembered_port() or 0
        if port and port_open(self.host, port):
            holder = port_holder(port)
            for _ in range(3):  # a holder that is closing (the previous broker stopping) may be gone from /proc
                if holder is not None:
                    break
                if not port_open(self.host, port):
                    return port  # closed meanwhile
                time.sleep(0.05)
                holder = port_holder(port)
            who = holder.describe() if holder else "a process this user cannot see"
            if self._is_previous_broker(holder):
                raise BrokerBusy(f"data directory {self.data_dir} is locked by another broker ({who}, listening on "
                                 f"{self.host}:{port}); broker log: {self.log_path}")
            if asked:
                raise BrokerError(f"port {self.host}:{port} is taken by {who}: stop it, or choose another "
                                  "--embedded-broker-port (0 = the port this --data-dir last ran on, else a free one)")
            new = free_port(self.host)
            log.warning("event=broker_port_changed data_dir=%s previous=%d port=%d holder=%r reason='the port this "
                        "data dir last ran on is taken; clients given the old URL must use the new one'",
                        self.data_dir, port, new, who)
            self.port_changed = (port, who)
            return new
        return port or free_port(self.host)

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
            f'db_path = "{self.db_path}"\n'
            f'log_level = "{self.log_level}"\n'
            "default_partitions = 0\n" + metrics
        )
        return cfg

    def start(self, wait_for_previous: float = 0.0) -> "EmbeddedBroker":
        """Start the broker and wait until its port accepts connections.

        `wait_for_previous` > 0: if the port or the store is held by the previous broker of this
        data directory (in its orphan grace period), keep trying that many seconds. A port held by
        anything else fails at once, naming the holder.
        """
        deadline = time.monotonic() + wait_for_previous
        waited = False
        while True:
            try:
                return self._start_once()
            except BrokerBusy as exc:
                if time.monotonic() >= deadline:
                    raise
                if not waited:  # once: the wait is at most the previous broker's grace period
                    log.info("event=broker_waiting_for_previous data_dir=%s reason=%s", self.data_dir, exc)
                waited = True
                time.sleep(0.25)

    def _start_once(self) -> "EmbeddedBroker":
        if self._proc is not None:
            raise BrokerError("embedded broker already started")
        binary = find_binary()
        if self.data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="pulsar-lifecycle-broker-")
            self.data_dir = Path(self._tmp)
        # Absolute before anything uses it: the broker's working directory is the data directory.
        self.data_dir = absolute(self.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        settle_store(self.data_dir)
        if self._requested_port is None:
            self._requested_port = self.port
        self.port = self._pick_port()
        cfg = self._write_config()
        self._log_file = open(self.log_path, "ab")
        cmd = [
            str(binary), "--config", str(cfg), "--addr", f"{self.host}:{self.port}",
            "--db-path", str(self.db_path), "--log-level", self.log_level,
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
                    holder = lock_holder(self.data_dir / STORE_DIR / "LOCK")
                    who = f"process {holder}" if holder else "another process"
                    raise BrokerBusy(f"data directory {self.data_dir} is locked by another broker ({who}); "
                                      f"broker log: {self.log_path}")
                raise BrokerError(f"pulsar-lite exited with rc={rc} before opening its port: "
                                  f"{_last_line(tail)} (full log: {self.log_path})")
            if port_open(self.host, self.port):
                log.info("event=broker_started url=%s pid=%s data_dir=%s", self.service_url, self._proc.pid, self.data_dir)
                self._remember_port()
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
        self._requested_port = self.port
        self.start()

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
