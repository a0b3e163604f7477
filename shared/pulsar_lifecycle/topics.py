"""Topic names as a value object (Pulsar's `TopicName`): one parser for every module.

Forms: `persistent://tenant/namespace/local` (full), `tenant/namespace/local` (the PIP's short
form), and for clients also a bare `local` (in public/default). A partition of a partitioned
topic is `<local>-partition-<k>`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple
from urllib.parse import unquote_plus

from .exceptions import PulsarLifecycleError

__all__ = ["DOMAINS", "FULL_NAME_PREFIXES", "PARTITION_SUFFIX", "TopicName", "TopicNameError", "is_named_entity", "java_url_encode",
           "normalize_topic", "partition_name", "strip_partition"]

PARTITION_SUFFIX = "-partition-"
_PARTITION_RE = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")
DOMAINS = ("persistent", "non-persistent")
# How a fully qualified name starts (`persistent://`, `non-persistent://`).
FULL_NAME_PREFIXES: Tuple[str, ...] = tuple(f"{domain}://" for domain in DOMAINS)
# Pulsar's NamedEntity rule for tenant, namespace, cluster and function names.
_NAMED_ENTITY_RE = re.compile(r"^[-=:.\w]+$")
# What java.net.URLEncoder leaves as it is.
_URLENCODER_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-*_")


class TopicNameError(PulsarLifecycleError, ValueError):
    """A topic name that is not of a form Pulsar accepts."""


def is_named_entity(value: str) -> bool:
    """True when `value` is a legal tenant, namespace (one segment) or function name: letters, digits, - _ = : ."""
    return bool(_NAMED_ENTITY_RE.match(value))


def java_url_encode(text: str) -> str:
    """java.net.URLEncoder.encode(text, UTF-8), which Pulsar uses for persistence names and admin paths."""
    out = []
    for ch in text:
        if ch in _URLENCODER_SAFE:
            out.append(ch)
        elif ch == " ":
            out.append("+")
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def partition_name(topic: str, index: int) -> str:
    """Partition `index` of `topic` by name, as Pulsar names a partitioned topic's partitions."""
    return f"{topic}{PARTITION_SUFFIX}{int(index)}"


def strip_partition(topic: str) -> str:
    """`topic` without a trailing `-partition-<k>` (unchanged when it has none)."""
    m = _PARTITION_RE.match(topic)
    return m.group("base") if m else topic


@dataclass(frozen=True)
class TopicName:
    """A topic split into domain, tenant, namespace and local name (partition suffix kept)."""

    tenant: str
    namespace: str
    local_name: str
    domain: str = "persistent"

    @classmethod
    def parse(cls, name: str) -> "TopicName":
        """`tenant/namespace/topic` or `<domain>://tenant/namespace/topic`; TopicNameError otherwise."""
        if not isinstance(name, str) or not name:
            raise TopicNameError(f"topic name must be a non-empty string, got {name!r}")
        rest, domain = name, "persistent"
        if "://" in rest:
            domain, rest = rest.split("://", 1)
            if domain not in DOMAINS:
                raise TopicNameError(f"topic {name!r}: unknown domain {domain!r} (expected one of {DOMAINS})")
        parts = rest.split("/", 2)
        if len(parts) != 3 or not all(parts):
            raise TopicNameError(f"topic {name!r} is not of the form tenant/namespace/topic")
        if any(p in (".", "..") for p in parts) or "\x00" in rest:
            raise TopicNameError(f"topic {name!r} has an illegal path segment")
        return cls(parts[0], parts[1], parts[2], domain)

    @classmethod
    def from_client(cls, name: str) -> "TopicName":
        """What a Pulsar client accepts: also a bare `topic` (in public/default); spaces around are ignored."""
        if not isinstance(name, str) or not name.strip():
            raise TopicNameError(f"topic must be a non-empty str, got {name!r}")
        name = name.strip()
        if "://" not in name and "/" not in name:
            return cls("public", "default", name)
        if "://" not in name and name.count("/") != 2:
            raise TopicNameError(f"invalid topic name {name!r}: expected 'name', 'tenant/ns/name' or 'persistent://...'")
        return cls.parse(name)

    @property
    def short_name(self) -> str:
        """`tenant/namespace/topic`, the PIP's topicName form."""
        return f"{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def full_name(self) -> str:
        """`<domain>://tenant/namespace/topic`."""
        return f"{self.domain}://{self.short_name}"

    @classmethod
    def from_persistence_name(cls, name: str) -> "TopicName":
        """The topic of a persistence name `tenant/namespace/<domain>/<URL-encoded local name>` (Pulsar's
        TopicName.fromPersistenceNamingEncoding); TopicNameError when `name` is not of that form."""
        parts = name.split("/", 3) if isinstance(name, str) else []
        if len(parts) != 4 or parts[2] not in DOMAINS or not all(parts):
            raise TopicNameError(f"not a persistence name of the form tenant/namespace/<domain>/topic: {name!r}")
        return cls.parse(f"{parts[2]}://{parts[0]}/{parts[1]}/{unquote_plus(parts[3])}")

    @property
    def persistence_name(self) -> str:
        """`tenant/namespace/<domain>/<URL-encoded local name>`: the managed-ledger name Pulsar writes into
        ledger metadata (TopicName.getPersistenceNamingEncoding)."""
        return f"{self.namespace_name}/{self.domain}/{java_url_encode(self.local_name)}"

    @property
    def namespace_name(self) -> str:
        """`tenant/namespace`."""
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition(self) -> Optional[Tuple[str, int]]:
        """(base local name, index) when this is a partition, else None."""
        m = _PARTITION_RE.match(self.local_name)
        return (m.group("base"), int(m.group("index"))) if m else None

    @property
    def partition_index(self) -> int:
        """The partition index, -1 when this is not a partition."""
        p = self.partition
        return p[1] if p else -1

    @property
    def base(self) -> "TopicName":
        """The partitioned topic this partition belongs to (self when not a partition)."""
        p = self.partition
        return type(self)(self.tenant, self.namespace, p[0], self.domain) if p else self

    def with_partition(self, index: int) -> "TopicName":
        """Partition `index` of this topic."""
        return type(self)(self.tenant, self.namespace, partition_name(self.local_name, index), self.domain)


def normalize_topic(topic: str) -> str:
    """Pulsar's full topic name: `t` and `tenant/ns/t` get `persistent://` (and public/default)."""
    return TopicName.from_client(topic).full_name
