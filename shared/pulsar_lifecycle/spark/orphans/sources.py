"""Orphan audit adapters: list storage, collect the in-use sets (driver side, thin).

Listings (each complete or a ListingError, never partial):
    BookieListing      GET /api/v1/ledger/list?print_metadata=true&decode_meta=true&page=N
    S3OffloadListing   ListObjectsV2 over `<uuid>-ledger-<id>[-index]` + HEAD for ManagedLedgerName
    FilesystemListing  `<base>/<tenant>/<ns>/persistent/<topic>/<ledgerId>-<uuid>` (the offloader's tree)
    SnapshotStoreListing  our DirectorySnapshotStorage (`snapshots/<20-digit id>.snap`)
In-use sources (each complete or a ListingError):
    AdminInUse         Pulsar admin REST: tenants -> namespaces -> topics -> internalStats,
                       rate-limited (`max_rps`)
    SnapshotManifestInUse  the writer's bucket manifest (buckets, pending deletions, newest id)
Exported lists (files) are read by Spark itself (driver_frames.py).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import quote

from ...bucket.codec import Manifest
from ...bucket.storage import SnapshotNotFoundError
from ...bucket.storage import StorageError as SnapshotStorageError
from ...bucket.storage.directory import DirectorySnapshotStorage
from ...deletion.admin import ledger_ids_from_internal_stats
from ...deletion.model import TopicRef
from ...deletion.ports import StorageError
from ...deletion.storage.http import HttpEndpoints
from ...topics import java_url_encode
from .model import (
    ADMIN_COMPONENTS,
    BUCKET_SPACE_PREFIX,
    COMP_BUCKET_SNAPSHOT,
    COMP_OFFLOADED,
    LEDGER_SPACE,
    Coverage,
    InUseSet,
    ListedLedger,
    ListingError,
    bookkeeper_ledger,
    namespace_of,
    parse_filesystem_ledger_dir,
    parse_offload_key,
)

log = logging.getLogger(__name__)

S3_OWNER_KEY = "managedledgername"  # boto3 lower-cases user metadata keys


# -- rate limit -------------------------------------------------------------------------------------
@dataclass
class RateLimiter:
    """At most `rate` acquisitions per second, evenly spaced (no burst): admin calls must not
    hammer the brokers' metadata store (PIP-219 proposes 200 metadata reads/s). rate <= 0: no limit."""

    rate: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _next: float = field(default=0.0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def acquire(self) -> None:
        """Block until the next call is allowed."""
        if self.rate <= 0:
            return
        with self._lock:
            now = self.clock()
            start = max(now, self._next)
            self._next = start + 1.0 / self.rate
        if start > now:
            self.sleep(start - now)


# -- storage listings -------------------------------------------------------------------------------
@dataclass
class BookieListing:
    """Every BookKeeper ledger with its custom metadata, page by page (100 per page).

    BookKeeper's ListLedgerService counts ledgers from 1 and serves positions
    (page-1)*100 .. page*100-1 (page 1 holds 99), so pages are fetched until one is empty. A ledger
    deleted between two pages can shift another out of sight: it is then simply not listed, which
    can never make it an orphan. Any error status, a non-JSON page or a page without decoded
    metadata is a ListingError."""

    base_urls: Sequence[str]
    timeout: float = 30.0
    max_pages: int = 10_000_000
    store: str = "bookkeeper"

    def list(self) -> Iterator[ListedLedger]:
        """Yield every ledger; ListingError on any failure."""
        seen: set = set()
        first = 1
        while first <= self.max_pages:
            ledgers, ended = self.pages(first, min(first + 99, self.max_pages))
            for ledger in ledgers:
                if ledger.ledger_id not in seen:
                    seen.add(ledger.ledger_id)
                    yield ledger
            if ended:
                return
            first += 100
        raise ListingError(f"bookie ledger list: more than {self.max_pages} pages")

    def pages(self, first: int, last: int) -> Tuple[List[ListedLedger], bool]:
        """The ledgers of pages first..last and whether an empty page ended the listing there
        (pages after it are not fetched). A block of pages is what one Spark task lists
        (driver_listing.py, executor.py); ListingError on any failure."""
        endpoints = HttpEndpoints(list(self.base_urls), timeout=self.timeout)
        out: List[ListedLedger] = []
        try:
            for page in range(first, last + 1):
                body = self._page(endpoints, page)
                if not body:
                    return out, True
                for key, md in body.items():
                    try:
                        lid = int(key)
                    except ValueError:
                        raise ListingError(f"bookie ledger list page {page}: non-numeric ledger id {key!r}") from None
                    if not isinstance(md, dict):
                        raise ListingError(
                            f"bookie ledger list page {page}: ledger {lid} has no decoded metadata "
                            "(the bookie must support decode_meta=true)")
                    out.append(bookkeeper_ledger(self.store, lid, md))
            return out, False
        finally:
            endpoints.close()

    @staticmethod
    def _page(endpoints: HttpEndpoints, page: int) -> Dict[str, Any]:
        params = {"print_metadata": "true", "decode_meta": "true", "page": page}
        try:
            res = endpoints.request("GET", "/api/v1/ledger/list", params=params)
            body = res.json() if res.status == 200 else None
        except StorageError as exc:
            raise ListingError(f"bookie ledger list page {page}: {exc}") from exc
        if res.status != 200:
            raise ListingError(f"bookie ledger list page {page} answered {res.status}: {res.text[:200]!r}")
        if not isinstance(body, dict):
            raise ListingError(f"bookie ledger list page {page} is not a JSON object: {res.text[:200]!r}")
        return body


@dataclass
class S3OffloadListing:
    """Offloaded ledgers in one bucket. The data object `<uuid>-ledger-<id>` is the ledger; a lone
    `-index` object (data gone) is listed too. The owner comes from the data (else index) object's
    user metadata `ManagedLedgerName`; objects without it are unlabelled (Pulsar's scan API calls
    them UNKNOWN). Each HEAD goes through `limiter`."""

    client: Any  # a boto3 S3 client
    bucket: str
    limiter: Optional[RateLimiter] = None

    @property
    def store(self) -> str:
        """`s3://<bucket>`."""
        return f"s3://{self.bucket}"

    def _pages(self) -> Iterator[Dict[str, Any]]:
        from botocore.exceptions import BotoCoreError, ClientError  # boto3 is imported with the client

        token: Optional[str] = None
        while True:
            kw: Dict[str, Any] = {"Bucket": self.bucket}
            if token:
                kw["ContinuationToken"] = token
            try:
                resp = self.client.list_objects_v2(**kw)
            except (BotoCoreError, ClientError) as exc:
                raise ListingError(f"s3 list {self.bucket}: {exc}") from exc
            yield resp
            if not resp.get("IsTruncated"):
                return
            token = resp.get("NextContinuationToken")
            if not token:
                raise ListingError(f"s3 list {self.bucket}: truncated page without a continuation token")

    def _owner(self, key: str) -> Optional[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        if self.limiter is not None:
            self.limiter.acquire()
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as exc:
            raise ListingError(f"s3 head {self.bucket}/{key}: {exc}") from exc
        md = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
        return md.get(S3_OWNER_KEY)

    def list(self) -> Iterator[ListedLedger]:
        """Yield one entry per offloaded ledger (uuid, id); ListingError on any failure."""
        objects: Dict[tuple, Dict[str, Any]] = {}
        for page in self._pages():
            for obj in page.get("Contents") or []:
                parsed = parse_offload_key(obj["Key"])
                if parsed is None:
                    continue
                uuid, lid, is_index = parsed
                slot = objects.setdefault((uuid, lid), {})
                slot["index" if is_index else "data"] = obj
        for (uuid, lid), slot in sorted(objects.items(), key=lambda kv: kv[0][1]):
            obj = slot.get("data") or slot["index"]
            owner = self._owner(obj["Key"])
            modified = obj.get("LastModified")
            created = int(modified.timestamp() * 1000) if modified is not None else None
            yield ListedLedger(self.store, LEDGER_SPACE, lid, COMP_OFFLOADED if owner else None, owner,
                               namespace_of(owner), uuid, obj["Key"], created)


@dataclass
class FilesystemListing:
    """Offloaded ledgers of the filesystem offloader: `<base>/<ML name>/<ledgerId>-<uuid>`, the ML
    name being `tenant/namespace/persistent/<topic>`. The owner is the path. An unreadable
    directory is a ListingError (os.walk would silently skip it)."""

    base_path: str

    @property
    def store(self) -> str:
        """`file://<base>`."""
        return f"file://{os.path.realpath(self.base_path)}"

    def list(self) -> Iterator[ListedLedger]:
        """Yield every `<id>-<uuid>` entry four levels below the base."""
        base = Path(os.path.realpath(self.base_path))
        if not base.is_dir():
            raise ListingError(f"filesystem offload base {base} is not a directory")
        errors: List[OSError] = []
        for dirpath, dirnames, _files in os.walk(base, onerror=errors.append):
            rel = Path(dirpath).relative_to(base)
            if len(rel.parts) == 4 and rel.parts[2] == "persistent":
                owner = "/".join(rel.parts)
                for name in sorted(dirnames):
                    parsed = parse_filesystem_ledger_dir(name)
                    if parsed is None:
                        continue
                    lid, uuid = parsed
                    path = Path(dirpath) / name
                    try:
                        created = int(path.stat().st_mtime * 1000)
                    except OSError as exc:
                        raise ListingError(f"filesystem offload: cannot stat {path}: {exc}") from exc
                    yield ListedLedger(self.store, LEDGER_SPACE, lid, COMP_OFFLOADED, owner, namespace_of(owner),
                                       uuid, str(path), created)
                dirnames[:] = []  # ledger directories are MapFiles: nothing below is ours
        if errors:
            raise ListingError(f"filesystem offload listing of {base} failed: {errors[0]}")


def snapshot_id_space(root: str) -> str:
    """The id space of one snapshot store (bucket ids are per store)."""
    return BUCKET_SPACE_PREFIX + os.path.realpath(root)


@dataclass
class SnapshotStoreListing:
    """Our BucketSnapshotWriter's snapshots in a DirectorySnapshotStorage (its `snapshotDir`).
    The age is the snapshot file's mtime (`snapshots/<20-digit id>.snap`, the store's documented
    layout); the owner is the topic recorded with the snapshot."""

    root: str

    def list(self) -> Iterator[ListedLedger]:
        """Yield every complete snapshot."""
        storage = DirectorySnapshotStorage(Path(self.root))
        space = snapshot_id_space(self.root)
        try:
            ids = storage.list_snapshots()
        except SnapshotStorageError as exc:
            raise ListingError(f"snapshot store listing {self.root}: {exc}") from exc
        for bid in ids:
            path = Path(self.root) / "snapshots" / f"{bid:020d}.snap"
            try:
                info = storage.snapshot_info(bid)
                created = int(path.stat().st_mtime * 1000)
            except (SnapshotNotFoundError, FileNotFoundError):
                continue  # deleted since the listing: nothing to report
            except (SnapshotStorageError, OSError, ValueError) as exc:
                raise ListingError(f"snapshot store {self.root}: bucket {bid}: {exc}") from exc
            topic = str(info.get("topic") or "") or None
            yield ListedLedger(f"snapshots://{os.path.realpath(self.root)}", space, bid,
                               COMP_BUCKET_SNAPSHOT if topic else None, topic, namespace_of(topic),
                               str(info.get("bucket_key") or ""), str(path), created)


# -- in-use sources ---------------------------------------------------------------------------------
@dataclass
class AdminInUse:
    """Every ledger Pulsar's metadata references, through the admin REST API of one cluster:
    GET /admin/v2/tenants, /admin/v2/namespaces/{tenant},
    /admin/v2/persistent/{tenant}/{ns}?includeSystemTopic=true (partitions included), then each
    topic's internalStats (data ledgers with offloaded ones, cursorLedger, schemaLedgers,
    compactedLedger). Every call waits for `limiter`. A topic or namespace deleted during the scan
    (404) is skipped: nothing of it is in use any more. Any other failure is a ListingError.
    Coverage: the admin components, in each namespace scanned."""

    base_urls: Sequence[str]
    limiter: RateLimiter
    token: Optional[str] = None
    timeout: float = 30.0
    tenants: Sequence[str] = ()  # empty: every tenant
    calls: int = 0

    def _get(self, endpoints: HttpEndpoints, path: str, params: Optional[Dict[str, Any]] = None) -> Any:
        self.limiter.acquire()
        self.calls += 1
        try:
            res = endpoints.request("GET", path, params=params)
        except StorageError as exc:
            raise ListingError(f"admin GET {path}: {exc}") from exc
        if res.status == 404:
            return None
        if res.status != 200:
            raise ListingError(f"admin GET {path} answered {res.status}: {res.text[:200]!r}")
        try:
            return res.json()
        except StorageError as exc:
            raise ListingError(f"admin GET {path}: {exc}") from exc

    def _list(self, endpoints: HttpEndpoints, path: str, what: str,
              params: Optional[Dict[str, Any]] = None) -> Optional[List[str]]:
        body = self._get(endpoints, path, params)
        if body is None:
            return None
        if not isinstance(body, list) or not all(isinstance(x, str) for x in body):
            raise ListingError(f"admin GET {path}: {what} is not a list of names: {str(body)[:200]!r}")
        return body

    def collect(self) -> InUseSet:
        """Scan the cluster; InUseSet with source `admin`."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        endpoints = HttpEndpoints(list(self.base_urls), timeout=self.timeout, headers=headers)
        found = InUseSet("admin")
        try:
            tenants = list(self.tenants) or self._list(endpoints, "/admin/v2/tenants", "tenants")
            if tenants is None:
                raise ListingError("admin GET /admin/v2/tenants answered 404")
            for tenant in tenants:
                namespaces = self._list(endpoints, f"/admin/v2/namespaces/{quote(tenant, safe='')}", "namespaces")
                for ns in namespaces or []:
                    self._scan_namespace(endpoints, ns, found)
        finally:
            endpoints.close()
        log.info("event=admin_in_use_collected calls=%d namespaces=%d ids=%d", self.calls,
                 len(found.coverage) // max(1, len(ADMIN_COMPONENTS)), len(found.ids.get(LEDGER_SPACE, ())))
        return found

    def _scan_namespace(self, endpoints: HttpEndpoints, ns: str, found: InUseSet) -> None:
        parts = ns.split("/")
        if len(parts) != 2 or not all(parts):
            raise ListingError(f"admin namespaces: {ns!r} is not tenant/namespace")
        topics = self._list(endpoints, f"/admin/v2/persistent/{quote(parts[0], safe='')}/{quote(parts[1], safe='')}",
                            "topics", {"includeSystemTopic": "true"})
        if topics is None:
            return  # namespace deleted during the scan
        for name in topics:
            if not name.startswith("persistent://"):
                continue
            ref = TopicRef.parse(name)
            stats = self._get(endpoints, f"/admin/v2/persistent/{quote(ref.tenant, safe='')}/"
                                         f"{quote(ref.namespace, safe='')}/{java_url_encode(ref.local_name)}/internalStats")
            if stats is None:
                log.info("event=admin_topic_gone topic=%s", ref.short_name)
                continue
            try:
                ids = ledger_ids_from_internal_stats(stats)
            except StorageError as exc:
                raise ListingError(f"internalStats of {ref.short_name}: {exc}") from exc
            for lid in ids:
                found.add(LEDGER_SPACE, lid)
        found.coverage.extend(Coverage(LEDGER_SPACE, comp, ns) for comp in ADMIN_COMPONENTS)


@dataclass
class SnapshotManifestInUse:
    """Our writer's bucket manifest: the buckets in the index and those already handed to
    two-phase deletion (not orphans: their deletion is under way). `max_bucket_id` is the newest
    id the manifest ever referenced; it counts as known even when that bucket is gone."""

    root: str

    def collect(self) -> InUseSet:
        """Read the manifest once; ListingError when it cannot be read or parsed."""
        storage = DirectorySnapshotStorage(Path(self.root))
        space = snapshot_id_space(self.root)
        found = InUseSet(f"manifest:{os.path.realpath(self.root)}")
        try:
            raw = storage.get_manifest()
        except SnapshotStorageError as exc:
            raise ListingError(f"bucket manifest {self.root}: {exc}") from exc
        found.coverage.append(Coverage(space, COMP_BUCKET_SNAPSHOT))
        if not raw:
            return found  # no manifest yet: nothing in use and nothing known (all NEWER_THAN_METADATA)
        man = Manifest()
        try:
            man.ParseFromString(raw)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise ListingError(f"bucket manifest {self.root} does not parse: {exc}") from exc
        for ref in man.buckets:
            found.add(space, ref.bucket_id)
        for bid in man.pending_delete:
            found.add(space, bid)
        found.max_known[space] = max([man.max_bucket_id, *found.ids.get(space, ())] or [0])
        return found
