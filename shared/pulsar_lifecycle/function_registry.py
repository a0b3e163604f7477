"""The shipped functions: their config classes (the userConfig keys each understands) and their
extra config checks (used by `validate`, the docs generator and the docs test)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Tuple

from .bucket.config import BucketConfig
from .config.settings import settings_of, user_config_keys
from .delaylevel.config import SyncerConfig
from .delaylevel.config import check_function_config as check_syncer_config
from .deletion.config import DeletionConfig
from .example import ExampleConfig
from .scheduler.config import WriterConfig, check_function_config

FunctionCheck = Callable[[Mapping[str, Any]], List[str]]


def _known(cfg: Mapping[str, Any], *classes: type) -> Dict[str, Any]:
    user = cfg.get("userConfig") if isinstance(cfg.get("userConfig"), Mapping) else {}
    keys = {k for cls in classes for k in settings_of(cls)}
    return {k: v for k, v in user.items() if k in keys}


def check_example_config(cfg: Mapping[str, Any]) -> List[str]:
    """The values of an ExampleFunction config's known userConfig keys."""
    try:
        ExampleConfig.from_user_config(_known(cfg, ExampleConfig))
    except ValueError as exc:
        return [str(exc)]
    return []


def check_deletion_config(cfg: Mapping[str, Any]) -> List[str]:
    """The values of a LedgerDeletionWorker config's known userConfig keys (secrets are named,
    not read, offline: any name passes)."""
    try:
        DeletionConfig.from_user_config(_known(cfg, DeletionConfig), lambda name: "(offline)")
    except ValueError as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True)
class FunctionEntry:
    """One shipped function: entry class, config classes (in docs order) and its `validate` check."""

    class_name: str
    configs: Tuple[type, ...]
    check: Optional[FunctionCheck] = None

    @property
    def title(self) -> str:
        """The entry class's name (the docs section title)."""
        return self.class_name.rsplit(".", 1)[-1]


FUNCTIONS: Tuple[FunctionEntry, ...] = (
    FunctionEntry("example_function.ExampleFunction", (ExampleConfig,), check_example_config),
    FunctionEntry("bucket_snapshot_writer.BucketSnapshotWriter", (WriterConfig, BucketConfig), check_function_config),
    FunctionEntry("ledger_deletion_worker.LedgerDeletionWorker", (DeletionConfig,), check_deletion_config),
    FunctionEntry("delay_level_syncer.DelayLevelSyncer", (SyncerConfig,), check_syncer_config),
)

USER_CONFIG_KEYS: Dict[str, Collection[str]] = {
    entry.class_name: tuple(user_config_keys(*entry.configs)) for entry in FUNCTIONS
}

#: className -> extra checks `validate` runs on a config of that class (one message per problem).
FUNCTION_CHECKS: Dict[str, FunctionCheck] = {entry.class_name: entry.check for entry in FUNCTIONS if entry.check}
