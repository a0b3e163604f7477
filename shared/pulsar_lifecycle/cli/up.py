"""`pulsar-lifecycle up`: the broker and every shipped function as one long-lived local service.

One process: the embedded pulsar-lite broker (or an external one), and one local runner
(runtime/localrun.py, as `localrun` runs it) per function config. Everything keeps its data in
one `--data-dir` (the broker's store, the function state, the writer's bucket snapshots), the
same layout `localrun` uses, so a restart with the same directory picks up where the last run
stopped and `inspect writer --data-dir DIR` reads what `up` runs.

The configs run as given: the shipped set joins up by itself (the deletion worker's delays and
the syncer's forwards go to the shipped writer's scheduling topic), and whatever in a custom set
does not join up (`validate --system`) is reported when it starts, never rewired. For
one machine only: on the embedded broker the deletion worker runs without the admin REST and
bookie HTTP URLs (pulsar-lite has neither) and with the writer's manifest as its in-use oracle for
DELAYED_INDEX_BUCKET requests (DESIGN §7), and the writer and syncer record their metrics every
`METRICS_INTERVAL_S` seconds for the status view.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config.function_config import load_function_config, spec_from_config
from ..config.system import system_problems
from ..delaylevel.rule import DEFAULT_DELAY_LEVEL_TOPIC
from ..logging_setup import ClientLogRotation, route_client_log
from ..runtime.broker import EmbeddedBroker
from ..runtime.client import ClientSettings, make_client
from ..runtime.connect import open_client
from ..runtime.local_paths import absolute
from ..runtime.localrun import DataDirLock, LocalRunner, LocalRunOptions, prepare_data_dir
from ..scheduler.wake import send_start_ticks
from .function_registry import USER_CONFIG_KEYS, topology_of
from .up_manifest import remove_manifest, write_manifest

log = logging.getLogger(__name__)

__all__ = ["FunctionPlan", "LocalService", "plan_functions"]

WRITER = "bucket_snapshot_writer.BucketSnapshotWriter"
SYNCER = "delay_level_syncer.DelayLevelSyncer"
WORKER = "ledger_deletion_worker.LedgerDeletionWorker"
# Start order: the writer first (the others send to its scheduling topic), unknown classes last.
START_ORDER = {WRITER: 0, SYNCER: 1, WORKER: 2}
METRICS_INTERVAL_S = 2
LITE_UNSERVED_KEYS = ("pulsarAdminUrl", "bookieHttpUrls")


@dataclass(frozen=True)
class FunctionPlan:
    """One function `up` runs: its config file, spec (with up's wiring applied) and what changed."""

    path: Path
    spec: Any
    changes: Tuple[str, ...] = ()


def _configs(files: Sequence[Path]) -> Tuple[List[Tuple[Path, Dict[str, Any]]], List[str]]:
    """(configs to run, notes on skipped ones): one config per function name (two cannot run
    at once), the file with the shortest name winning."""
    loaded = [(path, load_function_config(path)) for path in sorted(files, key=lambda p: (len(p.name), p.name))]
    chosen: Dict[str, Tuple[Path, Dict[str, Any]]] = {}
    notes = []
    for path, cfg in loaded:
        spec = spec_from_config(cfg)
        fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
        if fqfn in chosen:
            notes.append(f"skipped {path.name}: another config of {fqfn} ({chosen[fqfn][0].name}) runs")
            continue
        chosen[fqfn] = (path, cfg)
    return list(chosen.values()), notes


def _dead_ends(configs: Sequence[Tuple[Path, Dict[str, Any]]]) -> List[str]:
    """What in the configs that run does not join up (config/system.py), as notes."""
    try:
        functions = [topology_of(cfg, path.name) for path, cfg in configs]
    except (ValueError, TypeError):
        return []  # a config the functions refuse: its own start reports it
    return [f"dead end: {line}" for line in
            system_problems(functions, default_parked_on=[(DEFAULT_DELAY_LEVEL_TOPIC, "DelayLevelProducer's default")])]


def _writer_manifest_oracle(configs: Sequence[Tuple[Path, Dict[str, Any]]], data_dir: Path) -> Dict[str, str]:
    """The userConfig that makes a deletion worker's in-use oracle and store for
    DELAYED_INDEX_BUCKET requests the manifest and snapshot directory of the writer running here
    (DESIGN §7, embedded default), or {} when no single writer keeps its index in a directory."""
    writers = [spec_from_config(cfg) for _, cfg in configs if spec_from_config(cfg).class_name == WRITER]
    if len(writers) != 1:
        return {}
    writer = writers[0]
    user = writer.user_config or {}
    if (user.get("schedulingTopicPartitions") or int(writer.parallelism or 1) > 1
            or user.get("snapshotStorage", "auto") not in ("auto", "directory") or user.get("snapshotStorageServiceUrl")):
        return {}  # one directory per partition or instance, or a table service: not one manifest here
    # the local runner's default (scheduler/snapshot_location.py) unless the config names one
    table = f"{writer.tenant}_{writer.namespace}_{writer.name}".replace("-", "_")
    snapshot_dir = str(user.get("snapshotDir") or Path(data_dir) / "buckets" / table)
    return {"bucketSnapshotHooks": "pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks",
            "bucketSnapshotDir": snapshot_dir}


def plan_functions(files: Sequence[Path], embedded: bool,
                   data_dir: Optional[Path] = None) -> Tuple[List[FunctionPlan], List[str]]:
    """The functions to run, in start order, with the changes for one machine (see the module
    docstring); the notes name skipped configs and what does not join up."""
    configs, notes = _configs(files)
    notes += _dead_ends(configs)
    plans = []
    for path, cfg in configs:
        spec = spec_from_config(cfg)
        user = dict(spec.user_config or {})
        changes = []
        keys = USER_CONFIG_KEYS.get(spec.class_name, ())
        if embedded and spec.class_name == WORKER:
            dropped = [k for k in LITE_UNSERVED_KEYS if k in user]
            for k in dropped:
                del user[k]
            if dropped:
                changes.append(f"without {', '.join(dropped)} (pulsar-lite serves neither)")
            oracle = _writer_manifest_oracle(configs, data_dir) if data_dir is not None else {}
            if oracle and not user.get("bucketSnapshotHooks"):
                user.update(oracle)
                changes.append(f"in-use oracle and store for DELAYED_INDEX_BUCKET requests: the writer's manifest in "
                               f"{oracle['bucketSnapshotDir']} (bucketSnapshotHooks)")
        if "metricsIntervalSeconds" in keys:
            user["metricsIntervalSeconds"] = METRICS_INTERVAL_S
        plans.append(FunctionPlan(path, spec_from_config(cfg, {"userConfig": user}), tuple(changes)))
    plans.sort(key=lambda p: START_ORDER.get(p.spec.class_name, len(START_ORDER)))
    return plans, notes


@dataclass
class LocalService:
    """The broker and the planned functions, started and stopped together."""

    plans: List[FunctionPlan]
    data_dir: Path
    broker_service_url: Optional[str] = None
    # The external broker's connection settings (credentials, TLS trust: the command's client
    # options); None = the plain URL. Unused with the embedded broker.
    client: Optional[ClientSettings] = None
    state_storage_service_url: Optional[str] = None
    embedded_broker_port: int = 0
    broker: Optional[EmbeddedBroker] = None
    runners: Dict[str, LocalRunner] = field(default_factory=dict)
    client_log: str = ""
    _lock: Optional[DataDirLock] = field(default=None, repr=False)
    _rotation: Optional[ClientLogRotation] = field(default=None, repr=False)
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def service_url(self) -> str:
        """The broker URL everything uses."""
        if self.broker_service_url:
            return self.broker_service_url
        assert self.broker is not None, "start() first"
        return self.broker.service_url

    @property
    def client_settings(self) -> ClientSettings:
        """How every client of this service connects: the external broker's settings, or the
        embedded broker's plain URL."""
        if self.broker_service_url and self.client is not None:
            return self.client
        return ClientSettings(service_url=self.service_url)

    def start(self) -> "LocalService":
        """Start the broker (unless external), then every function in plan order; on a failure
        stop what started and raise."""
        self.data_dir = absolute(self.data_dir)  # one state per directory, however it was spelled
        prepare_data_dir(self.data_dir)
        self.client_log = route_client_log(self.data_dir / "pulsar-client.log")
        self._rotation = ClientLogRotation(Path(self.client_log)).start()  # size-bounded while up runs
        try:
            if self.broker_service_url:
                # Reachable, answering, and accepting the credential, or one line naming the URL.
                open_client(self.client_settings, 5.0).close()
            else:
                self._lock = DataDirLock(self.data_dir)
                self._lock.acquire()
                self.broker = EmbeddedBroker(data_dir=self.data_dir / "broker", port=self.embedded_broker_port,
                                             die_with_parent=True)
                # After a crash the previous run's broker lives on for its grace period.
                self.broker.start(wait_for_previous=self.broker.orphan_grace_seconds + 10)
            for plan in self.plans:
                spec = plan.spec
                opts = LocalRunOptions(broker_service_url=self.service_url,
                                       state_storage_service_url=self.state_storage_service_url,
                                       client=self.client_settings, data_dir=self.data_dir)
                self.runners[spec.name] = LocalRunner(spec, opts).start()
                log.info("event=up_function_started fqfn=%s/%s/%s config=%s", spec.tenant, spec.namespace, spec.name,
                         plan.path.name)
            self._wake()
            # What runs here, as it runs (e.g. the worker without the URLs pulsar-lite lacks), for
            # commands that need a running function's terms (`deletion enqueue`).
            write_manifest(self.data_dir, self.service_url, self.broker is not None, self.plans)
        except BaseException:
            self.stop()
            raise
        log.info("event=up_started broker=%s functions=%d data_dir=%s", self.service_url, len(self.runners),
                 self.data_dir)
        return self

    def _wake(self) -> None:
        """One tick to every function that waits for its first input in `hold` mode, so each
        builds its service now rather than at the first message (extra ticks are acked)."""
        topics = [p.spec.user_config.get("tickTopic") for p in self.plans
                  if p.spec.user_config.get("tickTopic") and p.spec.user_config.get("tickMode", "hold") != "runner"]
        if not topics:
            return
        client = make_client(self.client_settings)
        try:
            for topic in topics:
                send_start_ticks(client, topic, 1)
        finally:
            client.close()

    def wait(self, timeout: Optional[float]) -> bool:
        """Block until stop() is called or `timeout` passes; True when stopped."""
        return self._stopped.wait(timeout)

    def request_stop(self) -> None:
        """Ask wait() to return (from a signal handler; stop() does the work)."""
        self._stopped.set()

    def stop(self) -> None:
        """Stop the functions (last started first), then the broker; release --data-dir. Safe twice."""
        self._stopped.set()
        remove_manifest(self.data_dir)
        for name in reversed(list(self.runners)):
            t0 = time.monotonic()
            self.runners[name].stop()
            log.info("event=up_function_stopped name=%s seconds=%.2f", name, time.monotonic() - t0)
        self.runners.clear()
        if self.broker is not None:
            self.broker.stop(remove_data=False)
            self.broker = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._rotation is not None:
            self._rotation.stop()
            self._rotation = None
