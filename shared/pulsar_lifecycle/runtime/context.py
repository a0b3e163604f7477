"""A Context with the whole API of Pulsar's Python ContextImpl, for the local run mode."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import pulsar

from ..config.settings import user_config_from_json
from ..pulsar_io.producers import ProducerPool
from ..state.base import StateStore
from ..topics import strip_partition
from .classloader import import_class
from .metrics import FunctionMetrics

_U64 = (1 << 64) - 1


def effectively_once_sequence_id(ledger_id: int, entry_id: int) -> int:
    """The sequence id Pulsar's instance sends an EFFECTIVELY_ONCE output with:
    `(ledgerId << 28) | entryId` of the input, in Java's 64-bit arithmetic (FunctionCommon /
    MessageIdUtils.getOffset): for ledger ids >= 2**35 it wraps to a negative long, as in Java,
    instead of Python's unbounded int (which no client can send)."""
    value = ((int(ledger_id) << 28) | int(entry_id)) & _U64
    return value - (1 << 64) if value >> 63 else value


@dataclass
class FunctionIdentity:
    """Who this instance is: tenant/namespace/name, instance id, ids and version."""

    tenant: str
    namespace: str
    name: str
    instance_id: int
    function_id: str
    function_version: str
    num_instances: int = 1  # the function's parallelism

    @property
    def fqfn(self) -> str:
        """tenant/namespace/name."""
        return f"{self.tenant}/{self.namespace}/{self.name}"


@dataclass
class LocalContext:
    """Implements pulsar.functions.context.Context plus get_pulsar_client,
    get_message_sequence_id and get_message_partition_index, like the runtime's ContextImpl."""

    identity: FunctionIdentity
    client: pulsar.Client
    consumers: Dict[str, pulsar.Consumer]
    input_topics: List[str]
    output_topic: Optional[str]
    output_serde_class_name: str
    user_config: Dict[str, Any]
    secrets: Dict[str, Any]
    state: Optional[StateStore]
    metrics: FunctionMetrics
    logger: logging.Logger
    message: Optional[pulsar.Message] = None
    # Set by the local runner: its --data-dir, where functions keep local data by default.
    data_dir: Optional[Path] = None
    _publish_pool: ProducerPool = field(init=False, repr=False)
    _serdes: Dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # Pulsar's ContextImpl.publish producers: batching, blocking when the queue is full, named
        # after the function instance.
        self._publish_pool = ProducerPool(
            self.client, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=10,
            properties={"application": "pulsar-function", "id": self.identity.fqfn,
                        "instance_id": str(self.identity.instance_id)})

    # -- current message -------------------------------------------------------------------
    def set_current_message(self, message: Optional[pulsar.Message]) -> None:
        """Called by the instance before each process()."""
        self.message = message

    def get_message_id(self) -> Any:
        return self.message.message_id() if self.message else None

    def get_message_key(self) -> Optional[str]:
        return self.message.partition_key() if self.message else None

    def get_message_eventtime(self) -> Optional[int]:
        return self.message.event_timestamp() if self.message else None

    def get_message_properties(self) -> Dict[str, str]:
        return self.message.properties() if self.message else {}

    def get_current_message_topic_name(self) -> Optional[str]:
        return self.message.topic_name() if self.message else None

    def get_partition_key(self) -> Optional[str]:
        return self.message.partition_key() if self.message else None

    def get_ordering_key(self) -> Optional[bytes]:
        return self.message.ordering_key() if self.message else None

    def get_message_sequence_id(self) -> Optional[int]:
        """(ledgerId << 28) | entryId of the current message, as the runtime computes it."""
        if not self.message:
            return None
        mid = self.message.message_id()
        return (mid.ledger_id() << 28) | mid.entry_id()

    def get_message_partition_index(self) -> Optional[int]:
        return self.message.message_id().partition() if self.message else None

    # -- identity, config, secrets ------------------------------------------------------------
    def get_function_tenant(self) -> str:
        return self.identity.tenant

    def get_function_namespace(self) -> str:
        return self.identity.namespace

    def get_function_name(self) -> str:
        return self.identity.name

    def get_function_id(self) -> str:
        return self.identity.function_id

    def get_instance_id(self) -> int:
        return self.identity.instance_id

    def get_num_instances(self) -> int:
        """The function's parallelism (Java's Context.getNumInstances())."""
        return self.identity.num_instances

    def get_function_version(self) -> str:
        return self.identity.function_version

    def get_logger(self) -> logging.Logger:
        return self.logger

    def get_user_config_value(self, key: str) -> Any:
        return self.user_config.get(key)

    def get_user_config_map(self) -> Dict[str, Any]:
        return self.user_config

    def get_secret(self, secret_name: str) -> Any:
        # ClearTextSecretsProvider semantics: the configured value as given.
        return self.secrets.get(secret_name)

    def record_metric(self, metric_name: str, metric_value: float) -> None:
        self.metrics.record_user_metric(metric_name, float(metric_value))

    def get_input_topics(self) -> List[str]:
        return list(self.input_topics)

    def get_output_topic(self) -> Optional[str]:
        return self.output_topic

    def get_output_serde_class_name(self) -> str:
        return self.output_serde_class_name

    def get_pulsar_client(self) -> pulsar.Client:
        return self.client

    # -- publish / ack ------------------------------------------------------------------------
    def _serde(self, class_name: str) -> Any:
        if class_name not in self._serdes:
            self._serdes[class_name] = import_class(class_name)()
        return self._serdes[class_name]

    def publish(
        self,
        topic_name: str,
        message: Any,
        serde_class_name: str = "serde.IdentitySerDe",
        properties: Optional[Mapping[str, str]] = None,
        compression_type: Any = None,
        callback: Optional[Callable] = None,
        message_conf: Optional[Mapping[str, Any]] = None,
    ) -> None:
        """Publish like ContextImpl.publish: one batching producer per topic, async send."""
        producer = self._publish_pool.get(topic_name, compression_type=compression_type or pulsar.CompressionType.NONE)
        payload = self._serde(serde_class_name).serialize(message)
        conf = dict(message_conf or {})
        if properties:
            conf["properties"] = dict(properties)

        def done(result: pulsar.Result, msg_id: Any) -> None:
            if callback:
                callback(result, msg_id)

        producer.send_async(payload, done, **conf)

    def ack(self, msgid: Any, topic: str) -> None:
        """Acknowledge `msgid` on the consumer of `topic` (partition suffix stripped if needed)."""
        consumer = self.consumers.get(topic) or self.consumers.get(strip_partition(topic))
        if consumer is None:
            raise ValueError(f"Invalid topicname {topic}")
        consumer.acknowledge(msgid)

    def flush_publishers(self) -> None:
        """Flush every context.publish producer (on shutdown)."""
        for p in self._publish_pool.producers():
            try:
                p.flush()
            except Exception:  # a closed client cannot flush; nothing left to save
                pass

    def close_publishers(self) -> None:
        """Flush and close every context.publish producer (on shutdown, before the client closes)."""
        self._publish_pool.close()

    # -- state ----------------------------------------------------------------------------------
    def _state(self) -> StateStore:
        if self.state is None:
            raise RuntimeError("state is not available: no state store configured")
        return self.state

    def incr_counter(self, key: str, amount: int) -> None:
        self._state().incr(key, amount)

    def get_counter(self, key: str) -> Optional[int]:
        return self._state().get_counter(key)

    def del_counter(self, key: str) -> None:
        self._state().delete(key)

    def put_state(self, key: str, value: Any) -> None:
        if isinstance(value, bytes):
            data = value
        elif isinstance(value, str):
            data = value.encode("utf-8")
        else:
            # The stock runtime calls value.encode('utf-8'): anything but str fails there.
            raise TypeError(f"put_state value must be str (Pulsar's runtime encodes it as UTF-8), got {type(value).__name__}")
        self._state().put(key, data)

    def get_state(self, key: str) -> Optional[bytes]:
        return self._state().get(key)


def parse_user_config(raw: Any) -> Dict[str, Any]:
    """userConfig arrives as a dict (YAML) or a JSON string (--user-config)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        return user_config_from_json(raw)
    return dict(raw)
