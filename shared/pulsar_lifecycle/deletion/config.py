"""userConfig of the LedgerDeletionWorker and of the phase-one service, declared once as
DeletionConfig fields (config/settings.py: one converter per type, unknown keys refused, since a
typo would otherwise silently fall back to a default, e.g. a mistyped TTL).

Behaviour behind each key is in docs/deletion.md; the table in docs/configuration.md is generated
from these fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..config.settings import (
    ConfigError,
    check_settings,
    parse_settings,
    setting,
    to_str,
    to_str_list,
    user_config_keys,
)
from ..config.system import FOR_OPERATORS, FunctionTopology, Write, config_inputs, function_name
from ..topics import FULL_NAME_PREFIXES
from .topics import SCOPES, DeletionTopics

FUNCTION = "LedgerDeletionWorker"
_TOPICS = DeletionTopics()  # the topic defaults are declared once, in DeletionTopics


def to_http_urls(key: str, value: Any) -> Tuple[str, ...]:
    """A URL, a comma-separated string or a list of http(s) URLs (the shared list converter)."""
    urls = to_str_list(key, value)
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"userConfig {key}: {url!r} is not an http(s) URL")
    return urls


@dataclass(frozen=True)
class DeletionConfig:
    """Validated settings shared by the worker (phase two) and the service (phase one).

    One field per userConfig key; `topics`, `admin_token`, `s3_credentials` and `raw` are derived
    (the topic names, the secrets' values, the userConfig as given for the snapshot hooks).
    """

    enabled: bool = setting("twoPhaseDeletionEnabled", True, "When false, the service refuses to append (PIP name).")
    deletion_namespace: str = setting("deletionNamespace", _TOPICS.namespace,
                                      "Namespace of the deletion topics (cluster scope).")
    deletion_topic_name: str = setting("deletionTopicName", _TOPICS.topic_name,
                                       "Base name; `-RETRY`, `-DLQ` and `-partition-<k>` are derived from it.")
    ledger_deletion_parallelism: int = setting(
        "ledgerDeletionParallelism", _TOPICS.parallelism,
        "Partitions of the deletion and RETRY topics (the worker's `inputs` must list them all).", minimum=1)
    deletion_topic_scope: str = setting(
        "deletionTopicScope", _TOPICS.scope,
        "`cluster`: one set of topics; `tenant`: per-tenant topics plus cross-tenant refusal.",
        choices=SCOPES)
    tenant_deletion_namespace: str = setting(
        "tenantDeletionNamespace", _TOPICS.tenant_namespace, "Namespace, inside each tenant, of its deletion topics (tenant scope).")
    send_delay_seconds: int = setting("sendDelaySeconds", 60,
                                      "Phase-one delivery delay (service side; 0 sends at once).", minimum=0)
    reconsume_later_seconds: int = setting("reconsumeLaterSeconds", 600, "Delay of a retry.", minimum=0)
    max_redeliver_count: int = setting(
        "maxRedeliverCount", 10, "Retries before the DLQ (`RECONSUMETIMES` above this goes to the DLQ).", minimum=1)
    ledgers_cache_ttl_seconds: int = setting("ledgersCacheTtlSeconds", 600, "ledgersCache expire-after-write TTL.",
                                             minimum=1)
    max_deletions_in_flight: int = setting(
        "maxDeletionsInFlight", 8,
        "Deletions one worker instance runs at once, never two of one ledger; each request is acked once its "
        "outcome is durable. 1 = one at a time ([deletion.md](deletion.md#deletions-in-flight)).",
        minimum=1, maximum=64)
    delay_backend: str = setting("delayBackend", "scheduler",
                                 "`broker` (deliver_at) or `scheduler` (the BucketSnapshotWriter).",
                                 choices=("broker", "scheduler"))
    scheduling_topic: Optional[str] = setting(
        "schedulingTopic", None,
        "The scheduler's input topic (fully qualified); required with the scheduler backend.", convert=to_str)
    admin_urls: Tuple[str, ...] = setting(
        "pulsarAdminUrl", (),
        "Admin REST URL(s), comma-separated or a list, tried in turn; needed for the in-use check.",
        convert=to_http_urls)
    admin_token_secret: Optional[str] = setting(
        "adminTokenSecret", None, "Name of a function secret holding a Bearer token for the admin API.",
        convert=to_str)
    admin_timeout_seconds: int = setting("adminTimeoutSeconds", 10, "Admin HTTP timeout.", minimum=1)
    bookie_urls: Tuple[str, ...] = setting(
        "bookieHttpUrls", (),
        "Bookie HTTP admin URL(s) (Pulsar's bookkeeper.conf uses port 8000); enables LEDGER deletion.",
        convert=to_http_urls)
    bookie_timeout_seconds: int = setting("bookieTimeoutSeconds", 10, "Bookie HTTP timeout.", minimum=1)
    s3_endpoint_url: Optional[str] = setting("s3EndpointUrl", None, "S3-compatible endpoint (omit for AWS).",
                                             convert=to_str)
    s3_region: Optional[str] = setting("s3Region", None, "S3 region (boto3's default: `us-east-1`).", convert=to_str)
    s3_bucket: Optional[str] = setting(
        "s3Bucket", None, "Default offload bucket (used when the driver metadata names none).", convert=to_str)
    s3_allowed_buckets: Tuple[str, ...] = setting(
        "s3AllowedBuckets", (),
        "Buckets this worker may touch (default: only `s3Bucket`); others go to the DLQ.", convert=to_str_list)
    s3_require_owner_metadata: bool = setting(
        "s3RequireOwnerMetadata", True,
        "When true, objects without `ManagedLedgerName` metadata go to the DLQ (UNVERIFIABLE); when false they "
        "are trusted.")
    s3_access_key_id_secret: Optional[str] = setting(
        "s3AccessKeyIdSecret", None,
        "Name of a function secret with the S3 access key id (with `s3SecretAccessKeySecret`; otherwise boto3's "
        "default chain).", convert=to_str)
    s3_secret_access_key_secret: Optional[str] = setting(
        "s3SecretAccessKeySecret", None,
        "Name of a function secret with the S3 secret access key (with `s3AccessKeyIdSecret`).", convert=to_str)
    filesystem_base_path: Optional[str] = setting(
        "fileSystemBasePath", None,
        "The filesystem offloader's `storageBasePath`; enables filesystem offload deletion.", convert=to_str)
    bucket_snapshot_hooks: Optional[str] = setting(
        "bucketSnapshotHooks", None,
        "`module:factory` for DELAYED_INDEX_BUCKET requests; "
        "`pulsar_lifecycle.scheduler.snapshot_deletion:snapshot_hooks` serves a BucketSnapshotWriter's directory "
        "or BookKeeper table-service store.", convert=to_str)
    bucket_snapshot_dir: Optional[str] = setting(
        "bucketSnapshotDir", None,
        "The BucketSnapshotWriter's `snapshotDir`, read by `snapshot_hooks` (in use = listed in its bucket "
        "manifest).", convert=to_str)
    bucket_snapshot_storage_service_url: Optional[str] = setting(
        "bucketSnapshotStorageServiceUrl", None,
        "The writer's `snapshotStorageServiceUrl` (`bk://host:port`) when it uses `snapshotStorage: bookkeeper`; "
        "read by `snapshot_hooks`.", convert=to_str)
    bucket_snapshot_writer: Optional[str] = setting(
        "bucketSnapshotWriter", None,
        "`<tenant>/<namespace>/<name>` of that writer (its table is `<name>_buckets`); with "
        "`bucketSnapshotStorageServiceUrl`.", convert=to_str)
    trusted_registry_max_size: int = setting("trustedRegistryMaxSize", 100000,
                                             "Bound of the trusted-id registry (service side).", minimum=1)
    # Derived, not userConfig keys.
    topics: DeletionTopics = field(init=False, compare=False)
    admin_token: Optional[str] = None
    s3_credentials: Dict[str, str] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_settings(self)
        object.__setattr__(self, "topics", DeletionTopics(
            namespace=self.deletion_namespace, topic_name=self.deletion_topic_name,
            parallelism=self.ledger_deletion_parallelism, scope=self.deletion_topic_scope,
            tenant_namespace=self.tenant_deletion_namespace))
        if self.delay_backend == "scheduler" and not self.scheduling_topic:
            raise ConfigError("delayBackend 'scheduler' needs schedulingTopic (the BucketSnapshotWriter's input topic)")
        if self.scheduling_topic and not self.scheduling_topic.startswith(FULL_NAME_PREFIXES):
            raise ConfigError(f"schedulingTopic must be fully qualified (persistent://...), got {self.scheduling_topic!r}")
        if (self.s3_access_key_id_secret is None) != (self.s3_secret_access_key_secret is None):
            raise ConfigError("s3AccessKeyIdSecret and s3SecretAccessKeySecret must be given together")
        hooks = self.bucket_snapshot_hooks
        if hooks is not None and ":" not in hooks:
            raise ConfigError(f"bucketSnapshotHooks must be 'module:callable', got {hooks!r}")

    @classmethod
    def from_user_config(
        cls, user_config: Optional[Mapping[str, Any]], get_secret: Optional[Callable[[str], Any]] = None
    ) -> "DeletionConfig":
        """Validate a userConfig map and resolve the secrets it names; ConfigError names the key."""
        given = dict(user_config or {})
        config = parse_settings(cls, given, function=FUNCTION, extra={"raw": given})

        def secret(key: str, name: Optional[str]) -> Optional[str]:
            if not name:
                return None
            if get_secret is None:
                raise ConfigError(f"{key} names secret {name!r} but no secrets are available")
            value = get_secret(name)
            if value is None:
                raise ConfigError(f"{key}: secret {name!r} is not set")
            return str(value)

        ak = secret("s3AccessKeyIdSecret", config.s3_access_key_id_secret)
        sk = secret("s3SecretAccessKeySecret", config.s3_secret_access_key_secret)
        creds = {"aws_access_key_id": ak, "aws_secret_access_key": sk} if ak is not None and sk is not None else {}
        return replace(config, admin_token=secret("adminTokenSecret", config.admin_token_secret), s3_credentials=creds)


def all_user_config_keys() -> List[str]:
    """Every userConfig key LedgerDeletionWorker (and the phase-one service) understands."""
    return user_config_keys(DeletionConfig)


def worker_topology(cfg: Mapping[str, Any], source: str) -> FunctionTopology:
    """What a LedgerDeletionWorker config reads and writes (`validate --system`): its retries and
    phase one's requests (sendDelaySeconds, sent by the services that enqueue with this config)
    to the deletion and RETRY partitions of each tenant its inputs name, delayed through
    `schedulingTopic` with the scheduler backend, and dead letters to the DLQ."""
    raw = cfg.get("userConfig")
    config = DeletionConfig.from_user_config(raw if isinstance(raw, Mapping) else {}, lambda name: "(offline)")
    topics = config.topics
    inputs = config_inputs(cfg)
    tenants: List[Optional[str]] = [None]
    if topics.scope == "tenant":
        tenants = []
        for topic in inputs:
            try:
                tenants.append(topics.classify(topic).tenant)
            except ValueError:
                continue  # not a deletion topic: reported by the reads check if it matters
        tenants = list(dict.fromkeys(tenants))
    via = (config.scheduling_topic or "") if config.delay_backend == "scheduler" else ""
    writes: List[Write] = []
    for tenant in tenants:
        writes += [Write("retries (reconsumeLaterSeconds)", topics.retry_partition(k, tenant),
                         via=via if config.reconsume_later_seconds > 0 else "") for k in range(topics.parallelism)]
        writes += [Write("phase one's requests (sendDelaySeconds)", topics.deletion_partition(k, tenant),
                         via=via if config.send_delay_seconds > 0 else "") for k in range(topics.parallelism)]
        writes.append(Write("dead letters", topics.dlq_topic(tenant), FOR_OPERATORS))
    return FunctionTopology(source, function_name(cfg), inputs, tuple(writes))
