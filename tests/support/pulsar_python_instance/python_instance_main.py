"""A reproduction of Apache Pulsar's Python function instance, for running shipped functions the
way a function worker runs them: the real Apache Pulsar 4.0.0 standalone's function worker starts
it as its `pythonInstanceLocation` (support/real_worker.py builds the instance directory).

Pulsar's own instance (`pulsar-functions/instance/src/main/python/`: python_instance_main.py,
python_instance.py, contextimpl.py, state_context.py, function_stats.py) is not on PyPI or in
the Maven artifacts this repository resolves, so this file does what it does, for what the
functions here use, written from reading it:

* the command line of `RuntimeUtils.getCmd` (`--function_details` JSON, `--py`, `--instance_id`,
  `--pulsar_serviceurl`, `--state_storage_serviceurl`, `--metrics_port`, `--cluster_name`, ...);
* `--py` a .whl: unzipped next to itself (dependencies are the worker's); a .zip: extracted next to itself, `<stem>/deps/*.whl` installed with `pip install -t
  <dir> --no-index --find-links <deps>`, `<stem>/src` and `<dir>` put first on sys.path; the
  worker's own pulsar-client, protobuf, grpc, bookkeeper client and prometheus_client are
  imported before any user code, so those are the worker's whatever deps/ holds;
* one Shared (Failover with retainOrdering) consumer per input spec with a message listener
  feeding a queue of one; one execution thread calling `process(input, context)`; an exception
  negatively acknowledges the message; acks as ATLEAST_ONCE / ATMOST_ONCE / MANUAL do; a
  non-None result published to the output topic;
* the Context (`ContextImpl`): message accessors, identity (instance id a str), userConfig
  (`json.loads`), `record_metric` into the Summary `pulsar_function_user_metric` with the labels
  tenant, namespace, name, instance_id, cluster, fqfn, metric; `publish`, `ack` (exact topic or
  its `-partition-N` base), state through the state context, `get_pulsar_client`, and the
  attributes `instance_config.function_details`, `consumers`, `state_context`;
* the state context: with `--state_storage_serviceurl` a BookKeeper one opened with the PyPI
  `bookkeeper` client exactly as Pulsar's `BKManagedStateContext` (namespace
  `<tenant>_<namespace>`, table `<name>`, created when missing; the kv client kept as
  `__client__`); without it a null one that drops everything. `del_counter` calls the state
  context's `delete`, which only the null one has, as in Pulsar;
* the runtime's counters (`pulsar_function_received_total`, ...) and the user-metric Summary on
  `--metrics_port` (prometheus_client's default registry, as the instance serves it);
* the gRPC control server on `--port` (`InstanceControl` of Pulsar's InstanceCommunication.proto:
  GetFunctionStatus, GetMetrics, GetAndResetMetrics, ResetMetrics, HealthCheck), which the
  worker's `functions status` and `functions stats` ask, and the self-kill of an instance that
  has not been health-checked for 3 x `--expected_healthcheck_interval` (the worker is gone).
  The message modules (`InstanceCommunication_pb2*.py`) are generated next to this file from the
  .proto in the release's pulsar-functions-proto jar (support/real_worker.py).

Secured clusters as Pulsar's instance runs on them: the client authenticates with
`--client_auth_plugin`/`--client_auth_params` (the submitter's token under the worker's
ClearTextFunctionTokenAuthProvider) and trusts `--tls_trust_cert_path`; `context.get_secret(k)`
asks the `--secrets_provider` the worker names (the process runtime's default configurator names
`secretsprovider.ClearTextSecretsProvider`: the secretsMap value is the secret;
`secretsprovider.EnvironmentBasedSecretsProvider` reads the environment variable named `k`).

Left out: log topics, schemas other than bytes plus a serde, crypto, EFFECTIVELY_ONCE, secrets
providers other than those two.

Runs as a script in the worker's Python: no import of this repository's code.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from concurrent import futures
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

# The worker's modules, imported before any user code (python_instance_main does the same);
# InstanceCommunication_pb2* are generated next to this file (module docstring).
import grpc
import InstanceCommunication_pb2 as ic_pb2
import InstanceCommunication_pb2_grpc as ic_grpc
import pulsar
from bookkeeper import admin, kv
from bookkeeper.common.exceptions import KeyNotFoundError, NamespaceNotFoundError, StreamNotFoundError
from bookkeeper.proto import stream_pb2
from bookkeeper.types import StorageClientSettings
from google.protobuf import empty_pb2
from prometheus_client import Counter, Gauge, Summary, start_http_server

Log = logging.getLogger("pulsar_python_instance")
LABEL_NAMES = ["tenant", "namespace", "name", "instance_id", "cluster", "fqfn"]
_running = True


def _on_signal(signo: int, _frame: Any) -> None:
    global _running
    Log.info("Interrupted by %d, shutting down", signo)
    _running = False


# -- details ---------------------------------------------------------------------------------

def _details(raw: str) -> SimpleNamespace:
    """FunctionDetails from its proto3 JSON, with the proto defaults the runtime relies on."""
    raw = raw.strip("'")
    d = json.loads(raw)
    source = d.get("source", {})
    sink = d.get("sink", {})
    specs = {topic: SimpleNamespace(serdeClassName=spec.get("serdeClassName", ""),
                                    schemaType=spec.get("schemaType", ""),
                                    isRegexPattern=bool(spec.get("isRegexPattern", False)),
                                    receiverQueueSize=(spec.get("receiverQueueSize") or {}).get("value"))
             for topic, spec in source.get("inputSpecs", {}).items()}
    return SimpleNamespace(
        tenant=d.get("tenant", ""), namespace=d.get("namespace", ""), name=d.get("name", ""),
        className=d.get("className", ""), userConfig=d.get("userConfig", ""), secretsMap=d.get("secretsMap", ""),
        parallelism=int(d.get("parallelism", 0)), autoAck=bool(d.get("autoAck", False)),
        processingGuarantees=d.get("processingGuarantees", "ATLEAST_ONCE"),
        retainOrdering=bool(d.get("retainOrdering", False)),
        source=SimpleNamespace(inputSpecs=specs, subscriptionName=source.get("subscriptionName", ""),
                               subscriptionType=source.get("subscriptionType", "SHARED"),
                               subscriptionPosition=source.get("subscriptionPosition", "LATEST"),
                               timeoutMs=int(source.get("timeoutMs", 0))),
        sink=SimpleNamespace(topic=sink.get("topic", ""), serdeClassName=sink.get("serdeClassName", "")),
    )


def _fqfn(details: SimpleNamespace) -> str:
    return f"{details.tenant}/{details.namespace}/{details.name}"


# -- user code --------------------------------------------------------------------------------

def _install_zip(py: str) -> None:
    """Extract, install deps/*.whl next to the zip, put <stem>/src on sys.path."""
    where = os.path.dirname(os.path.abspath(py))
    with zipfile.ZipFile(py) as zf:
        zf.extractall(where)
    stem = os.path.basename(os.path.splitext(py)[0])
    deps = os.path.join(where, stem, "deps")
    if os.path.isdir(deps) and os.listdir(deps):
        wheels = [os.path.join(deps, f) for f in os.listdir(deps) if f.endswith(".whl")]
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-t", where,
               "--no-index", "--find-links", deps, *wheels]
        if subprocess.call(cmd) != 0:
            print("Could not install user depedencies specified by the zip file")
            sys.exit(1)
    sys.path.insert(0, os.path.join(where, stem, "src"))


def _install_wheel(py: str, install_dependencies: bool) -> None:
    """Unzip the wheel next to itself (or pip-install it with its dependencies) and put that
    directory on sys.path; without installing, its dependencies must be the worker's."""
    where = os.path.dirname(os.path.abspath(py))
    if install_dependencies:
        if subprocess.call([sys.executable, "-m", "pip", "install", "-q", "-t", where, py]) != 0:
            print("Could not install user depedencies")
            sys.exit(1)
    else:
        with zipfile.ZipFile(py) as zf:
            zf.extractall(where)
    sys.path.insert(0, where)


def _import_class(from_dir: str, name: str) -> Any:
    """util.import_class: the code's directory first on sys.path; a dotless name is a module."""
    if from_dir not in sys.path:
        sys.path.insert(0, from_dir)
    if name.startswith("serde."):
        return getattr(pulsar, name.split(".", 1)[1])  # the runtime's own serde module
    module_name, _, attr = name.rpartition(".")
    if not module_name:
        return importlib.import_module(name)
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception:
        Log.info("Failed to import class %s", name, exc_info=True)
        return None


# -- state --------------------------------------------------------------------------------------

def _table_conf(num_ranges: int) -> Any:
    return stream_pb2.StreamConfiguration(
        key_type=stream_pb2.HASH, min_num_ranges=num_ranges, initial_num_ranges=num_ranges,
        split_policy=stream_pb2.SplitPolicy(type=stream_pb2.SplitPolicyType.values()[0],
                                            fixed_range_policy=stream_pb2.FixedRangeSplitPolicy(num_ranges=2)),
        rolling_policy=stream_pb2.SegmentRollingPolicy(
            size_policy=stream_pb2.SizeBasedSegmentRollingPolicy(max_segment_size=128 * 1024 * 1024)),
        retention_policy=stream_pb2.RetentionPolicy(
            time_policy=stream_pb2.TimeBasedRetentionPolicy(retention_minutes=-1)),
        storage_type=stream_pb2.TABLE)


class NullStateContext:
    """No state storage URL: every write dropped, every read None."""

    def incr(self, key: str, amount: int) -> None:
        return None

    def put(self, key: str, value: Any) -> None:
        return None

    def get_value(self, key: str) -> None:
        return None

    def get_amount(self, key: str) -> None:
        return None

    def delete(self, key: str) -> None:
        return None


class BKManagedStateContext:
    """The function's state table on the BookKeeper table service, through the PyPI client."""

    def __init__(self, url: str, table_ns: str, table_name: str) -> None:
        settings = StorageClientSettings(service_uri=url)
        admin_client = admin.client.Client(storage_client_settings=settings)
        ns = admin_client.namespace(table_ns)
        try:
            ns.get(stream_name=table_name)
        except NamespaceNotFoundError:
            admin_client.namespaces().create(namespace=table_ns)
            ns.create(stream_name=table_name, stream_config=_table_conf(1))
        except StreamNotFoundError:
            ns.create(stream_name=table_name, stream_config=_table_conf(1))
        self.__client__ = kv.Client(storage_client_settings=settings, namespace=table_ns)
        self.__table__ = self.__client__.table(table_name=table_name)

    def incr(self, key: str, amount: int) -> Any:
        return self.__table__.incr_str(key, amount)

    def get_amount(self, key: str) -> Optional[int]:
        try:
            found = self.__table__.get_str(key)
        except KeyNotFoundError:
            return None
        return None if found is None else found.number_value

    def get_value(self, key: str) -> Optional[bytes]:
        try:
            found = self.__table__.get_str(key)
        except KeyNotFoundError:
            return None
        return None if found is None else found.value

    def put(self, key: str, value: str) -> Any:
        return self.__table__.put_str(key, value)

    def delete_key(self, key: str) -> Any:
        return self.__table__.delete_str(key)


# -- context ----------------------------------------------------------------------------------

class ContextImpl(pulsar.Context):
    """The Context handed to process()."""

    user_metrics_label_names = LABEL_NAMES + ["metric"]

    def __init__(self, instance_config: SimpleNamespace, logger: logging.Logger, client: pulsar.Client,
                 user_code: str, consumers: Dict[str, Any], metrics_labels: List[str], state_context: Any) -> None:
        self.instance_config = instance_config
        self.log = logger
        self.pulsar_client = client
        self.user_code_dir = os.path.dirname(user_code)
        self.consumers = consumers
        self.state_context = state_context
        self.publish_producers: Dict[str, Any] = {}
        self.publish_serializers: Dict[str, Any] = {}
        self.message: Any = None
        details = instance_config.function_details
        self.user_config = json.loads(details.userConfig) if details.userConfig else []
        self.secrets_map = json.loads(details.secretsMap) if details.secretsMap else {}
        self.metrics_labels = metrics_labels
        self.user_metrics_map: Dict[str, Any] = {}
        self.user_metrics_summary = Summary("pulsar_function_user_metric", "Pulsar Function user defined metric",
                                            ContextImpl.user_metrics_label_names)

    def set_current_message_context(self, message: Any, topic: str) -> None:
        self.message = message

    def get_message_id(self) -> Any:
        return self.message.message_id()

    def get_message_key(self) -> Any:
        return self.message.partition_key()

    def get_message_eventtime(self) -> Any:
        return self.message.event_timestamp()

    def get_message_properties(self) -> Any:
        return self.message.properties()

    def get_current_message_topic_name(self) -> Any:
        return self.message.topic_name()

    def get_message_sequence_id(self) -> Optional[int]:
        if not self.get_message_id():
            return None
        mid = self.get_message_id()
        return (mid.ledger_id() << 28) | mid.entry_id()

    def get_message_partition_index(self) -> Optional[int]:
        return self.get_message_id().partition() if self.get_message_id() else None

    def get_partition_key(self) -> Any:
        return self.message.partition_key()

    def get_function_name(self) -> str:
        return self.instance_config.function_details.name

    def get_function_tenant(self) -> str:
        return self.instance_config.function_details.tenant

    def get_function_namespace(self) -> str:
        return self.instance_config.function_details.namespace

    def get_function_id(self) -> str:
        return self.instance_config.function_id

    def get_instance_id(self) -> str:
        return self.instance_config.instance_id

    def get_function_version(self) -> str:
        return self.instance_config.function_version

    def get_logger(self) -> logging.Logger:
        return self.log

    def get_user_config_value(self, key: str) -> Any:
        return self.user_config[key] if key in self.user_config else None

    def get_user_config_map(self) -> Any:
        return self.user_config

    def get_secret(self, secret_key: str) -> Any:
        if secret_key not in self.secrets_map:
            return None
        return provide_secret(self.instance_config.secrets_provider, secret_key, self.secrets_map[secret_key])

    def record_metric(self, metric_name: str, metric_value: float) -> None:
        if metric_name not in self.user_metrics_map:
            self.user_metrics_map[metric_name] = self.user_metrics_summary.labels(*(self.metrics_labels + [metric_name]))
        self.user_metrics_map[metric_name].observe(metric_value)

    def get_input_topics(self) -> List[str]:
        return list(self.instance_config.function_details.source.inputSpecs.keys())

    def get_output_topic(self) -> str:
        return self.instance_config.function_details.sink.topic

    def get_output_serde_class_name(self) -> str:
        return self.instance_config.function_details.sink.serdeClassName

    def publish(self, topic_name: str, message: Any, serde_class_name: str = "serde.IdentitySerDe",
                properties: Any = None, compression_type: Any = None, callback: Any = None,
                message_conf: Any = None) -> None:
        if topic_name not in self.publish_producers:
            self.publish_producers[topic_name] = self.pulsar_client.create_producer(
                topic_name, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=10,
                properties={"application": "pulsar-function", "id": _fqfn(self.instance_config.function_details),
                            "instance_id": str(self.instance_config.instance_id)})
        if serde_class_name not in self.publish_serializers:
            self.publish_serializers[serde_class_name] = _import_class(self.user_code_dir, serde_class_name)()
        data = bytes(self.publish_serializers[serde_class_name].serialize(message))
        conf = dict(message_conf or {})
        if properties:
            conf["properties"] = properties
        self.publish_producers[topic_name].send_async(data, callback or (lambda res, msg_id: None), **conf)

    def ack(self, msgid: Any, topic: str) -> None:
        if topic in self.consumers:
            consumer = self.consumers[topic]
        else:
            m = re.search(r"(.+)-partition-(\d+)", topic)
            if not m or m.group(1) not in self.consumers:
                raise ValueError(f"Invalid topicname {topic}")
            consumer = self.consumers[m.group(1)]
        consumer.acknowledge(msgid)

    def incr_counter(self, key: str, amount: int) -> Any:
        return self.state_context.incr(key, amount)

    def get_counter(self, key: str) -> Any:
        return self.state_context.get_amount(key)

    def del_counter(self, key: str) -> Any:
        return self.state_context.delete(key)

    def put_state(self, key: str, value: Any) -> Any:
        return self.state_context.put(key, value)

    def get_state(self, key: str) -> Any:
        return self.state_context.get_value(key)

    def get_pulsar_client(self) -> pulsar.Client:
        return self.pulsar_client


# -- instance -----------------------------------------------------------------------------------

class PythonInstance:
    """Consumers, the queue of one, the execution thread, acks and the output."""

    def __init__(self, args: argparse.Namespace, details: SimpleNamespace, client: pulsar.Client) -> None:
        self.args = args
        self.details = details
        self.client = client
        self.instance_config = SimpleNamespace(instance_id=str(args.instance_id), function_id=args.function_id,
                                               function_version=args.function_version, function_details=details,
                                               secrets_provider=args.secrets_provider or "")
        self.queue: "queue.Queue[Any]" = queue.Queue(1)
        self.consumers: Dict[str, Any] = {}
        self.producer: Any = None
        guarantees = details.processingGuarantees
        self.atmost_once = guarantees == "ATMOST_ONCE"
        self.atleast_once = guarantees == "ATLEAST_ONCE"
        self.manual = guarantees == "MANUAL"
        self.auto_ack = details.autoAck
        self.metrics_labels = [details.tenant, details.namespace, details.name, str(args.instance_id),
                               args.cluster_name, _fqfn(details)]
        self.received = Counter("pulsar_function_received_total", "Total number of messages received",
                                LABEL_NAMES).labels(*self.metrics_labels)
        self.processed = Counter("pulsar_function_processed_successfully_total", "Processed successfully",
                                 LABEL_NAMES).labels(*self.metrics_labels)
        self.user_exceptions = Counter("pulsar_function_user_exceptions_total", "User exceptions",
                                       LABEL_NAMES).labels(*self.metrics_labels)
        self.system_exceptions = Counter("pulsar_function_system_exceptions_total", "System exceptions",
                                         LABEL_NAMES).labels(*self.metrics_labels)
        self.last_invocation = Gauge("pulsar_function_last_invocation", "Last invocation",
                                     LABEL_NAMES).labels(*self.metrics_labels)
        self.latency = Summary("pulsar_function_process_latency_ms", "Process latency in milliseconds",
                               LABEL_NAMES).labels(*self.metrics_labels)
        # What the control server reports (function_stats.Stats): totals since start or the last reset.
        self.stats_lock = threading.Lock()
        self.totals = collections.Counter()  # type: collections.Counter[str]
        self.latest_user_exceptions: "collections.deque[Any]" = collections.deque(maxlen=10)
        self.last_invocation_ms = 0

    def run(self) -> None:
        d = self.details
        user_code_dir = os.path.dirname(self.args.py)
        kclass = _import_class(user_code_dir, d.className)
        if kclass is None:
            raise NameError(f"Could not import User Function Module {d.className}")
        try:
            self.function = kclass()
            self.pure = False
        except Exception:
            self.function = kclass
            self.pure = True
        if self.args.state_storage_serviceurl:
            table_ns = f"{d.tenant}_{d.namespace}".replace("-", "_")
            state: Any = BKManagedStateContext(self.args.state_storage_serviceurl, table_ns, d.name)
        else:
            state = NullStateContext()
        subscription = d.source.subscriptionName or _fqfn(d)
        consumer_type = pulsar.ConsumerType.Failover if (
            d.source.subscriptionType == "FAILOVER" or d.retainOrdering) else pulsar.ConsumerType.Shared
        position = pulsar.InitialPosition.Earliest if d.source.subscriptionPosition == "EARLIEST" \
            else pulsar.InitialPosition.Latest
        properties = {"application": "pulsar-function", "id": _fqfn(d), "instance_id": str(self.args.instance_id)}
        for topic, spec in d.source.inputSpecs.items():
            serde = _import_class(user_code_dir, spec.serdeClassName or "serde.IdentitySerDe")()
            kwargs: Dict[str, Any] = {"consumer_type": consumer_type, "initial_position": position,
                                      "properties": properties,
                                      "message_listener": self._listener(serde, topic)}
            if spec.receiverQueueSize is not None:
                kwargs["receiver_queue_size"] = int(spec.receiverQueueSize)
            if d.source.timeoutMs > 0:
                kwargs["unacked_messages_timeout_ms"] = d.source.timeoutMs
            target = re.compile(topic) if spec.isRegexPattern else topic
            self.consumers[topic] = self.client.subscribe(target, subscription, **kwargs)
        self.context = ContextImpl(self.instance_config, Log, self.client, self.args.py, self.consumers,
                                   self.metrics_labels, state)
        self.thread = threading.Thread(target=self._execute, name="function-execution", daemon=True)
        self.thread.start()

    def _listener(self, serde: Any, topic: str) -> Any:
        def on_message(consumer: Any, message: Any) -> None:
            if self.atmost_once and self.auto_ack:
                consumer.acknowledge(message)
            self.queue.put((message, topic, serde, consumer), True)
        return on_message

    def _execute(self) -> None:
        while True:
            item = self.queue.get(True)
            if item is None:
                return
            message, topic, serde, consumer = item
            self.received.inc()
            self.last_invocation.set(time.time())
            started = time.time()
            with self.stats_lock:
                self.totals["received"] += 1
                self.last_invocation_ms = int(started * 1000)
            try:
                value = serde.deserialize(message.data())
                self.context.set_current_message_context(message, topic)
                if self.pure:
                    output = self.function.process(value)
                else:
                    output = self.function.process(value, self.context)
            except Exception as exc:
                Log.exception("Exception while executing user method")
                self.user_exceptions.inc()
                with self.stats_lock:
                    self.totals["user_exceptions"] += 1
                    self.latest_user_exceptions.append((repr(exc), int(time.time() * 1000)))
                consumer.negative_acknowledge(message)
                continue
            elapsed_ms = (time.time() - started) * 1000
            self.latency.observe(elapsed_ms)
            with self.stats_lock:
                self.totals["processed"] += 1
                self.totals["latency_ms"] += int(elapsed_ms)
            self._result(output, message, consumer)
            self.processed.inc()

    def _result(self, output: Any, message: Any, consumer: Any) -> None:
        sink = self.details.sink
        if output is not None and sink.topic:
            if self.producer is None:
                self.producer = self.client.create_producer(
                    sink.topic, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=10,
                    send_timeout_millis=0)
                self.output_serde = _import_class(os.path.dirname(self.args.py),
                                                  sink.serdeClassName or "serde.IdentitySerDe")()

            def done(result: Any, _msg_id: Any) -> None:
                if result != pulsar.Result.Ok:
                    self.system_exceptions.inc()
                    with self.stats_lock:
                        self.totals["system_exceptions"] += 1
                    consumer.negative_acknowledge(message)
                elif self.atleast_once and self.auto_ack:
                    consumer.acknowledge(message)
            self.producer.send_async(bytes(self.output_serde.serialize(output)), done)
        elif self.atleast_once and self.auto_ack:
            consumer.acknowledge(message)

    def join(self) -> None:
        self.queue.put(None, True)
        self.thread.join(timeout=10)
        for consumer in self.consumers.values():
            try:
                consumer.close()
            except Exception:  # closed by the function already (the writer closes its start input)
                Log.debug("consumer close failed", exc_info=True)
        self.client.close()


class InstanceControl(ic_grpc.InstanceControlServicer):
    """The gRPC control server the worker asks for status, metrics and health (server.py)."""

    def __init__(self, instance: PythonInstance) -> None:
        self.instance = instance
        self.last_health_check = time.time()

    def GetFunctionStatus(self, request: Any, context: Any) -> Any:
        i = self.instance
        with i.stats_lock:
            t = dict(i.totals)
            latest = list(i.latest_user_exceptions)
            last = i.last_invocation_ms
        done = t.get("processed", 0)
        return ic_pb2.FunctionStatus(
            running=True, numReceived=t.get("received", 0), numSuccessfullyProcessed=done,
            numUserExceptions=t.get("user_exceptions", 0), numSystemExceptions=t.get("system_exceptions", 0),
            latestUserExceptions=[ic_pb2.FunctionStatus.ExceptionInformation(exceptionString=e, msSinceEpoch=at)
                                  for e, at in latest],
            averageLatency=(t.get("latency_ms", 0) / done) if done else 0.0,
            lastInvocationTime=last, instanceId=str(i.args.instance_id))

    def _metrics(self, reset: bool) -> Any:
        i = self.instance
        with i.stats_lock:
            t = dict(i.totals)
            last = i.last_invocation_ms
            if reset:
                i.totals.clear()
        done = t.get("processed", 0)
        user: Dict[str, float] = {}
        context = getattr(i, "context", None)
        for name, child in (context.user_metrics_map.items() if context is not None else []):
            user[f"user_metric_{name}_sum"] = child._sum.get()
            user[f"user_metric_{name}_count"] = child._count.get()
        return ic_pb2.MetricsData(
            receivedTotal=t.get("received", 0), processedSuccessfullyTotal=done,
            systemExceptionsTotal=t.get("system_exceptions", 0), userExceptionsTotal=t.get("user_exceptions", 0),
            avgProcessLatency=(t.get("latency_ms", 0) / done) if done else 0.0, lastInvocation=last,
            userMetrics=user)

    def GetMetrics(self, request: Any, context: Any) -> Any:
        return self._metrics(reset=False)

    def GetAndResetMetrics(self, request: Any, context: Any) -> Any:
        return self._metrics(reset=True)

    def ResetMetrics(self, request: Any, context: Any) -> Any:
        self._metrics(reset=True)
        return empty_pb2.Empty()

    def HealthCheck(self, request: Any, context: Any) -> Any:
        self.last_health_check = time.time()
        return ic_pb2.HealthCheckResult(success=True)


def _serve_control(instance: PythonInstance, port: int, interval_s: int) -> InstanceControl:
    """Start the control server; with a health-check interval, a thread that kills this process
    when the worker has not checked for 3 intervals (python_instance_main's check)."""
    control = InstanceControl(instance)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ic_grpc.add_InstanceControlServicer_to_server(control, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    instance.control_server = server

    def check_health() -> None:
        while True:
            time.sleep(interval_s)
            if time.time() - control.last_health_check > interval_s * 3:
                Log.critical("Haven't received health check from spawner in a while. Stopping instance...")
                os.kill(os.getpid(), signal.SIGKILL)

    if interval_s > 0:
        threading.Thread(target=check_health, name="health-check", daemon=True).start()
    return control


def _client_security(args: argparse.Namespace) -> Dict[str, Any]:
    """The client's authentication and TLS keywords, from the flags the worker passes (as
    Pulsar's python_instance_main builds its client)."""
    kw: Dict[str, Any] = {}
    if args.client_auth_plugin and args.client_auth_params:
        kw["authentication"] = pulsar.Authentication(args.client_auth_plugin, args.client_auth_params)
    if args.use_tls == "true":
        kw["use_tls"] = True
    if args.tls_allow_insecure_connection == "true":
        kw["tls_allow_insecure_connection"] = True
    if args.tls_trust_cert_path:
        kw["tls_trust_certs_file_path"] = args.tls_trust_cert_path
    if args.hostname_verification_enabled == "true":
        kw["tls_validate_hostname"] = True
    return kw


CLEAR_TEXT_PROVIDER = "secretsprovider.ClearTextSecretsProvider"
ENVIRONMENT_PROVIDER = "secretsprovider.EnvironmentBasedSecretsProvider"


def provide_secret(provider: str, secret_name: str, path_to_secret: Any) -> Any:
    """What Pulsar's Python secrets providers answer: ClearText the secretsMap value itself,
    EnvironmentBased the environment variable named after the secret."""
    if provider == ENVIRONMENT_PROVIDER:
        return os.environ.get(secret_name)
    if provider in ("", CLEAR_TEXT_PROVIDER):
        return path_to_secret
    raise ValueError(f"secrets provider {provider!r} is not reproduced here")


def main() -> None:
    for signo in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signo, _on_signal)
    parser = argparse.ArgumentParser(description="Pulsar Functions Python Instance (reproduction)")
    for name in ("function_details", "py", "instance_id", "function_id", "function_version", "pulsar_serviceurl",
                 "logging_directory", "logging_file", "logging_config_file", "cluster_name", "max_buffered_tuples"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("client_auth_plugin", "client_auth_params", "use_tls", "tls_allow_insecure_connection",
                 "hostname_verification_enabled", "tls_trust_cert_path", "secrets_provider",
                 "secrets_provider_config", "install_usercode_dependencies", "dependency_repository",
                 "extra_dependency_repository", "state_storage_serviceurl", "config_file"):
        parser.add_argument(f"--{name}", required=False)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--metrics_port", required=True, type=int)
    parser.add_argument("--expected_healthcheck_interval", required=True, type=int)
    args, unknown = parser.parse_known_args()
    details = _details(args.function_details)
    if os.path.splitext(args.py)[1] == ".zip":
        _install_zip(args.py)
    elif os.path.splitext(args.py)[1] == ".whl":
        _install_wheel(args.py, bool(args.install_usercode_dependencies))
    log_file = os.path.join(args.logging_directory, _fqfn(details), f"{args.logging_file}-{args.instance_id}.log")
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    logging.basicConfig(filename=log_file, level=logging.INFO,
                        format="[%(asctime)s] [%(levelname)s] %(filename)s: %(message)s")
    Log.info("Starting Python instance with %s", args)
    if unknown:
        Log.warning("arguments this reproduction does not use: %s", unknown)
    client = pulsar.Client(args.pulsar_serviceurl, operation_timeout_seconds=30, io_threads=1,
                           message_listener_threads=1, concurrent_lookup_requests=50000, **_client_security(args))
    instance = PythonInstance(args, details, client)
    instance.run()
    _serve_control(instance, args.port, args.expected_healthcheck_interval)
    start_http_server(args.metrics_port, addr="127.0.0.1")
    Log.info("event=instance_running metrics_port=%d", args.metrics_port)
    while _running:
        time.sleep(0.2)
    instance.join()
    os._exit(0)  # the function's own threads are not the runtime's to wait for


if __name__ == "__main__":
    main()
