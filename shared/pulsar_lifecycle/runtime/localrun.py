"""The local run mode: `pulsar-lifecycle localrun --function-config-file X.yaml`.

It mirrors `pulsar-admin functions localrun`: the same flags where they apply, the same
instance semantics (see instance.py). With no --broker-service-url it starts the embedded
pulsar-lite broker; its data and the function state live under --data-dir and survive restarts.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import pulsar

from ..state import open_state_store
from ..state.base import StateStore
from .broker import BrokerError, EmbeddedBroker, port_open
from .client import ClientSettings, make_client
from .context import FunctionIdentity, LocalContext
from .instance import FunctionInstance
from .metrics import FunctionMetrics

log = logging.getLogger(__name__)

TICK_PROP = "__pl_tick__"


def check_reachable(service_url: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the URL, when no broker of `service_url` accepts TCP connections.

    The client would otherwise retry for its whole operation timeout per consumer.
    """
    rest = service_url.split("://", 1)[-1].rstrip("/")
    hosts = [h for h in rest.split(",") if h]
    for host in hosts:
        name, _, port = host.rpartition(":")
        if name and port.isdigit() and port_open(name.strip("[]"), int(port), timeout=timeout):
            return
    raise BrokerError(f"no broker reachable at {service_url} (nothing accepts connections on {', '.join(hosts)})")


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
    # Pulsar's Python runtime ignores negativeAckRedeliveryDelayMs and uses the client's 60 s.
    nack_redelivery_delay_ms: int = 60000


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

    @property
    def service_url(self) -> str:
        """The broker URL the instances use."""
        if self.options.broker_service_url:
            return self.options.broker_service_url
        assert self.broker is not None
        return self.broker.service_url

    def start(self) -> "LocalRunner":
        """Start the broker if needed, the state store, metrics and every instance."""
        data_dir = Path(self.options.data_dir)
        if self.options.broker_service_url:
            check_reachable(self.options.broker_service_url)
        else:
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
        for i in range(max(1, int(spec.parallelism or 1))):
            identity = FunctionIdentity(spec.tenant, spec.namespace, spec.name, self.options.instance_id_offset + i,
                                        function_id, "local")
            ctx = LocalContext(
                identity=identity, client=client, consumers={}, input_topics=list(spec.inputs),
                output_topic=spec.output, output_serde_class_name=spec.output_serde_class_name or "serde.IdentitySerDe",
                user_config=dict(spec.user_config or {}), secrets=dict(spec.secrets or {}), state=self._state,
                metrics=self.metrics, logger=logging.getLogger(f"function.{fqfn}.{i}"), data_dir=data_dir,
            )
            inst = FunctionInstance(spec, ctx, client, nack_delay_ms=self.options.nack_redelivery_delay_ms)
            inst.start()
            self._instances.append(inst)
        self._start_ticker()
        log.info("event=localrun_started fqfn=%s broker=%s parallelism=%d", fqfn, self.service_url, len(self._instances))
        return self

    def _start_ticker(self) -> None:
        # Functions need a clock that fires with an idle input (DESIGN §5): on a broker without
        # delayed delivery the runner, not a deliver_after chain, produces the ticks.
        uc = self.spec.user_config or {}
        topic = uc.get("tickTopic")
        if not topic or str(uc.get("tickMode", "runner")) != "runner":
            return
        interval = max(50, int(uc.get("tickTimeMillis", 1000))) / 1000.0
        producer = self._clients[0].create_producer(topic, batching_enabled=False)

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    producer.send_async(b"tick", None, properties={TICK_PROP: str(int(time.time() * 1000))})
                except Exception as exc:  # the client may be closing
                    log.debug("event=tick_failed topic=%s error=%r", topic, exc)
        self._ticker = threading.Thread(target=run, name="localrun-ticker", daemon=True)
        self._ticker.start()

    def functions(self) -> List[Any]:
        """The user function object of each instance (None until that instance loaded it)."""
        return [inst.function for inst in self._instances]

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until stop() is called (or `timeout` passes)."""
        self._stop.wait(timeout)

    def stop(self) -> None:
        """Stop instances, flush, close clients, stop the embedded broker."""
        self._stop.set()
        for inst in self._instances:
            inst.stop()
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        if self._state is not None:
            self._state.close()
        if self.broker is not None:
            self.broker.stop(remove_data=False)
        log.info("event=localrun_stopped")
