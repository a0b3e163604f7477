"""Orphan audit: the records and the pure rules (no Spark, no I/O).

A *listed ledger* is something storage holds: a BookKeeper ledger (with its custom metadata), an
offloaded ledger in S3 (`<uuid>-ledger-<id>` / `-index`) or in the filesystem offloader's
directory, or one of our own bucket snapshots. An *in-use entry* is a ledger id some metadata
still references (topic ledgers, cursor ledgers, schema ledgers, offloaded ledgers, bucket
manifest). Ids live in *id spaces*: BookKeeper ledger ids are shared by BookKeeper and tiered
storage (`ledger`); our snapshot store numbers its buckets itself (`bucket:<store>`).

What a listed ledger is called (`status`), in this order (the first that applies wins):
    IN_USE               some metadata references it
    UNLABELLED           its metadata names no Pulsar component: not ours to judge
    UNCOVERED            no in-use source covers its component and namespace (e.g. another
                         cluster's ledgers, or Pulsar's own bucket-snapshot ledgers, whose ids
                         live only in cursor properties that no admin endpoint returns)
    NEWER_THAN_METADATA  its id is above the newest id the metadata knows (metadata lags storage)
    TOO_YOUNG            created less than `older_than` ago, or its age is unknown
    ORPHAN               none of the above: metadata names a Pulsar component, nothing uses it
"""
from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Set, Tuple

from ...topics import FULL_NAME_PREFIXES, TopicName, TopicNameError
from ..errors import ListingError

# -- id spaces and components ---------------------------------------------------------------------
LEDGER_SPACE = "ledger"  # BookKeeper ledger ids (bookies and tiered storage)
BUCKET_SPACE_PREFIX = "bucket:"  # + the snapshot store's location

COMP_MANAGED_LEDGER = "managed-ledger"  # a topic's data ledger
COMP_MANAGED_CURSOR = "managed-cursor"  # a subscription's cursor ledger
COMP_SCHEMA = "schema"
COMP_COMPACTED = "compacted-ledger"
COMP_DELAYED_INDEX_BUCKET = "delayed-index-bucket"  # Pulsar's own PIP-195 snapshot ledgers
COMP_OFFLOADED = "offloaded-ledger"  # a managed ledger's ledger in tiered storage
COMP_BUCKET_SNAPSHOT = "bucket-snapshot"  # our BucketSnapshotWriter's snapshots

#: Components an admin (internalStats) scan vouches for: every id of these kinds is listed there.
ADMIN_COMPONENTS = (COMP_MANAGED_LEDGER, COMP_MANAGED_CURSOR, COMP_SCHEMA, COMP_COMPACTED, COMP_OFFLOADED)
ALL_COMPONENTS = ADMIN_COMPONENTS + (COMP_DELAYED_INDEX_BUCKET, COMP_BUCKET_SNAPSHOT)
ANY_NAMESPACE = "*"

STATUS_IN_USE = "IN_USE"
STATUS_UNLABELLED = "UNLABELLED"
STATUS_UNCOVERED = "UNCOVERED"
STATUS_NEWER = "NEWER_THAN_METADATA"
STATUS_TOO_YOUNG = "TOO_YOUNG"
STATUS_ORPHAN = "ORPHAN"
STATUSES = (STATUS_IN_USE, STATUS_UNLABELLED, STATUS_UNCOVERED, STATUS_NEWER, STATUS_TOO_YOUNG, STATUS_ORPHAN)

# Keys Pulsar writes into ledger custom metadata (LedgerMetadataUtils; reference §5.3).
KEY_APPLICATION = "application"
KEY_COMPONENT = "component"
KEY_MANAGED_LEDGER = "pulsar/managed-ledger"
KEY_CURSOR = "pulsar/cursor"
KEY_SCHEMA_ID = "pulsar/schemaId"
KEY_COMPACTED_TOPIC = "pulsar/compactedTopic"
KEY_BUCKET_TOPIC = "pulsar/delayedIndexTopic"
KEY_BUCKET_CURSOR = "pulsar/delayedIndexCursor"
KEY_BUCKET_KEY = "pulsar/delayedIndexBucketKey"
LEGACY_KEY_MANAGED_LEDGER = "psr/managed-ledger"
LEGACY_KEY_CURSOR = "psr/cursor"

_OFFLOAD_KEY = re.compile(
    r"^(?P<uuid>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"-ledger-(?P<id>\d+)(?P<index>-index)?$")
_FS_LEDGER_DIR = re.compile(r"^(?P<id>\d+)-(?P<uuid>[0-9a-fA-F-]{36})$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


@dataclass(frozen=True)
class ListedLedger:
    """One thing storage holds. `created_ms` None means the age is unknown (never an orphan)."""

    store: str
    id_space: str
    ledger_id: int
    component: Optional[str]
    owner: Optional[str] = None  # managed-ledger name, schema id or topic
    owner_ns: Optional[str] = None  # tenant/namespace of the owner
    detail: Optional[str] = None  # cursor name, offload uuid, bucket key
    location: Optional[str] = None  # bucket, object key or path
    created_ms: Optional[int] = None

    def row(self) -> Tuple:
        """The tuple in LISTING_COLUMNS order (for DataFrames)."""
        return (self.store, self.id_space, self.ledger_id, self.component, self.owner, self.owner_ns,
                self.detail, self.location, self.created_ms)


LISTING_COLUMNS = ("store", "id_space", "ledger_id", "component", "owner", "owner_ns", "detail", "location",
                   "created_ms")
IN_USE_COLUMNS = ("id_space", "ledger_id", "source")
COVERAGE_COLUMNS = ("id_space", "component", "namespace")


@dataclass(frozen=True)
class Coverage:
    """An in-use source vouches for every id of `component` in `namespace` (`*`: any) of `id_space`."""

    id_space: str
    component: str
    namespace: str = ANY_NAMESPACE

    def row(self) -> Tuple[str, str, str]:
        """The tuple in COVERAGE_COLUMNS order."""
        return (self.id_space, self.component, self.namespace)


@dataclass
class InUseSet:
    """What one in-use source found: ids, the coverage it vouches for, the newest id it knows."""

    source: str
    ids: Dict[str, Set[int]] = field(default_factory=dict)  # id space -> ledger ids
    coverage: List[Coverage] = field(default_factory=list)
    max_known: Dict[str, int] = field(default_factory=dict)  # id space -> newest id known beyond `ids`

    def add(self, id_space: str, ledger_id: int) -> None:
        """Record one referenced id (negative ids mean "none" in Pulsar's JSON and are skipped)."""
        if ledger_id >= 0:
            self.ids.setdefault(id_space, set()).add(int(ledger_id))

    def rows(self) -> Iterator[Tuple[str, int, str]]:
        """(id_space, ledger_id, source) tuples."""
        for space, ids in self.ids.items():
            for i in ids:
                yield (space, i, self.source)

    def newest(self) -> Dict[str, int]:
        """The newest id this source knows, per id space."""
        out = dict(self.max_known)
        for space, ids in self.ids.items():
            if ids:
                out[space] = max(out.get(space, -1), max(ids))
        return out


# -- names ------------------------------------------------------------------------------------------
def namespace_of(owner: Optional[str]) -> Optional[str]:
    """`tenant/namespace` of an ML name (`t/ns/persistent/x`), schema id (`t/ns/x`) or topic
    (`persistent://t/ns/x`); None for anything else. driver_frames._owner_ns is this rule as a Spark column."""
    if not owner:
        return None
    rest = next((owner[len(p):] for p in FULL_NAME_PREFIXES if owner.startswith(p)), owner)
    parts = rest.split("/")
    if len(parts) < 3 or not parts[0] or not parts[1]:
        return None
    return f"{parts[0]}/{parts[1]}"


def topic_of_managed_ledger(ml_name: str) -> str:
    """`tenant/ns/topic` from the persistence name `tenant/ns/persistent/<URL-encoded topic>`."""
    try:
        topic = TopicName.from_persistence_name(ml_name)
    except TopicNameError:
        topic = None
    if topic is None or topic.domain != "persistent":
        raise ValueError(f"not a managed-ledger name of the form tenant/namespace/persistent/topic: {ml_name!r}")
    return topic.short_name


# -- metadata -> component --------------------------------------------------------------------------
def decode_custom_metadata(raw: Mapping[str, object]) -> Dict[str, str]:
    """customMetadata as the bookie's JSON gives it (values are base64 byte arrays) decoded to text."""
    out: Dict[str, str] = {}
    for k, v in raw.items():
        try:
            out[str(k)] = base64.b64decode(str(v), validate=True).decode("utf-8", errors="replace")
        except (binascii.Error, ValueError):
            out[str(k)] = str(v)  # servers that send plain strings
    return out


def classify_bookkeeper(md: Mapping[str, str]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(component, owner, detail) named by a BookKeeper ledger's custom metadata; (None, None, None)
    when it names no Pulsar component. Accepts the legacy `psr/` keys and both spellings of the
    compacted component (`compacted-ledger` in code, `compacted-topic` in docs)."""
    ml = md.get(KEY_MANAGED_LEDGER) or md.get(LEGACY_KEY_MANAGED_LEDGER)
    cursor = md.get(KEY_CURSOR) or md.get(LEGACY_KEY_CURSOR)
    comp = md.get(KEY_COMPONENT)
    if comp == "managed-ledger" or (comp is None and ml):
        if not ml:
            return None, None, None  # claims the component but names no owner: cannot be judged
        return (COMP_MANAGED_CURSOR, ml, cursor) if cursor is not None else (COMP_MANAGED_LEDGER, ml, None)
    if comp == "schema" and md.get(KEY_SCHEMA_ID):
        return COMP_SCHEMA, md[KEY_SCHEMA_ID], None
    if comp in ("compacted-ledger", "compacted-topic") and md.get(KEY_COMPACTED_TOPIC):
        return COMP_COMPACTED, md[KEY_COMPACTED_TOPIC], None
    if comp == "delayed-index-bucket" and md.get(KEY_BUCKET_TOPIC):
        return COMP_DELAYED_INDEX_BUCKET, md[KEY_BUCKET_TOPIC], md.get(KEY_BUCKET_KEY)
    return None, None, None


def bookkeeper_ledger(store: str, ledger_id: int, metadata: Mapping[str, object]) -> ListedLedger:
    """A ListedLedger from one LedgerMetadata JSON object of the bookie HTTP API."""
    raw = metadata.get("customMetadata") or {}
    if not isinstance(raw, Mapping):
        raise ListingError(f"ledger {ledger_id}: customMetadata is not an object")
    comp, owner, detail = classify_bookkeeper(decode_custom_metadata(raw))
    ctime = metadata.get("ctime")
    created = int(ctime) if isinstance(ctime, (int, float)) and ctime > 0 else None
    return ListedLedger(store, LEDGER_SPACE, int(ledger_id), comp, owner, namespace_of(owner), detail, None, created)


def parse_offload_key(key: str) -> Optional[Tuple[str, int, bool]]:
    """(uuid, ledger id, is index) of a tiered-storage object key, or None for other keys."""
    m = _OFFLOAD_KEY.match(key)
    if not m:
        return None
    return m.group("uuid").lower(), int(m.group("id")), m.group("index") is not None


def parse_filesystem_ledger_dir(name: str) -> Optional[Tuple[int, str]]:
    """(ledger id, uuid) of a filesystem offloader directory `<ledgerId>-<uuid>`, or None."""
    m = _FS_LEDGER_DIR.match(name)
    return (int(m.group("id")), m.group("uuid").lower()) if m else None


# -- options ----------------------------------------------------------------------------------------
def parse_duration_ms(text: str) -> int:
    """`24h`, `90m`, `30s`, `2d`, `1w`, `500ms` or a bare number of seconds -> milliseconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration (use e.g. 24h, 90m, 30s, 2d): {text!r}")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return int(round(value * _UNIT_MS[unit]))
