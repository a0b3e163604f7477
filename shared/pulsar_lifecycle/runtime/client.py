"""Building a pulsar.Client the way the Pulsar Python runtime does, with quiet logs."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import pulsar

from ..exceptions import PulsarLifecycleError
from ..logging_setup import CLIENT_LOG_ENV, client_log_path, route_client_log

__all__ = [
    "CLIENT_LOG_ENV", "ClientSettings", "PermissionRefused", "client_log_path", "make_client", "quiet_client",
    "receive_messages", "route_client_log",
]


@dataclass(frozen=True)
class ClientSettings:
    """Connection flags of `pulsar-admin functions localrun` that reach the client."""

    service_url: str
    auth_plugin: Optional[str] = None
    auth_params: Optional[str] = None
    use_tls: bool = False
    tls_allow_insecure: bool = False
    hostname_verification_enabled: bool = False
    tls_trust_cert_path: Optional[str] = None


def _pulsar_logger() -> object:
    """The C++ client's own file logger at WARN, writing to `client_log_path()`
    ($PULSAR_LIFECYCLE_CLIENT_LOG, else the file `route_client_log` chose, else stderr).

    Not a Python logging.Logger: pulsar-client keeps the logger of every client in a
    process-wide C++ factory, and its I/O threads log through it while the interpreter shuts
    down; with a Python logger that needs the GIL, and the process aborts ("terminate called
    without an active exception", about 1 run in 15 here even with everything closed in
    order). The C++ logger needs nothing from Python. (The default logger would print INFO
    lines to stdout, where commands print their results.)
    """
    return pulsar.FileLogger(pulsar.LoggerLevel.Warn, client_log_path())


class PermissionRefused(PulsarLifecycleError, pulsar.AuthorizationError):
    """The broker refused the client's role an action on a topic (its AuthorizationError, with
    the role, the action and the topic named). Still a pulsar.AuthorizationError for code that
    handles the client's own errors."""


class _NamingClient(pulsar.Client):
    """A pulsar.Client whose AuthorizationError names the role, the action and the topic."""

    def __init__(self, service_url: str, role: str, **kwargs: Any) -> None:
        super().__init__(service_url, **kwargs)
        self._role_text = role
        self._service_url_text = service_url

    def _refused(self, exc: Exception, action: str, topic: Any) -> PermissionRefused:
        return PermissionRefused(f"the broker at {self._service_url_text} refused {self._role_text} permission to "
                                 f"{action} {topic} ({exc}): grant it with pulsar-admin topics grant-permission "
                                 "(or namespaces grant-permission), or use a role that has it")

    def create_producer(self, topic: str, *args: Any, **kwargs: Any) -> pulsar.Producer:
        try:
            return super().create_producer(topic, *args, **kwargs)
        except pulsar.AuthorizationError as exc:
            raise self._refused(exc, "produce to", topic) from exc

    def subscribe(self, topic: Any, *args: Any, **kwargs: Any) -> pulsar.Consumer:
        try:
            return super().subscribe(topic, *args, **kwargs)
        except pulsar.AuthorizationError as exc:
            raise self._refused(exc, "consume from", topic) from exc

    def create_reader(self, topic: str, *args: Any, **kwargs: Any) -> pulsar.Reader:
        try:
            return super().create_reader(topic, *args, **kwargs)
        except pulsar.AuthorizationError as exc:
            raise self._refused(exc, "read", topic) from exc

    def get_topic_partitions(self, topic: str) -> List[str]:
        try:
            return super().get_topic_partitions(topic)
        except pulsar.AuthorizationError as exc:
            raise self._refused(exc, "look up", topic) from exc


def make_client(settings: ClientSettings, operation_timeout_s: int = 30, role: Optional[str] = None) -> pulsar.Client:
    """A client with the runtime's settings (1 io thread, 1 listener thread, 30 s operations).

    `role` given (a command's client, runtime/connect.py): a broker's AuthorizationError comes
    out as PermissionRefused naming `role`, the action and the topic."""
    auth = None
    if settings.auth_plugin:
        auth = pulsar.Authentication(settings.auth_plugin, settings.auth_params or "")
    kwargs: Any = {}
    cls: Any = pulsar.Client
    if role is not None:
        cls, kwargs = _NamingClient, {"role": role}
    return cls(
        settings.service_url,
        authentication=auth,
        operation_timeout_seconds=operation_timeout_s,
        io_threads=1,
        message_listener_threads=1,
        concurrent_lookup_requests=50000,
        use_tls=settings.use_tls or settings.service_url.startswith("pulsar+ssl://"),
        tls_trust_certs_file_path=settings.tls_trust_cert_path,
        tls_allow_insecure_connection=settings.tls_allow_insecure,
        tls_validate_hostname=settings.hostname_verification_enabled,
        logger=_pulsar_logger(),
        **kwargs,
    )


def quiet_client(service_url: str, operation_timeout_s: int = 30) -> pulsar.Client:
    """A plain client for tools and tests, logging at WARNING (to `client_log_path()`)."""
    return pulsar.Client(service_url, operation_timeout_seconds=operation_timeout_s, logger=_pulsar_logger())


def receive_messages(client: pulsar.Client, topic: str, subscription: str, expect: int, timeout: float,
                     stop: Optional[Callable[[List[pulsar.Message]], bool]] = None) -> List[pulsar.Message]:
    """Up to `expect` messages from `topic` (Shared, Earliest, acked) within `timeout` seconds."""
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    got: List[pulsar.Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expect and time.monotonic() < deadline:
            if stop and stop(got):
                break
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            got.append(msg)
            consumer.acknowledge(msg)
    finally:
        consumer.close()
    return got
