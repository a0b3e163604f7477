"""Wiring DelayLevelSyncer from its Context: config, state, admin view, service."""
from __future__ import annotations

import logging
from typing import Any

from ..runtime.context_api import num_instances, pulsar_client
from ..scheduler.context_state import ContextStateStore
from .admin import AdminView
from .config import parse_syncer_config
from .permissions import syncer_admin_token, syncer_target_check
from .service import DelayLevelSyncerService

__all__ = ["build_syncer"]

log = logging.getLogger(__name__)


def build_syncer(context: Any) -> DelayLevelSyncerService:
    """Everything the function needs, built from userConfig and the function's identity; started."""
    cfg = parse_syncer_config(dict(context.get_user_config_map() or {}))
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    instance = int(context.get_instance_id())
    count = num_instances(context)  # the runtime's parallelism; userConfig `instances` is not needed
    if cfg.instances not in (1, count):
        log.warning("event=delay_level_instances_ignored configured=%d runtime=%d reason='the instance count "
                    "comes from the Context (FunctionDetails.parallelism)'", cfg.instances, count)
    # targetPermissionCheck (docs/security.md): before forwarding a parked message to its target X,
    # every role that may produce to the delay-level topic must be one that may produce to X.
    target_check = syncer_target_check(cfg, context)
    token = syncer_admin_token(cfg, context)  # also sent with the existence, retention and backlog reads
    admin = AdminView.connect(cfg.pulsar_admin_url, cfg.target_cache_seconds, token=token) if cfg.pulsar_admin_url else None
    # Forward publishers and their dedup snapshots are named per PARTITION, never per instance:
    # whichever instance owns partition k after a parallelism change or a restart elsewhere
    # publishes as `<prefix>-p<k>` and finds that publisher's snapshot in the function's state
    # (shared by its instances), so a redelivered parked message is recognised as forwarded.
    # The "-0" / "dl/0/" are the single-instance layout's names, kept so that an existing
    # deployment's dedup history carries over.
    service = DelayLevelSyncerService(
        cfg, pulsar_client(context), subscription=cfg.subscription or fqfn,
        producer_prefix=cfg.producer_name or f"{fqfn}-0",
        state=ContextStateStore(context, prefix="dl/0/"),
        record_metric=context.record_metric, admin=admin, instance=instance,
        num_instances=count, target_check=target_check)
    return service.start()
