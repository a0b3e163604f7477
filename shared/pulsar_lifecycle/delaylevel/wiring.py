"""Wiring DelayLevelSyncer from its Context: config, state, admin view, service."""
from __future__ import annotations

from typing import Any

from ..runtime.context_api import pulsar_client
from ..scheduler.context_state import ContextStateStore
from .admin import AdminView
from .config import parse_syncer_config
from .service import DelayLevelSyncerService

__all__ = ["build_syncer"]


def build_syncer(context: Any) -> DelayLevelSyncerService:
    """Everything the function needs, built from userConfig and the function's identity; started."""
    cfg = parse_syncer_config(dict(context.get_user_config_map() or {}))
    fqfn = f"{context.get_function_tenant()}/{context.get_function_namespace()}/{context.get_function_name()}"
    instance = context.get_instance_id()
    admin = AdminView.connect(cfg.pulsar_admin_url, cfg.target_cache_seconds) if cfg.pulsar_admin_url else None
    service = DelayLevelSyncerService(
        cfg, pulsar_client(context), subscription=cfg.subscription or fqfn,
        producer_prefix=cfg.producer_name or f"{fqfn}-{instance}",
        state=ContextStateStore(context, prefix=f"dl/{instance}/"),
        record_metric=context.record_metric, admin=admin, instance=instance)
    return service.start()
