"""Phase two adapter: turns an engine Decision into Pulsar I/O (retry topic, DLQ, ack) and metrics.

Retry and DLQ are our code (the Python runtime rejects maxMessageRetries/deadLetterTopic). The
properties follow the Java client's retry-letter conventions: RECONSUMETIMES, REAL_TOPIC,
ORIGIN_MESSAGE_ID, DELAY_TIME; we add REASON (and OUTCOME on the DLQ).

process() decodes the request, hands it to an InFlightLimiter keyed by the ledger and returns:
up to `maxDeletionsInFlight` deletions run at once, never two of one ledger. Each is acked only
after its outcome is durable (deleted or found gone, or the retry or dead letter stored). When a
retry or DLQ send fails the message is nacked and comes back: nothing is acked without being
dealt with.
"""
from __future__ import annotations

import functools
import importlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import pulsar

from ..pulsar_io.producers import ProducerPool
from ..runtime.context_api import pulsar_client
from ..timing import DelayedProducer, now_ms
from . import acks
from .acks import InputMessage
from .admin import PulsarAdminClient
from .codec import decode
from .config import DeletionConfig
from .engine import Action, Decision, DeletionEngine
from .exceptions import InvalidRequestError
from .inflight import InFlightLimiter
from .metrics import DeletionMetrics
from .model import LedgerComponent, PendingDeleteLedgerInfo
from .oracle import ComponentOracle, InternalStatsOracle, SnapshotManifestOracle
from .routing import StorageRouter
from .storage.bookie_http import BookieHttpClient, BookieLedgerStorage
from .storage.filesystem import FileSystemOffloadStorage
from .storage.s3 import S3OffloadStorage, make_s3_client
from .storage.snapshot import SnapshotStoreStorage
from .trusted import TrustedLedgerRegistry

log = logging.getLogger(__name__)

PROP_RECONSUME_TIMES = "RECONSUMETIMES"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_DELAY_TIME = "DELAY_TIME"
PROP_REASON = "REASON"
PROP_OUTCOME = "OUTCOME"


def raw_payload(input: Any, context: Any) -> bytes:
    """The message bytes. The runtime's IdentitySerDe may have turned them into str (or a number);
    prefer the raw message the runtime keeps on the context, else undo the serde."""
    msg = getattr(context, "message", None)
    data = getattr(msg, "data", None)
    if callable(data):
        try:
            raw = data()
            if isinstance(raw, (bytes, bytearray)):
                return bytes(raw)
        except Exception:  # an internal wrapper without data(): fall back to the input
            pass
    if isinstance(input, (bytes, bytearray)):
        return bytes(input)
    if isinstance(input, str):
        return input.encode("utf-8")  # IdentitySerDe decoded valid UTF-8; this is lossless
    return str(input).encode("utf-8")  # a number: certainly not an Avro record; the engine says so


def _attempts(props: Mapping[str, str]) -> int:
    try:
        return max(0, int(props.get(PROP_RECONSUME_TIMES, "0")))
    except ValueError:
        return 0


@dataclass
class DeletionWorkerRunner:
    """Runs the engine for each message, up to `maxDeletionsInFlight` at once, and publishes
    retries and dead letters before it acks."""

    engine: DeletionEngine
    config: DeletionConfig
    client: pulsar.Client
    delayed: DelayedProducer
    metrics: DeletionMetrics = field(default_factory=DeletionMetrics)
    _dlq_producers: ProducerPool = field(init=False, repr=False)
    _inflight: InFlightLimiter = field(init=False, repr=False)
    # Pulsar's ContextImpl.record_metric creates a metric on first use without a lock.
    _metrics_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._dlq_producers = ProducerPool(self.client, batching_enabled=False, block_if_queue_full=True)
        self._inflight = InFlightLimiter(self.config.max_deletions_in_flight, name="ledger-deletion")

    @property
    def in_flight(self) -> int:
        """Messages taken by process() and not yet settled."""
        return self._inflight.in_flight

    def handle(
        self,
        payload: bytes,
        properties: Mapping[str, str],
        source_topic: Optional[str],
        message_id: str,
        context: Any = None,
        request: Optional[PendingDeleteLedgerInfo] = None,
    ) -> Decision:
        """Decide, then send the retry or dead letter; raises if that send fails.

        `request` is the payload already decoded (None: the engine decodes it).
        """
        props = dict(properties or {})
        decision = self.engine.handle(payload, _attempts(props), source_topic, request)
        base = {
            PROP_REAL_TOPIC: props.get(PROP_REAL_TOPIC) or (source_topic or ""),
            PROP_ORIGIN_MESSAGE_ID: props.get(PROP_ORIGIN_MESSAGE_ID) or message_id,
        }
        if decision.action is Action.RETRY:
            delay_ms = self.config.reconsume_later_seconds * 1000
            out = {
                **base,
                PROP_RECONSUME_TIMES: str(decision.next_attempts),
                PROP_DELAY_TIME: str(delay_ms),
                PROP_REASON: decision.reason[:1000],
            }
            target = self._retry_target(decision, source_topic)
            self.delayed.send(target, payload, now_ms() + delay_ms, properties=out)
            log.info("retry sent ledger=%s target=%s attempt=%d", decision.request.ledger_id if decision.request else "?", target, decision.next_attempts)
        elif decision.action is Action.DEAD_LETTER:
            out = {
                **base,
                PROP_RECONSUME_TIMES: str(decision.attempts),
                PROP_REASON: decision.reason[:4000],
                PROP_OUTCOME: decision.outcome.value,
            }
            target = self._dlq_target(decision, source_topic)
            self._dlq_producer(target).send(payload, properties=out)
        with self._metrics_lock:
            self.metrics.observe(decision, context)
        return decision

    def _tenant(self, decision: Decision, source_topic: Optional[str]) -> Optional[str]:
        topics = self.config.topics
        if topics.scope != "tenant":
            return None
        if source_topic:
            try:
                return topics.classify(source_topic).tenant
            except ValueError:
                pass
        if decision.request is not None:
            return decision.request.topic.tenant
        raise ValueError("tenant scope: cannot tell which tenant's DLQ this message belongs to")

    def _retry_target(self, decision: Decision, source_topic: Optional[str]) -> str:
        topics = self.config.topics
        tenant = self._tenant(decision, source_topic)
        index = -1
        if source_topic:
            try:
                index = topics.classify(source_topic).partition
            except ValueError:
                index = -1
        if index < 0:
            assert decision.request is not None  # retries always carry a decoded request
            index = topics.partition_for(decision.request.topic, decision.request.ledger_id)
        return topics.retry_partition(index, tenant)

    def _dlq_target(self, decision: Decision, source_topic: Optional[str]) -> str:
        return self.config.topics.dlq_topic(self._tenant(decision, source_topic))

    def _dlq_producer(self, topic: str) -> pulsar.Producer:
        return self._dlq_producers.get(topic)

    def process(self, input: Any, context: Any) -> None:
        """Entry point used by the function module: take the message and schedule its deletion.

        Blocks while `maxDeletionsInFlight` messages are unsettled. Returns before the deletion
        is done; the deletion acks or nacks the message itself.
        """
        mid = context.get_message_id()
        message = InputMessage(
            payload=raw_payload(input, context),
            properties=dict(context.get_message_properties() or {}),
            topic=context.get_current_message_topic_name(),
            message_id=mid,
        )
        try:
            request: Optional[PendingDeleteLedgerInfo] = decode(message.payload)
        except InvalidRequestError:
            request = None  # the engine dead-letters it with the reason; it touches no ledger
        key = request.storage_key if request is not None else None
        self._inflight.submit(key, functools.partial(self._settle, message, request, context))
        return None

    def _settle(self, message: InputMessage, request: Optional[PendingDeleteLedgerInfo], context: Any) -> None:
        """One deletion on a limiter thread: decide and act, then ack, or nack when that failed."""
        try:
            self.handle(message.payload, message.properties, message.topic, message.id_text, context, request)
        except Exception as exc:  # a retry/DLQ send or an unexpected failure: the message must come back
            log.warning("event=deletion_unsettled ledger=%s topic=%s msg_id=%s error=%r",
                        request.ledger_id if request else "?", message.topic, message.id_text, exc)
            acks.nack(context, message)
            return
        try:
            acks.ack(context, message)
        except Exception as exc:  # the outcome is durable; the redelivered copy is acked as already done
            log.warning("event=ack_failed ledger=%s topic=%s msg_id=%s error=%r",
                        request.ledger_id if request else "?", message.topic, message.id_text, exc)

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every message taken by process() is settled; True if so."""
        return self._inflight.drain(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Let the deletions in flight finish (up to `timeout` s; the rest is redelivered), then close producers."""
        if not self._inflight.close(timeout):
            log.warning("event=close_with_deletions_in_flight count=%d hint='unacked, redelivered later'",
                        self._inflight.in_flight)
        self._dlq_producers.close()
        self.delayed.close()


def _serialized(fn: Callable[..., Any], lock: threading.Lock) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return fn(*args, **kwargs)
    return call


def load_bucket_hooks(spec: str, user_config: Mapping[str, Any]) -> Any:
    """Import `module:callable` and call it with the userConfig; the result must offer
    is_bucket_in_use(bucket_id) and delete(bucket_id), optionally bucket_owner(bucket_id)."""
    module, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    hooks = factory(dict(user_config))
    for needed in ("is_bucket_in_use", "delete"):
        if not callable(getattr(hooks, needed, None)):
            raise ValueError(f"bucketSnapshotHooks {spec!r} returned an object without {needed}()")
    return hooks


def build_engine(config: DeletionConfig, trusted: Optional[TrustedLedgerRegistry] = None) -> DeletionEngine:
    """Wire oracles and storages from the configuration."""
    default_oracle = None
    if config.admin_urls:
        admin = PulsarAdminClient.connect(config.admin_urls, config.admin_timeout_seconds, config.admin_token,
                                          pool_size=config.max_deletions_in_flight)
        default_oracle = InternalStatsOracle(admin, ttl_seconds=config.ledgers_cache_ttl_seconds)
    router = StorageRouter()
    if config.bookie_urls:
        router.bookkeeper = BookieLedgerStorage(BookieHttpClient.connect(
            config.bookie_urls, config.bookie_timeout_seconds, pool_size=config.max_deletions_in_flight))
    if config.s3_bucket or config.s3_allowed_buckets or config.s3_endpoint_url:
        client = make_s3_client(config.s3_endpoint_url, config.s3_region, pool_size=config.max_deletions_in_flight,
                                **config.s3_credentials)
        router.s3 = S3OffloadStorage(
            client,
            default_bucket=config.s3_bucket,
            allowed_buckets=frozenset(config.s3_allowed_buckets),
            require_owner_metadata=config.s3_require_owner_metadata,
        )
    if config.filesystem_base_path:
        router.filesystem = FileSystemOffloadStorage(config.filesystem_base_path)
    oracle = ComponentOracle(default=default_oracle)
    if config.bucket_snapshot_hooks:
        hooks = load_bucket_hooks(config.bucket_snapshot_hooks, config.raw)
        # Deletions run concurrently; a hooks object is not asked to be thread-safe, so its calls
        # take turns.
        lock = threading.Lock()
        owner = getattr(hooks, "bucket_owner", None)
        oracle.by_component[LedgerComponent.DELAYED_INDEX_BUCKET] = SnapshotManifestOracle(
            _serialized(hooks.is_bucket_in_use, lock))
        router.snapshot = SnapshotStoreStorage(_serialized(hooks.delete, lock),
                                               _serialized(owner, lock) if callable(owner) else None)
    return DeletionEngine(
        oracle=oracle,
        router=router,
        topics=config.topics,
        trusted=trusted,
        max_redeliver_count=config.max_redeliver_count,
    )


def build_worker(context: Any) -> DeletionWorkerRunner:
    """Build a runner from a function Context (userConfig, secrets, the instance's client)."""
    config = DeletionConfig.from_user_config(context.get_user_config_map() or {}, getattr(context, "get_secret", None))
    client = pulsar_client(context)
    delayed = DelayedProducer(client, backend=config.delay_backend, scheduling_topic=config.scheduling_topic)
    runner = DeletionWorkerRunner(build_engine(config), config, client, delayed)
    log.info(
        "ledger deletion worker ready namespace=%s scope=%s parallelism=%d backend=%s in_flight=%d",
        config.topics.namespace, config.topics.scope, config.topics.parallelism, config.delay_backend,
        config.max_deletions_in_flight,
    )
    return runner
