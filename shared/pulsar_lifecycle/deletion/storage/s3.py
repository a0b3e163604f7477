"""Offloaded ledgers on S3-compatible object stores, through boto3 (reference §5.4).

The blob-store offloader writes `<uuid>-ledger-<ledgerId>` (data) and
`<uuid>-ledger-<ledgerId>-index` at the bucket root, with the user metadata
`ManagedLedgerName=<ML name>` (newer Pulsar versions), which is the ownership proof.
S3 deletes are idempotent: deleting a missing key succeeds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Optional, Tuple

from ..model import InvalidRequestError, PendingDeleteLedgerInfo
from ..ports import DeleteResult, OwnershipCheck, OwnershipStatus, StorageError

log = logging.getLogger(__name__)

OWNER_METADATA_KEY = "managedledgername"  # boto3 lower-cases user metadata keys


def object_keys(uuid: str, ledger_id: int) -> Tuple[str, str]:
    """(data key, index key) of an offloaded ledger."""
    data = f"{uuid}-ledger-{ledger_id}"
    return data, f"{data}-index"


def make_s3_client(endpoint_url: Optional[str] = None, region: Optional[str] = None, pool_size: int = 10,
                   **kw: Any) -> Any:
    """A boto3 S3 client for `pool_size` concurrent callers (botocore keeps 10 connections by
    default); credentials come from boto3's usual chain unless given in `kw`."""
    import boto3
    from botocore.config import Config

    cfg = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=15,
                 max_pool_connections=max(10, pool_size))
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region or "us-east-1", config=cfg, **kw)


def _status(exc: Exception) -> Optional[int]:
    resp = getattr(exc, "response", None) or {}
    code = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code is None:
        err = resp.get("Error", {}).get("Code")
        if err in ("404", "NoSuchKey", "NotFound"):
            return 404
    return code


@dataclass
class S3OffloadStorage:
    """LedgerStorage for OFFLOAD_LEDGER requests whose driver is S3-compatible."""

    client: Any  # a boto3 S3 client
    default_bucket: Optional[str] = None
    allowed_buckets: FrozenSet[str] = frozenset()
    require_owner_metadata: bool = True
    name: str = "s3"

    def _target(self, request: "PendingDeleteLedgerInfo") -> Tuple[str, str, str]:
        assert request.context is not None and request.context.offload_context is not None
        oc = request.context.offload_context
        bucket = oc.driver_metadata.get("bucket") or self.default_bucket
        if not bucket:
            raise InvalidRequestError(f"ledger {request.ledger_id}: no bucket in driver metadata and no default bucket")
        allowed = self.allowed_buckets or ({self.default_bucket} if self.default_bucket else frozenset())
        if bucket not in allowed:
            raise InvalidRequestError(f"ledger {request.ledger_id}: bucket {bucket!r} is not one this worker manages")
        data, index = object_keys(oc.uuid, request.ledger_id)
        return bucket, data, index

    def _head(self, bucket: str, key: str) -> Optional[Dict[str, str]]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp = self.client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise StorageError(f"s3 head {bucket}/{key}: {exc}") from None
        except BotoCoreError as exc:
            raise StorageError(f"s3 head {bucket}/{key}: {exc}") from None
        return {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}

    def check_owner(self, request: "PendingDeleteLedgerInfo") -> OwnershipCheck:
        """Compare the objects' ManagedLedgerName metadata with the request's topic."""
        bucket, data, index = self._target(request)
        md = self._head(bucket, data)
        if md is None:
            md = self._head(bucket, index)
        if md is None:
            return OwnershipCheck(OwnershipStatus.GONE, f"s3://{bucket}/{data} and its index are gone")
        want = request.topic.managed_ledger_name
        owner = md.get(OWNER_METADATA_KEY)
        if owner is None:
            if self.require_owner_metadata:
                return OwnershipCheck(OwnershipStatus.UNVERIFIABLE, f"s3://{bucket}/{data} has no ManagedLedgerName metadata")
            return OwnershipCheck(OwnershipStatus.MATCH, f"s3://{bucket}/{data} unlabelled; trusted by configuration")
        if owner != want:
            return OwnershipCheck(OwnershipStatus.MISMATCH, f"s3://{bucket}/{data} belongs to {owner!r}, request names {want!r}")
        return OwnershipCheck(OwnershipStatus.MATCH, f"s3://{bucket}/{data} owned by {want!r}")

    def delete(self, request: "PendingDeleteLedgerInfo") -> DeleteResult:
        """Delete the data and index objects in one call."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, data, index = self._target(request)
        try:
            resp = self.client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": data}, {"Key": index}], "Quiet": True}
            )
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"s3 delete {bucket}/{data}: {exc}") from None
        errors = [e for e in resp.get("Errors", []) if e.get("Code") not in ("NoSuchKey",)]
        if errors:
            raise StorageError(f"s3 delete {bucket}/{data}: {errors}")
        log.info("s3 delete topic=%s ledger=%d bucket=%s key=%s", request.topic_name, request.ledger_id, bucket, data)
        return DeleteResult.DELETED


@dataclass
class S3ClientPool:
    """One boto3 client per endpoint, built lazily (boto3 clients are thread-safe)."""

    factory: Callable[..., Any] = make_s3_client
    _clients: Dict[Tuple[Optional[str], Optional[str]], Any] = field(default_factory=dict, init=False)

    def get(self, endpoint_url: Optional[str], region: Optional[str], **kw: Any) -> Any:
        """The client for (endpoint, region)."""
        key = (endpoint_url, region)
        if key not in self._clients:
            self._clients[key] = self.factory(endpoint_url=endpoint_url, region=region, **kw)
        return self._clients[key]
