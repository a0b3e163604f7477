"""`inspect deletion`: what a LedgerDeletionWorker has left to do, from the broker's topics.

- pending requests: on each partition of the deletion topic,
- retries: on each partition of the RETRY topic (a retry still waiting for its time in the
  writer's index is not there yet),
- dead letters: on the DLQ topic.

With the admin REST API (real Pulsar, `--admin-url`) the deletion and RETRY counts are the
backlog of the worker's subscription (`msgBacklog`), and the DLQ count the backlog of the
subscription `deletion dlq replay` uses (dead letters not yet replayed). Without it (pulsar-lite
has no admin API), or while that subscription does not exist yet, a count is of the messages
stored on the topic, read with a non-durable Reader: requests the worker already handled are
still counted while the broker keeps them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, List, Optional

import pulsar

from ..config.settings import ConfigError
from ..delaylevel.admin import AdminView
from ..deletion.admin import AdminAccess
from ..deletion.config import DeletionConfig
from ..deletion.operator import DLQ_SUBSCRIPTION
from ..deletion.topics import DeletionTopics
from .common import InspectError, count_stored

log = logging.getLogger(__name__)

__all__ = ["DeletionReport", "TopicCount", "deletion_topics", "inspect_deletion"]


@dataclass(frozen=True)
class TopicCount:
    """Messages waiting on one topic."""

    kind: str  # "pending", "retry" or "dead-letter"
    topic: str
    count: int
    source: str  # "admin-backlog" or "stored"
    truncated: bool = False  # a Reader count that stopped at its limit: at least `count`


@dataclass
class DeletionReport:
    """Everything `inspect deletion` shows."""

    fqfn: str
    subscription: str
    topics: List[TopicCount] = field(default_factory=list)

    def total(self, kind: str) -> int:
        """The sum of one kind's counts."""
        return sum(t.count for t in self.topics if t.kind == kind)


def deletion_topics(spec: Any, tenant: Optional[str]) -> DeletionTopics:
    """The deletion topics of the worker `spec`; InspectError when its config is not a worker's
    or names no topics without `tenant`. Checked before anything connects."""
    fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
    try:
        cfg = DeletionConfig.from_user_config(spec.user_config or {}, get_secret=(spec.secrets or {}).get)
    except (ConfigError, ValueError) as exc:
        raise InspectError(f"{fqfn} is not a LedgerDeletionWorker config: {exc}") from exc
    if cfg.topics.scope == "tenant" and not tenant:
        raise InspectError("deletionTopicScope is tenant: name the tenant whose topics to count (--tenant)")
    return cfg.topics


def inspect_deletion(spec: Any, client: pulsar.Client, *, tenant: Optional[str] = None,
                     admin_url: Optional[str] = None,
                     admin_access: Optional[AdminAccess] = None, count_limit: int = 100_000,
                     timeout_s: float = 60.0) -> DeletionReport:
    """Count what the LedgerDeletionWorker `spec` (a FunctionSpec) has left; see the module docstring.

    Args:
        spec: the worker's function config.
        client: a client of the broker it runs on.
        tenant: whose topics (deletionTopicScope tenant).
        admin_url: the admin REST API (real Pulsar): counts from subscription backlogs.
        admin_access: its token and CA on a secured cluster (a 401/403 is AdminRefused, one line).
        count_limit: a Reader counts at most this many messages per topic.
        timeout_s: bound of each Reader count.
    """
    fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
    topics = deletion_topics(spec, tenant)
    report = DeletionReport(fqfn, spec.sub_name)
    wanted = ([("pending", topics.deletion_partition(k, tenant)) for k in range(topics.parallelism)]
              + [("retry", topics.retry_partition(k, tenant)) for k in range(topics.parallelism)])
    admin = AdminView.connect(admin_url, 60.0, access=admin_access) if admin_url else None
    try:
        for kind, topic in wanted:
            backlog = admin.subscription_backlog(topic, spec.sub_name) if admin is not None else None
            if backlog is not None:
                report.topics.append(TopicCount(kind, topic, backlog, "admin-backlog"))
            else:  # no admin API, or the worker has not subscribed yet
                count, truncated = count_stored(client, topic, count_limit, timeout_s)
                report.topics.append(TopicCount(kind, topic, count, "stored", truncated))
        dlq = topics.dlq_topic(tenant)
        backlog = admin.subscription_backlog(dlq, DLQ_SUBSCRIPTION) if admin is not None else None
        if backlog is not None:
            report.topics.append(TopicCount("dead-letter", dlq, backlog, "admin-backlog"))
        else:
            count, truncated = count_stored(client, dlq, count_limit, timeout_s)
            report.topics.append(TopicCount("dead-letter", dlq, count, "stored", truncated))
    finally:
        if admin is not None:
            admin.close()
    return report
