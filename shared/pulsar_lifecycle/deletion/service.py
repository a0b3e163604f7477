"""Phase one: LedgerDeletionService.append_pending_delete_ledger (PIP-186).

The caller sends the pending deletion BEFORE it touches metadata; a failed send raises, so the
caller never removes a ledger from metadata without a deletion request on the topic. The message
is delivered `sendDelaySeconds` later (so the consumer normally sees the metadata already
updated) through the package's time abstraction, batching disabled (one request per entry).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

import pulsar

from ..pulsar_io.producers import ProducerPool
from ..timing import DelayedProducer
from .admin import PulsarAdminClient
from .codec import encode
from .exceptions import PendingDeleteSendError
from .metrics import DeletionMetrics
from .model import LedgerComponent, LedgerContext, LedgerType, PendingDeleteLedgerInfo, TopicRef
from .topics import DeletionTopics
from .trusted import TrustedLedgerRegistry

log = logging.getLogger(__name__)


@dataclass
class LedgerDeletionService:
    """Sends PendingDeleteLedgerInfo requests to the deletion topic (phase one)."""

    client: pulsar.Client
    topics: DeletionTopics = field(default_factory=DeletionTopics)
    delayed: Optional[DelayedProducer] = None  # None: send immediately (send delay must be 0)
    send_delay_seconds: int = 60
    trusted: Optional[TrustedLedgerRegistry] = None
    metrics: Optional[DeletionMetrics] = None
    admin: Optional[PulsarAdminClient] = None
    enabled: bool = True
    _producers: ProducerPool = field(init=False, repr=False)
    _created_for: set = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._producers = ProducerPool(self.client, batching_enabled=False, block_if_queue_full=True)
        if self.send_delay_seconds < 0:
            raise ValueError(f"sendDelaySeconds must be >= 0, got {self.send_delay_seconds}")
        if self.send_delay_seconds > 0 and self.delayed is None:
            raise ValueError("a send delay needs a DelayedProducer (broker or scheduler backend)")

    def start(self) -> None:
        """Create the partitioned deletion and retry topics when an admin client is given (cluster scope;
        tenant-scope topics are created on a tenant's first request)."""
        if self.topics.scope == "cluster":
            self._ensure_topics(None)

    def _ensure_topics(self, tenant: Optional[str]) -> None:
        if self.admin is None or tenant in self._created_for:
            return
        for name in (self.topics.deletion_topic(tenant), self.topics.retry_topic(tenant)):
            created = self.admin.create_partitioned_topic(TopicRef.parse(name), self.topics.parallelism)
            log.info("deletion topic %s partitions=%d created=%s", name, self.topics.parallelism, created)
        self._created_for.add(tenant)

    def _plain_producer(self, topic: str) -> pulsar.Producer:
        return self._producers.get(topic)

    def append_pending_delete_ledger(
        self,
        topic_name: str,
        ledger_id: int,
        context: Optional[LedgerContext],
        component: Union[LedgerComponent, str],
        ledger_type: Union[LedgerType, str],
        check_ledger_still_in_use: bool = True,
        properties: Optional[Mapping[str, str]] = None,
    ) -> pulsar.MessageId:
        """Store one deletion request; returns its message id. Raises PendingDeleteSendError on
        failure and ValueError (InvalidRequestError) for a request that is malformed."""
        info = PendingDeleteLedgerInfo(
            topic_name=TopicRef.parse(topic_name).short_name,
            ledger_component=LedgerComponent(component) if isinstance(component, str) else component,
            ledger_type=LedgerType(ledger_type) if isinstance(ledger_type, str) else ledger_type,
            ledger_id=ledger_id,
            context=context,
            check_ledger_still_in_use=check_ledger_still_in_use,
            properties=dict(properties or {}),
        )
        return self.append(info)

    def append(self, info: PendingDeleteLedgerInfo) -> pulsar.MessageId:
        """append_pending_delete_ledger for a ready-made record."""
        if not self.enabled:
            raise PendingDeleteSendError("two-phase deletion is disabled (twoPhaseDeletionEnabled=false)")
        topic = info.topic
        tenant = self.topics.tenant_of_request(topic)
        target = self.topics.deletion_partition(self.topics.partition_for(topic, info.ledger_id), tenant)
        payload = encode(info)
        # Trust is recorded before the send: if the send fails the caller keeps the ledger in
        # metadata, and a trusted id alone never causes a deletion (the in-use check still runs).
        if self.trusted is not None:
            self.trusted.add(info.key)
        try:
            self._ensure_topics(tenant)
            if self.send_delay_seconds > 0:
                assert self.delayed is not None
                msg_id = self.delayed.send_after(target, payload, self.send_delay_seconds * 1000)
            else:
                msg_id = self._plain_producer(target).send(payload)
        except Exception as exc:  # any failure means "not stored": the caller must not proceed
            if self.trusted is not None:
                self.trusted.discard(info.key)
            log.error("pending delete send failed %s target=%s: %s", info.describe(), target, exc)
            raise PendingDeleteSendError(f"could not store pending deletion of {info.describe()}: {exc}") from exc
        if self.metrics is not None:
            self.metrics.inc("pending_sent")
        log.info("pending delete sent %s target=%s delay_s=%d", info.describe(), target, self.send_delay_seconds)
        return msg_id

    def close(self) -> None:
        """Flush and close producers (the DelayedProducer is closed by its owner)."""
        self._producers.close()
