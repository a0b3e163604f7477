"""One function instance, consuming and acknowledging exactly as Pulsar's python_instance.py.

- Each input consumer's message listener puts the message on a queue of one; a single
  execution thread calls process(), so one message is in flight per instance.
- ATMOST_ONCE acks on receipt; ATLEAST_ONCE (autoAck) acks after the output's publish
  succeeded, or at once when there is no output; MANUAL / autoAck=false never acks.
- process() raising -> negative_acknowledge; a failed publish -> negative_acknowledge.
"""
from __future__ import annotations

import base64
import logging
import queue
import threading
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any, Dict, Optional

import pulsar

from ..pulsar_io.subscribe import subscribe_promptly
from .classloader import import_class, instantiate_function
from .context import LocalContext, effectively_once_sequence_id
from .input_tails import InputTails, TrackedConsumer

log = logging.getLogger(__name__)

_POSITIONS = {"Earliest": pulsar.InitialPosition.Earliest, "Latest": pulsar.InitialPosition.Latest}
_COMPRESSION = {
    "NONE": pulsar.CompressionType.NONE, "LZ4": pulsar.CompressionType.LZ4, "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD, "SNAPPY": pulsar.CompressionType.SNAPPY,
}


def raised_where(exc: BaseException) -> str:
    """Where `exc` was raised, as `file:line in function` of the innermost frames outside the
    pulsar client's Python wrapper (a client error is raised there, but the call that made it is
    what an operator needs), the two nearest joined by '<-'."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/pulsar/" not in f.filename.replace("\\", "/")]
    return "<-".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in reversed(frames[-2:])) or "?"


@dataclass
class _Item:
    message: pulsar.Message
    topic: str
    consumer: Any  # the pulsar.Consumer, or its TrackedConsumer (input_tails.py)


class FunctionInstance:
    """Runs one instance of a function against a broker until stopped."""

    def __init__(self, spec: Any, context: LocalContext, client: pulsar.Client, nack_delay_ms: int = 60000,
                 tails: Optional[InputTails] = None) -> None:
        self.spec = spec
        self.context = context
        self.client = client
        self.guarantee = (spec.processing_guarantees or "ATLEAST_ONCE").upper()
        self.auto_ack = bool(spec.auto_ack) and self.guarantee != "MANUAL"
        self._queue: "queue.Queue[_Item]" = queue.Queue(1)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._consumers: Dict[str, pulsar.Consumer] = {}
        self._tails = tails  # the runner's input tail reads (None: off)
        self._tracked: Dict[str, TrackedConsumer] = {}
        self._producer: Optional[pulsar.Producer] = None
        self._function: Any = None
        self._input_serdes: Dict[str, Any] = {}
        self._output_serde: Any = None
        self.nack_delay_ms = nack_delay_ms
        self.processed = threading.Event()  # set once process() was called (the function runs)

    @property
    def function(self) -> Any:
        """The loaded user function (class instance or module); None before start()."""
        return self._function

    @property
    def running(self) -> bool:
        """True while the execution thread runs (started, not stopped, not died)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def output_producer(self) -> Optional[pulsar.Producer]:
        """The producer of `output` once the first output was sent (None before)."""
        return self._producer

    # -- set-up -------------------------------------------------------------------------------------
    def _consumer_type(self) -> pulsar.ConsumerType:
        if getattr(self.spec, "retain_key_ordering", False):
            return pulsar.ConsumerType.KeyShared
        if getattr(self.spec, "retain_ordering", False) or self.guarantee == "EFFECTIVELY_ONCE":
            return pulsar.ConsumerType.Failover
        return pulsar.ConsumerType.Shared

    def start(self) -> None:
        """Load the class, subscribe every input and start the execution thread."""
        self._function = instantiate_function(self.spec.class_name)
        self._output_serde = import_class(self.spec.output_serde_class_name or "serde.IdentitySerDe")()
        position = _POSITIONS.get(self.spec.subscription_position or "Latest", pulsar.InitialPosition.Latest)
        for topic in self.spec.inputs:
            ispec = (self.spec.input_specs or {}).get(topic, {}) or {}
            schema_type = (ispec.get("schemaType") or "").lower()
            if schema_type not in ("", "bytes", "string"):
                raise ValueError(
                    f"input {topic}: schemaType {schema_type!r} is not supported by the local run mode "
                    "(use bytes with a serde; the embedded broker cannot serve Avro schemas)"
                )
            self._input_serdes[topic] = (
                None if schema_type == "string"
                else import_class(ispec.get("serdeClassName") or "serde.IdentitySerDe")()
            )
            kwargs: Dict[str, Any] = {}
            if self.spec.timeout_ms:
                kwargs["unacked_messages_timeout_ms"] = int(self.spec.timeout_ms)
            if ispec.get("receiverQueueSize"):
                kwargs["receiver_queue_size"] = int(ispec["receiverQueueSize"])
            consumer = self._subscribe_with_retry(topic, position, kwargs)
            self._consumers[topic] = consumer
            if self._tails is not None:
                tail = self._tails.tail(topic, consumer)
                tracked = TrackedConsumer(consumer, tail)
                tail.add_consumer(tracked, self._feed)
                self._tracked[topic] = tracked
            self.context.consumers[topic] = self._tracked.get(topic, consumer)  # type: ignore[assignment]
        # The runtime's counters exist from the start, at 0, as Pulsar's instance creates them: a
        # running instance is never absent from a scrape (the deploy/ alerts' absent()).
        metrics, ident = self.context.metrics, self.context.identity
        for counter in (metrics.received, metrics.processed, metrics.user_exceptions, metrics.system_exceptions):
            counter.labels(ident.fqfn, str(ident.instance_id))
        self._thread = threading.Thread(target=self._run, name=f"fn-{self.context.identity.name}-{self.context.identity.instance_id}", daemon=True)
        self._thread.start()
        log.info("event=instance_started fqfn=%s instance=%d inputs=%s output=%s guarantee=%s",
                 self.context.identity.fqfn, self.context.identity.instance_id, self.spec.inputs,
                 self.spec.output, self.guarantee)

    def _subscribe_with_retry(self, topic: str, position: Any, kwargs: Dict[str, Any]) -> pulsar.Consumer:
        # After a SIGKILL the broker may still hold the dead process's consumer under the id this
        # subscribe gets (pulsar-lite): another attempt beside it gets a new id (subscribe.py).
        try:
            return subscribe_promptly(lambda: self.client.subscribe(
                topic,
                self.spec.sub_name,
                consumer_type=self._consumer_type(),
                initial_position=position,
                message_listener=self._make_listener(topic),
                negative_ack_redelivery_delay_ms=self.nack_delay_ms,
                properties={"application": "pulsar-function", "id": self.context.identity.fqfn,
                            "instance_id": str(self.context.identity.instance_id)},
                **kwargs,
            ), what=f"{topic} ({self.spec.sub_name})")
        except (pulsar.PulsarException, TimeoutError) as exc:
            raise RuntimeError(f"cannot subscribe {self.spec.sub_name!r} to {topic}: {exc}") from exc

    def _make_listener(self, topic: str):
        def listener(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
            tracked: Any = consumer
            if self._tails is not None:
                # start() registers the topic's tail right after the subscribe returns.
                deadline = time.monotonic() + 30
                while topic not in self._tracked and not self._stop.is_set() and time.monotonic() < deadline:
                    time.sleep(0.01)
                tracked = self._tracked.get(topic, consumer)
                if isinstance(tracked, TrackedConsumer):
                    seen = tracked.tail_received(message.message_id())
                    if seen != "new":  # the broker's copy of what a Reader read (input_tails.py)
                        if seen == "acked":
                            tracked.acknowledge(message)
                        return
            self._enqueue(message, topic, tracked)
        return listener

    def _feed(self, message: pulsar.Message, consumer: TrackedConsumer) -> None:
        """A message of a held tail, read with a Reader (input_tails.py): processed as received."""
        self._enqueue(message, consumer.tail_topic, consumer)

    def _enqueue(self, message: pulsar.Message, topic: str, consumer: Any) -> None:
        if self.guarantee == "ATMOST_ONCE" and self.auto_ack:
            consumer.acknowledge(message)
        item = _Item(message, topic, consumer)
        # Block like the runtime's queue.Queue(1).put(): back-pressure on the listener thread.
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _setup_producer(self) -> Optional[pulsar.Producer]:
        if not self.spec.output:
            return None
        if self._producer is None:
            pc = self.spec.producer_config or {}
            batching = (pc.get("batchingConfig") or {})
            # EFFECTIVELY_ONCE: named after the sink topic, as Pulsar's instance does, so broker
            # de-duplication keys its sequence ids to one producer across restarts.
            named = {"producer_name": self.spec.output} if self.guarantee == "EFFECTIVELY_ONCE" else {}
            self._producer = self.client.create_producer(
                self.spec.output,
                **named,
                block_if_queue_full=True,
                batching_enabled=bool(batching.get("enabled", True)),
                batching_max_publish_delay_ms=int(batching.get("batchingMaxPublishDelayMs", 10)),
                compression_type=_COMPRESSION.get(str(pc.get("compressionType", "LZ4")).upper(), pulsar.CompressionType.LZ4),
                send_timeout_millis=0,
                properties={"application": "pulsar-function", "id": self.context.identity.fqfn,
                            "instance_id": str(self.context.identity.instance_id)},
            )
        return self._producer

    # -- execution ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self._execute(item)

    def _deserialize(self, item: _Item) -> Any:
        serde = self._input_serdes.get(item.topic)
        if serde is None and item.topic not in self._input_serdes:
            serde = self._input_serdes.get(next(iter(self._input_serdes)))
        if serde is None:
            return item.message.data().decode("utf-8")
        return serde.deserialize(item.message.data())

    def _execute(self, item: _Item) -> None:
        self.processed.set()
        ident = self.context.identity
        self.context.metrics.received.labels(ident.fqfn, str(ident.instance_id)).inc()
        self.context.set_current_message(item.message)
        try:
            value = self._deserialize(item)
            if _is_module(self._function):
                output = self._function.process(value)  # pure-function mode: module-level process(input)
            else:
                output = self._function.process(value, self.context)
        except Exception as exc:
            log.warning("event=process_failed fqfn=%s topic=%s msg_id=%s error=%r where=%s",
                        ident.fqfn, item.topic, item.message.message_id(), exc, raised_where(exc))
            self.context.metrics.user_exceptions.labels(ident.fqfn, str(ident.instance_id)).inc()
            item.consumer.negative_acknowledge(item.message)
            return
        self._handle_output(item, output)

    def _handle_output(self, item: _Item, output: Any) -> None:
        ident = self.context.identity
        producer = self._setup_producer() if output is not None else None
        if producer is None:
            if self.guarantee == "EFFECTIVELY_ONCE":
                item.consumer.acknowledge_cumulative(item.message)  # as Pulsar's instance does
            elif self.auto_ack and self.guarantee == "ATLEAST_ONCE":
                item.consumer.acknowledge(item.message)
            self.context.metrics.processed.labels(ident.fqfn, str(ident.instance_id)).inc()
            return
        try:
            payload = self._output_serde.serialize(output)
        except Exception as exc:
            log.warning("event=serialize_failed fqfn=%s error=%r", ident.fqfn, exc)
            self.context.metrics.system_exceptions.labels(ident.fqfn, str(ident.instance_id)).inc()
            item.consumer.negative_acknowledge(item.message)
            return
        props: Dict[str, str] = {}
        if getattr(self.spec, "forward_source_message_property", True):
            props.update(item.message.properties())
        props["__pfn_input_topic__"] = item.topic
        props["__pfn_input_msg_id__"] = base64.urlsafe_b64encode(item.message.message_id().serialize()).decode()

        def done(result: pulsar.Result, _msg_id: Any) -> None:
            if result == pulsar.Result.Ok:
                # EFFECTIVELY_ONCE acks on publish success even with autoAck false (Pulsar's rule).
                if (self.auto_ack and self.guarantee == "ATLEAST_ONCE") or self.guarantee == "EFFECTIVELY_ONCE":
                    item.consumer.acknowledge(item.message)
                self.context.metrics.processed.labels(ident.fqfn, str(ident.instance_id)).inc()
            else:
                log.warning("event=publish_failed fqfn=%s topic=%s result=%s", ident.fqfn, self.spec.output, result)
                self.context.metrics.system_exceptions.labels(ident.fqfn, str(ident.instance_id)).inc()
                item.consumer.negative_acknowledge(item.message)

        conf: Dict[str, Any] = {}
        if self.guarantee == "EFFECTIVELY_ONCE":
            mid = item.message.message_id()
            if mid.partition() >= 0:
                self._eo_refused(item, "Partitioned topic is not available in effectively_once mode.")
                return
            conf["sequence_id"] = effectively_once_sequence_id(mid.ledger_id(), mid.entry_id())
        try:
            producer.send_async(payload, done, properties=props, **conf)
        except ValueError as exc:  # a negative (wrapped) sequence id: the client refuses it, as Java's does
            self._eo_refused(item, f"sequence id {conf.get('sequence_id')} of input {item.message.message_id()}: {exc}")

    def _eo_refused(self, item: _Item, reason: str) -> None:
        ident = self.context.identity
        log.error("event=effectively_once_send_refused fqfn=%s topic=%s reason=%s", ident.fqfn, item.topic, reason)
        self.context.metrics.system_exceptions.labels(ident.fqfn, str(ident.instance_id)).inc()
        item.consumer.negative_acknowledge(item.message)

    # -- shutdown --------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop taking messages, flush outputs and close consumers (unacked ones are redelivered)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        closer = getattr(self._function, "close", None)
        if callable(closer):
            try:
                closer()
            except Exception as exc:
                log.warning("event=function_close_failed fqfn=%s error=%r", self.context.identity.fqfn, exc)
        # Producers, then consumers, all before the runner closes the client (see LocalRunner.stop).
        if self._producer is not None:
            try:
                self._producer.flush()
                self._producer.close()
            except Exception:  # a closed client cannot flush; unacked inputs are redelivered
                pass
            self._producer = None
        self.context.close_publishers()
        for c in self._consumers.values():
            try:
                c.close()
            except Exception:
                pass
        log.info("event=instance_stopped fqfn=%s instance=%d", self.context.identity.fqfn, self.context.identity.instance_id)


def _is_module(obj: Any) -> bool:
    return isinstance(obj, types.ModuleType)
