"""Names of the deletion, retry and dead-letter topics (seed 001).

`<ns>/__ledger_deletion` is partitioned by ledgerDeletionParallelism and its partitions are
addressed by name (`-partition-<k>`, as Pulsar names them), so it works both on a real cluster
and on the embedded broker with default_partitions=0. `-RETRY` is partitioned the same way (a
retry goes back to the partition index it came from); `-DLQ` is one topic, read by operators.

Scope "cluster" puts every topic in one namespace (default `pulsar/system`, the PIP). Scope
"tenant" answers the tenant-isolation objection raised on the PIP: each tenant gets its own
topics in `<tenant>/<tenantNamespace>`, and a worker refuses requests for other tenants' topics.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import List, Optional

from ..topics import TopicName, TopicNameError, is_named_entity, partition_name
from .model import InvalidRequestError, TopicRef

SCOPES = ("cluster", "tenant")


@dataclass(frozen=True)
class SourceTopic:
    """What a worker learns from the topic a message came from."""

    kind: str  # "main" | "retry" | "dlq"
    partition: int  # -1 for the DLQ
    tenant: Optional[str]  # the tenant whose deletion topic this is (tenant scope), else None


@dataclass(frozen=True)
class DeletionTopics:
    """Resolves every topic name of the protocol from its configuration."""

    namespace: str = "pulsar/system"
    topic_name: str = "__ledger_deletion"
    parallelism: int = 4
    scope: str = "cluster"
    tenant_namespace: str = "system"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"deletionTopicScope must be one of {SCOPES}, got {self.scope!r}")
        if not isinstance(self.parallelism, int) or self.parallelism < 1:
            raise ValueError(f"ledgerDeletionParallelism must be an integer >= 1, got {self.parallelism!r}")
        parts = self.namespace.split("/")
        if len(parts) != 2 or not all(is_named_entity(p) for p in parts):
            raise ValueError(f"deletionNamespace must be 'tenant/namespace', got {self.namespace!r}")
        for label, value in (("deletionTopicName", self.topic_name), ("tenantDeletionNamespace", self.tenant_namespace)):
            if not is_named_entity(value):
                raise ValueError(f"{label} has illegal characters: {value!r}")

    # -- namespaces -----------------------------------------------------------------------------
    def namespace_for(self, tenant: Optional[str]) -> str:
        """The namespace holding the deletion topics (for `tenant` in tenant scope)."""
        if self.scope == "cluster":
            return self.namespace
        if not tenant:
            raise ValueError("tenant scope needs a tenant to name the deletion topics")
        return f"{tenant}/{self.tenant_namespace}"

    def _base(self, tenant: Optional[str]) -> str:
        return f"persistent://{self.namespace_for(tenant)}/{self.topic_name}"

    # -- names ----------------------------------------------------------------------------------
    def deletion_topic(self, tenant: Optional[str] = None) -> str:
        """The partitioned deletion topic (base name)."""
        return self._base(tenant)

    def deletion_partition(self, index: int, tenant: Optional[str] = None) -> str:
        """Partition `index` of the deletion topic."""
        self._check_index(index)
        return partition_name(self._base(tenant), index)

    def retry_topic(self, tenant: Optional[str] = None) -> str:
        """The partitioned retry topic (base name)."""
        return f"{self._base(tenant)}-RETRY"

    def retry_partition(self, index: int, tenant: Optional[str] = None) -> str:
        """Partition `index` of the retry topic."""
        self._check_index(index)
        return partition_name(self.retry_topic(tenant), index)

    def dlq_topic(self, tenant: Optional[str] = None) -> str:
        """The dead-letter topic (not partitioned)."""
        return f"{self._base(tenant)}-DLQ"

    def input_topics(self, tenant: Optional[str] = None) -> List[str]:
        """Every topic a worker consumes: all deletion and retry partitions."""
        return [self.deletion_partition(k, tenant) for k in range(self.parallelism)] + [
            self.retry_partition(k, tenant) for k in range(self.parallelism)
        ]

    def partition_for(self, topic: TopicRef, ledger_id: int) -> int:
        """Stable spread of requests over partitions (same ledger -> same partition)."""
        return zlib.crc32(f"{topic.short_name}#{ledger_id}".encode("utf-8")) % self.parallelism

    def tenant_of_request(self, topic: TopicRef) -> Optional[str]:
        """The tenant whose deletion topics carry requests for `topic` (None in cluster scope)."""
        return topic.tenant if self.scope == "tenant" else None

    # -- parsing --------------------------------------------------------------------------------
    def classify(self, source_topic: str) -> SourceTopic:
        """Which protocol topic `source_topic` is; ValueError if it is none of ours."""
        try:
            parsed = TopicName.parse(source_topic) if str(source_topic or "").startswith("persistent://") else None
        except TopicNameError:
            parsed = None
        if parsed is None:
            raise ValueError(f"not a persistent topic name: {source_topic!r}")
        tenant, ns, local = parsed.tenant, parsed.namespace, parsed.local_name
        if self.scope == "cluster":
            if f"{tenant}/{ns}" != self.namespace:
                raise ValueError(f"{source_topic!r} is outside the deletion namespace {self.namespace}")
            owner: Optional[str] = None
        else:
            if ns != self.tenant_namespace:
                raise ValueError(f"{source_topic!r} is outside the tenant deletion namespace {self.tenant_namespace}")
            owner = tenant
        if parsed.partition is not None:
            base, index = parsed.partition
            kind = {self.topic_name: "main", f"{self.topic_name}-RETRY": "retry"}.get(base)
            if kind is not None:
                return SourceTopic(kind, index, owner)
        if local == f"{self.topic_name}-DLQ":
            return SourceTopic("dlq", -1, owner)
        raise ValueError(f"{source_topic!r} is not a deletion, retry or DLQ topic of {self.topic_name}")

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.parallelism:
            raise ValueError(f"partition {index} out of range 0..{self.parallelism - 1}")


def check_tenant(topics: DeletionTopics, source: SourceTopic, request_topic: TopicRef) -> None:
    """In tenant scope a request may only name topics of the tenant whose topic carried it."""
    if topics.scope == "tenant" and source.tenant != request_topic.tenant:
        raise InvalidRequestError(
            f"cross-tenant request: topic {request_topic.short_name} arrived on tenant {source.tenant}'s deletion topic"
        )
