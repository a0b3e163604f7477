"""The local run mode: `pulsar-lifecycle localrun --function-config-file X.yaml`.

It mirrors `pulsar-admin functions localrun`: the same flags where they apply, the same
instance semantics (see instance.py). With no --broker-service-url it starts the embedded
pulsar-lite broker; its data and the function state live under --data-dir and survive restarts.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import pulsar

from ..clock import wall_clock_ms
from ..config.settings import read_setting, to_int, to_str
from ..durable import atomic_write
from ..exceptions import PulsarLifecycleError
from ..pulsar_io.readers import holding_messages
from ..pulsar_io.subscribe import random_skip, skip_consumer_ids
from ..scheduling_protocol import TICK_PROP
from ..state import open_state_store
from ..state.base import StateStore
from .broker import EmbeddedBroker, is_apache_pulsar, lock_holder, wait_for_broker
from .client import ClientSettings, make_client
from .connect import APACHE_PULSAR_SERVER, check_broker_answers
from .context import FunctionIdentity, LocalContext
from .input_tails import InputTails
from .instance import FunctionInstance
from .local_paths import absolute
from .metrics import FunctionMetrics

log = logging.getLogger(__name__)

# Start ticks (tickMode hold, external broker): from START_TICK_AFTER_S after the start, one per
# START_TICK_S until every instance ran, for at most START_TICKS_S.
START_TICK_AFTER_S = 2.0
HELD_TICK_LOOK_S = 0.5  # how long a Reader looks for a message on the tick topic
START_TICK_S = 0.2
START_TICKS_S = 60.0


def check_reachable(service_url: str, timeout: float = 5.0) -> Optional[str]:
    """Fail fast, naming the URL and the time waited, when no broker of `service_url` accepts
    TCP connections or answers the Pulsar protocol (the client would otherwise retry for its
    whole operation timeout). Returns the server_version the broker answered with."""
    waited = wait_for_broker(service_url, timeout)
    return check_broker_answers(service_url, max(1.0, timeout - waited))


def runs_apache_pulsar(service_url: str, server_version: Optional[str]) -> bool:
    """Whether the broker is Apache Pulsar (no consumer-id skip needed): from the server_version
    its CONNECTED answer gave, else from the local listener's command line (/proc)."""
    if server_version is not None:
        return server_version.startswith(APACHE_PULSAR_SERVER)
    return is_apache_pulsar(service_url)


class DataDirError(PulsarLifecycleError):
    """--data-dir cannot be used: not a directory, not writable, or in use by another localrun."""


def prepare_data_dir(path: Path) -> None:
    """Create --data-dir and prove it writable, or raise DataDirError with one clear line."""
    if path.exists() and not path.is_dir():
        raise DataDirError(f"--data-dir {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DataDirError(f"--data-dir {path}: a parent of it is a regular file, not a directory") from None
    except OSError as exc:
        raise DataDirError(f"--data-dir {path} cannot be created: {exc.strerror} ({errno.errorcode.get(exc.errno or 0, exc.errno)})") from None
    # Per process: several localruns may share one --data-dir with an external broker.
    probe = path / f".write-probe.{os.getpid()}"
    try:
        atomic_write(probe, b"ok")
        probe.unlink()
    except OSError as exc:
        raise DataDirError(f"--data-dir {path} is not writable: {exc}") from None


class DataDirLock:
    """One localrun with an embedded broker per --data-dir: an flock on `<data-dir>/localrun.lock`.

    The lock dies with the process (even SIGKILL); the file descriptor is not inherited by the
    broker (close_fds), so an orphaned broker never keeps it.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "localrun.lock"
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataDirError(f"--data-dir {self.path.parent}: cannot open {self.path.name}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = lock_holder(self.path) or _pid_in(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise DataDirError(f"--data-dir {self.path.parent.resolve()} is in use by another localrun ({who}) "
                               "with its embedded broker; stop it or give this run its own --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # informational only: /proc/locks is authoritative
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _pid_in(fd: int) -> Optional[int]:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


@dataclass
class LocalRunOptions:
    """Everything `localrun` takes besides the function config itself."""

    broker_service_url: Optional[str] = None
    state_storage_service_url: Optional[str] = None
    client: Optional[ClientSettings] = None
    data_dir: Path = Path(".pulsar-lifecycle")
    metrics_port: Optional[int] = None
    embedded_broker_port: int = 0
    instance_id_offset: int = 0
    # All instances of the function, in this process and others (pulsar-admin localrun's
    # instances split over processes with --instance-id-offset); None = offset + parallelism.
    num_instances: Optional[int] = None
    # Pulsar's Python runtime ignores negativeAckRedeliveryDelayMs and uses the client's 60 s.
    nack_redelivery_delay_ms: int = 60000
    # Start ticks for a tickMode hold function on an external broker when no instance ran within
    # START_TICK_AFTER_S (a dead consumer may hold its wake tick); False: only the held tick wakes it.
    start_ticks: bool = True


@dataclass
class LocalRunner:
    """Runs `parallelism` instances of one function until stop() (or Ctrl-C)."""

    spec: Any
    options: LocalRunOptions
    broker: Optional[EmbeddedBroker] = None
    metrics: Optional[FunctionMetrics] = None
    metrics_port: Optional[int] = None
    _clients: List[pulsar.Client] = field(default_factory=list, repr=False)
    _instances: List[FunctionInstance] = field(default_factory=list, repr=False)
    _state: Optional[StateStore] = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _ticker: Optional[threading.Thread] = field(default=None, repr=False)
    _tick_producer: Any = field(default=None, repr=False)
    _lock: Optional[DataDirLock] = field(default=None, repr=False)
    _tails: Optional[InputTails] = field(default=None, repr=False)

    @property
    def service_url(self) -> str:
        """The broker URL the instances use."""
        if self.options.broker_service_url:
            return self.options.broker_service_url
        assert self.broker is not None
        return self.broker.service_url

    def start(self) -> "LocalRunner":
        """Start the broker if needed, the state store, metrics and every instance."""
        # Absolute once, here: the broker, the state store and the functions' snapshot dirs all
        # derive their paths from it, and the broker runs in a working directory of its own.
        data_dir = absolute(self.options.data_dir)
        prepare_data_dir(data_dir)
        server_version: Optional[str] = None
        if self.options.broker_service_url:
            server_version = check_reachable(self.options.broker_service_url)
        else:
            # The embedded broker's store cannot be shared; with an external broker several
            # functions may share one --data-dir (state tables and snapshot dirs are per function).
            self._lock = DataDirLock(data_dir)
            self._lock.acquire()
            self.broker = EmbeddedBroker(data_dir=data_dir / "broker", port=self.options.embedded_broker_port,
                                         die_with_parent=True)
            # After a crash the previous run's broker lives on for its grace period.
            self.broker.start(wait_for_previous=self.broker.orphan_grace_seconds + 10)
        spec = self.spec
        self._state = open_state_store(self.options.state_storage_service_url, data_dir / "state",
                                       spec.tenant, spec.namespace, spec.name)
        fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
        self.metrics = FunctionMetrics(fqfn)
        if self.options.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.options.metrics_port)
        settings = self.options.client or ClientSettings(self.service_url)
        if settings.service_url != self.service_url:
            settings = ClientSettings(self.service_url, settings.auth_plugin, settings.auth_params, settings.use_tls,
                                      settings.tls_allow_insecure, settings.hostname_verification_enabled,
                                      settings.tls_trust_cert_path)
        function_id = str(uuid.uuid5(uuid.NAMESPACE_URL, fqfn))
        # One client for all instances: pulsar-lite keys a subscription's consumers by the
        # client-chosen consumer id, so two clients' consumer 0 on one Shared subscription clash
        # ("Consumer 0 already exists"); a real worker runs one process (and client) per instance.
        client = make_client(settings)
        self._clients.append(client)
        if self.options.broker_service_url:
            # A broker this process does not own may still hold a SIGKILLed predecessor's
            # consumers under the ids this client would pick first (pulsar-lite: subscribe.py).
            # Apache Pulsar drops a closed connection's consumers: no skip (told by the reachability
            # probe's answer, no further round trip).
            skip_consumer_ids(client, random_skip(), f"non-persistent://{spec.tenant}/{spec.namespace}/"
                                                     "pulsar-lifecycle-consumer-ids",
                              apache_pulsar=runs_apache_pulsar(self.options.broker_service_url, server_version))
        parallelism = max(1, int(spec.parallelism or 1))
        total = self.options.num_instances or self.options.instance_id_offset + parallelism
        if total < self.options.instance_id_offset + parallelism:
            raise ValueError(f"--num-instances {total} is below --instance-id-offset + parallelism "
                             f"({self.options.instance_id_offset + parallelism})")
        if self.options.instance_id_offset == 0 and total == parallelism and spec.inputs:
            # All instances of the subscription run here: what none of them received after the
            # kept floor is held by a dead consumer (pulsar-lite), read with a Reader (input_tails.py).
            self._tails = InputTails(client, data_dir, fqfn, spec.sub_name)
        for i in range(parallelism):
            identity = FunctionIdentity(spec.tenant, spec.namespace, spec.name, self.options.instance_id_offset + i,
                                        function_id, "local", num_instances=total)
            ctx = LocalContext(
                identity=identity, client=client, consumers={}, input_topics=list(spec.inputs),
                output_topic=spec.output, output_serde_class_name=spec.output_serde_class_name or "serde.IdentitySerDe",
                user_config=dict(spec.user_config or {}), secrets=dict(spec.secrets or {}), state=self._state,
                metrics=self.metrics, logger=logging.getLogger(f"function.{fqfn}.{i}"), data_dir=data_dir,
            )
            inst = FunctionInstance(spec, ctx, client, nack_delay_ms=self.options.nack_redelivery_delay_ms,
                                    tails=self._tails)
            inst.start()
            self._instances.append(inst)
        if self._tails is not None:
            self._tails.start()
        self._start_ticker()
        log.info("event=localrun_started fqfn=%s broker=%s parallelism=%d", fqfn, self.service_url, len(self._instances))
        return self

    def _start_ticker(self) -> None:
        # Functions need a clock that fires with an idle input (DESIGN §5): on a broker without
        # delayed delivery the runner, not a deliver_after chain, produces the ticks.
        # The three tick keys read with the functions' own converters (config/settings.py).
        uc = self.spec.user_config
        topic = read_setting(uc, "tickTopic", to_str, "")
        if not topic:
            return
        if read_setting(uc, "tickMode", to_str, "runner") != "runner":
            self._start_ticks(topic)
            return
        interval = max(50, read_setting(uc, "tickTimeMillis", to_int, 1000)) / 1000.0
        producer = self._tick_producer = self._clients[0].create_producer(topic, batching_enabled=False)

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    producer.send_async(b"tick", None, properties={TICK_PROP: str(wall_clock_ms())})
                except Exception as exc:  # the client may be closing
                    log.debug("event=tick_failed topic=%s error=%r", topic, exc)
        self._ticker = threading.Thread(target=run, name="localrun-ticker", daemon=True)
        self._ticker.start()

    def _start_ticks(self, topic: str) -> None:
        # A function that holds a wake tick (tickMode hold) starts when the broker redelivers it.
        # A pulsar-lite this process does not own can keep a SIGKILLed predecessor's consumer,
        # and the held tick with it, registered until it restarts; that consumer's permits also
        # slow what reaches the new one (scheduler/intake_gaps.py). So when an instance has
        # processed nothing START_TICK_AFTER_S after the start, ticks are sent until every one has;
        # each extra one is acked on arrival.
        if not self.options.broker_service_url or not self.options.start_ticks:
            return  # the embedded broker started with this process: nothing is held

        def started() -> bool:
            return all(inst.processed.is_set() for inst in self._instances)

        def run() -> None:
            if self._stop.wait(START_TICK_AFTER_S) or started():
                return
            try:
                producer = self._tick_producer = self._clients[0].create_producer(topic, batching_enabled=False)
            except Exception as exc:  # the client may be closing
                log.debug("event=tick_failed topic=%s error=%r", topic, exc)
                return
            # A tick topic without messages (a new broker or function) has no held tick: the
            # instances wait for their first input, and these ticks start them. One that holds
            # messages and still started no instance lost its held tick to a consumer the broker kept.
            try:
                held = bool(holding_messages(self._clients[0], [topic], HELD_TICK_LOOK_S))
            except pulsar.PulsarException as exc:
                log.debug("event=held_tick_look_failed topic=%s error=%r", topic, exc)
                held = True
            if held:
                log.warning("event=start_ticks topic=%s reason='no instance ran within %.0f s of the start: the held "
                            "wake tick may be with a dead consumer the broker kept'", topic, START_TICK_AFTER_S)
            else:
                log.info("event=start_ticks topic=%s reason='no wake tick on the topic yet (a new topic): the ticks "
                         "start the instances before their first input'", topic)
            deadline = time.monotonic() + START_TICKS_S
            while time.monotonic() < deadline and not started():
                try:
                    producer.send_async(b"tick", None, properties={TICK_PROP: str(wall_clock_ms())})
                except Exception as exc:  # the client may be closing
                    log.debug("event=tick_failed topic=%s error=%r", topic, exc)
                if self._stop.wait(START_TICK_S):
                    return
        self._ticker = threading.Thread(target=run, name="localrun-start-ticks", daemon=True)
        self._ticker.start()

    def functions(self) -> List[Any]:
        """The user function object of each instance (None until that instance loaded it)."""
        return [inst.function for inst in self._instances]

    def instances_running(self) -> int:
        """How many of the instances are running (for status views)."""
        return sum(1 for inst in self._instances if inst.running)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until stop() is called (or `timeout` passes)."""
        self._stop.wait(timeout)

    def stop(self) -> None:
        """Stop in order: the ticker, the instances (their producers, then consumers), the
        client, the state store, the embedded broker; then release --data-dir.

        Every producer and consumer is closed before its client, and the client before the
        interpreter exits: pulsar-client objects left to interpreter shutdown abort the process
        ("terminate called without an active exception"). Safe to call twice.
        """
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        if self._tick_producer is not None:
            _close_quietly(self._tick_producer, "tick producer")
            self._tick_producer = None
        if self._tails is not None:
            self._tails.stop()
            self._tails = None
        for inst in self._instances:
            inst.stop()
        self._instances.clear()
        for c in self._clients:
            _close_quietly(c, "client")
        self._clients.clear()
        if self._state is not None:
            self._state.close()
            self._state = None
        if self.broker is not None:
            self.broker.stop(remove_data=False)
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        log.info("event=localrun_stopped")


def _close_quietly(obj: Any, what: str) -> None:
    try:
        obj.close()
    except Exception as exc:  # shutting down: keep closing the rest (the broker may be gone)
        log.debug("event=close_failed what=%s error=%r", what, exc)
