"""userConfig of the LedgerDeletionWorker and of the phase-one service, validated.

Every key is documented in docs/deletion.md. Unknown keys are an error (a typo would otherwise
silently fall back to a default, e.g. a mistyped TTL).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .topics import DeletionTopics

DEFAULTS: Dict[str, Any] = {
    "twoPhaseDeletionEnabled": True,
    "deletionNamespace": "pulsar/system",
    "deletionTopicName": "__ledger_deletion",
    "ledgerDeletionParallelism": 4,
    "deletionTopicScope": "cluster",
    "tenantDeletionNamespace": "system",
    "sendDelaySeconds": 60,
    "reconsumeLaterSeconds": 600,
    "maxRedeliverCount": 10,
    "ledgersCacheTtlSeconds": 600,
    "delayBackend": "scheduler",
    "schedulingTopic": None,
    "pulsarAdminUrl": None,
    "adminTokenSecret": None,
    "adminTimeoutSeconds": 10,
    "bookieHttpUrls": None,
    "bookieTimeoutSeconds": 10,
    "s3EndpointUrl": None,
    "s3Region": None,
    "s3Bucket": None,
    "s3AllowedBuckets": None,
    "s3RequireOwnerMetadata": True,
    "s3AccessKeyIdSecret": None,
    "s3SecretAccessKeySecret": None,
    "fileSystemBasePath": None,
    "bucketSnapshotHooks": None,
    "bucketSnapshotDir": None,
    "bucketSnapshotStorageServiceUrl": None,
    "bucketSnapshotWriter": None,
    "trustedRegistryMaxSize": 100000,
}


def _urls(value: Any, key: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        raise ValueError(f"{key} must be a URL, a comma-separated string or a list, got {type(value).__name__}")
    items = [i for i in items if i]
    for i in items:
        if not i.startswith(("http://", "https://")):
            raise ValueError(f"{key}: {i!r} is not an http(s) URL")
    return items


def _int(cfg: Mapping[str, Any], key: str, minimum: int) -> int:
    raw = cfg[key]
    # Gson turns --user-config integers into doubles (5 -> 5.0); accept integral floats.
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"{key} must be an integer, got {raw!r}")
    try:
        val = float(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None
    if val != int(val):
        raise ValueError(f"{key} must be an integer, got {raw!r}")
    if int(val) < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {raw!r}")
    return int(val)


def _bool(cfg: Mapping[str, Any], key: str) -> bool:
    raw = cfg[key]
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ValueError(f"{key} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class DeletionConfig:
    """Validated settings shared by the worker (phase two) and the service (phase one)."""

    topics: DeletionTopics
    enabled: bool = True
    send_delay_seconds: int = 60
    reconsume_later_seconds: int = 600
    max_redeliver_count: int = 10
    ledgers_cache_ttl_seconds: int = 600
    delay_backend: str = "scheduler"
    scheduling_topic: Optional[str] = None
    admin_urls: Tuple[str, ...] = ()
    admin_token: Optional[str] = None
    admin_timeout_seconds: float = 10.0
    bookie_urls: Tuple[str, ...] = ()
    bookie_timeout_seconds: float = 10.0
    s3_endpoint_url: Optional[str] = None
    s3_region: Optional[str] = None
    s3_bucket: Optional[str] = None
    s3_allowed_buckets: Tuple[str, ...] = ()
    s3_require_owner_metadata: bool = True
    s3_credentials: Dict[str, str] = field(default_factory=dict)
    filesystem_base_path: Optional[str] = None
    bucket_snapshot_hooks: Optional[str] = None
    trusted_registry_max_size: int = 100000
    raw: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_user_config(
        cls, user_config: Optional[Mapping[str, Any]], get_secret: Optional[Callable[[str], Any]] = None
    ) -> "DeletionConfig":
        """Validate a userConfig map; ValueError names the offending key."""
        given = dict(user_config or {})
        unknown = sorted(set(given) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown ledger-deletion userConfig keys {unknown}; valid keys: {sorted(DEFAULTS)}")
        cfg = {**DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
        topics = DeletionTopics(
            namespace=str(cfg["deletionNamespace"]),
            topic_name=str(cfg["deletionTopicName"]),
            parallelism=_int(cfg, "ledgerDeletionParallelism", 1),
            scope=str(cfg["deletionTopicScope"]),
            tenant_namespace=str(cfg["tenantDeletionNamespace"]),
        )
        backend = str(cfg["delayBackend"])
        if backend not in ("broker", "scheduler"):
            raise ValueError(f"delayBackend must be 'broker' or 'scheduler', got {backend!r}")
        sched = cfg["schedulingTopic"]
        if backend == "scheduler" and not sched:
            raise ValueError("delayBackend 'scheduler' needs schedulingTopic (the BucketSnapshotWriter's input topic)")
        if sched and not str(sched).startswith(("persistent://", "non-persistent://")):
            raise ValueError(f"schedulingTopic must be fully qualified (persistent://...), got {sched!r}")

        def secret(key: str) -> Optional[str]:
            name = cfg[key]
            if not name:
                return None
            if get_secret is None:
                raise ValueError(f"{key} names secret {name!r} but no secrets are available")
            value = get_secret(name)
            if value is None:
                raise ValueError(f"{key}: secret {name!r} is not set")
            return str(value)

        creds: Dict[str, str] = {}
        ak, sk = secret("s3AccessKeyIdSecret"), secret("s3SecretAccessKeySecret")
        if (ak is None) != (sk is None):
            raise ValueError("s3AccessKeyIdSecret and s3SecretAccessKeySecret must be given together")
        if ak is not None and sk is not None:
            creds = {"aws_access_key_id": ak, "aws_secret_access_key": sk}
        allowed = cfg["s3AllowedBuckets"] or []
        if isinstance(allowed, str):
            allowed = [b.strip() for b in allowed.split(",") if b.strip()]
        hooks = cfg["bucketSnapshotHooks"]
        if hooks is not None and (not isinstance(hooks, str) or ":" not in hooks):
            raise ValueError(f"bucketSnapshotHooks must be 'module:callable', got {hooks!r}")
        return cls(
            topics=topics,
            enabled=_bool(cfg, "twoPhaseDeletionEnabled"),
            send_delay_seconds=_int(cfg, "sendDelaySeconds", 0),
            reconsume_later_seconds=_int(cfg, "reconsumeLaterSeconds", 0),
            max_redeliver_count=_int(cfg, "maxRedeliverCount", 1),
            ledgers_cache_ttl_seconds=_int(cfg, "ledgersCacheTtlSeconds", 1),
            delay_backend=backend,
            scheduling_topic=str(sched) if sched else None,
            admin_urls=tuple(_urls(cfg["pulsarAdminUrl"], "pulsarAdminUrl")),
            admin_token=secret("adminTokenSecret"),
            admin_timeout_seconds=float(_int(cfg, "adminTimeoutSeconds", 1)),
            bookie_urls=tuple(_urls(cfg["bookieHttpUrls"], "bookieHttpUrls")),
            bookie_timeout_seconds=float(_int(cfg, "bookieTimeoutSeconds", 1)),
            s3_endpoint_url=cfg["s3EndpointUrl"],
            s3_region=cfg["s3Region"],
            s3_bucket=cfg["s3Bucket"],
            s3_allowed_buckets=tuple(str(b) for b in allowed),
            s3_require_owner_metadata=_bool(cfg, "s3RequireOwnerMetadata"),
            s3_credentials=creds,
            filesystem_base_path=cfg["fileSystemBasePath"],
            bucket_snapshot_hooks=hooks,
            trusted_registry_max_size=_int(cfg, "trustedRegistryMaxSize", 1),
            raw=given,
        )
