"""Operator actions behind `pulsar-lifecycle deletion ...`: enqueue, list and replay the DLQ."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import pulsar

from ..pulsar_io.producers import ProducerPool
from .admin import PulsarAdminClient
from .codec import decode, encode
from .model import InvalidRequestError, LedgerComponent, LedgerType, PendingDeleteLedgerInfo, TopicRef
from .service import LedgerDeletionService
from .topics import DeletionTopics
from .worker import PROP_OUTCOME, PROP_REAL_TOPIC, PROP_REASON, PROP_RECONSUME_TIMES

log = logging.getLogger(__name__)

DLQ_SUBSCRIPTION = "ledger-deletion-dlq-replay"
PROP_REPLAYED_REASON = "REPLAYED_FROM_DLQ"


@dataclass(frozen=True)
class DlqEntry:
    """One dead letter as shown to an operator."""

    message_id: str
    topic_name: Optional[str]
    ledger_id: Optional[int]
    component: Optional[str]
    ledger_type: Optional[str]
    reason: str
    outcome: str
    attempts: int
    real_topic: str

    def as_dict(self) -> Dict[str, object]:
        """JSON-friendly form."""
        return dict(self.__dict__)


def _entry(msg: pulsar.Message) -> DlqEntry:
    props = msg.properties() or {}
    try:
        info: Optional[PendingDeleteLedgerInfo] = decode(msg.data())
    except InvalidRequestError:
        info = None
    return DlqEntry(
        message_id=str(msg.message_id()),
        topic_name=info.topic_name if info else None,
        ledger_id=info.ledger_id if info else None,
        component=info.ledger_component.value if info else None,
        ledger_type=info.ledger_type.value if info else None,
        reason=props.get(PROP_REASON, ""),
        outcome=props.get(PROP_OUTCOME, ""),
        attempts=int(props.get(PROP_RECONSUME_TIMES, "0") or 0),
        real_topic=props.get(PROP_REAL_TOPIC, ""),
    )


def enqueue_topic_ledgers(
    service: LedgerDeletionService, admin: PulsarAdminClient, topic: str, check_in_use: bool = True
) -> List[PendingDeleteLedgerInfo]:
    """Append every BookKeeper ledger internalStats lists for `topic` (data, cursor and schema
    ledgers). Offloaded ledgers need their offload UUID and are skipped with a warning."""
    ref = TopicRef.parse(topic)
    stats = admin.internal_stats(ref)
    if stats is None:
        raise ValueError(f"topic {ref.short_name} not found (internalStats answered 404)")
    todo: List[PendingDeleteLedgerInfo] = []
    for item in stats.get("ledgers") or []:
        if item.get("offloaded"):
            log.warning("skip offloaded topic=%s ledger=%s: enqueue it with its offload uuid", ref.short_name, item.get("ledgerId"))
            continue
        todo.append(PendingDeleteLedgerInfo(ref.short_name, LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, int(item["ledgerId"]), None, check_in_use))
    for name, cursor in (stats.get("cursors") or {}).items():
        if int(cursor.get("cursorLedger", -1)) >= 0:
            todo.append(PendingDeleteLedgerInfo(ref.short_name, LedgerComponent.MANAGED_CURSOR, LedgerType.LEDGER,
                                                int(cursor["cursorLedger"]), None, check_in_use, {"cursor": name}))
    for item in stats.get("schemaLedgers") or []:
        todo.append(PendingDeleteLedgerInfo(ref.short_name, LedgerComponent.SCHEMA_STORAGE, LedgerType.LEDGER, int(item["ledgerId"]), None, check_in_use))
    for info in todo:
        service.append(info)
    return todo


def _scan_dlq(
    client: pulsar.Client,
    topics: DeletionTopics,
    tenant: Optional[str],
    max_messages: int,
    idle_timeout_s: float,
    act: Callable[[pulsar.Consumer, pulsar.Message, DlqEntry], None],
) -> List[DlqEntry]:
    consumer = client.subscribe(
        topics.dlq_topic(tenant), DLQ_SUBSCRIPTION,
        consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=max(1, min(1000, max_messages)),
    )
    seen: Dict[str, DlqEntry] = {}
    try:
        deadline = time.monotonic() + idle_timeout_s
        while len(seen) < max_messages and time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            entry = _entry(msg)
            if entry.message_id in seen:
                continue  # a redelivery of one we already handled
            seen[entry.message_id] = entry
            act(consumer, msg, entry)
            deadline = time.monotonic() + idle_timeout_s
    finally:
        consumer.close()  # unacked messages go back to the subscription
    return list(seen.values())


def list_dlq(client: pulsar.Client, topics: DeletionTopics, tenant: Optional[str] = None,
             max_messages: int = 1000, idle_timeout_s: float = 2.0) -> List[DlqEntry]:
    """The dead letters not yet replayed (read without acknowledging)."""
    return _scan_dlq(client, topics, tenant, max_messages, idle_timeout_s, lambda c, m, e: None)


def replay_dlq(
    client: pulsar.Client,
    topics: DeletionTopics,
    tenant: Optional[str] = None,
    max_messages: int = 1000,
    idle_timeout_s: float = 2.0,
    select: Optional[Callable[[DlqEntry], bool]] = None,
) -> List[DlqEntry]:
    """Send selected dead letters back to the deletion topic with a fresh retry budget, then ack
    them. Undecodable ones are never replayed (they would only come back)."""
    producers = ProducerPool(client, batching_enabled=False)
    replayed: List[DlqEntry] = []

    def act(consumer: pulsar.Consumer, msg: pulsar.Message, entry: DlqEntry) -> None:
        if entry.topic_name is None or (select is not None and not select(entry)):
            return
        info = decode(msg.data())
        target = topics.deletion_partition(topics.partition_for(info.topic, info.ledger_id), topics.tenant_of_request(info.topic))
        producers.get(target).send(encode(info), properties={PROP_REPLAYED_REASON: entry.reason[:1000]})
        consumer.acknowledge(msg)  # only after the replay is stored
        replayed.append(entry)
        log.info("replayed from DLQ topic=%s ledger=%d target=%s", entry.topic_name, entry.ledger_id, target)

    try:
        _scan_dlq(client, topics, tenant, max_messages, idle_timeout_s, act)
    finally:
        producers.close()
    return replayed
