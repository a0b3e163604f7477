"""The userConfig keys each shipped function understands, and its extra config checks (used by
`validate` and the docs test)."""
from __future__ import annotations

from typing import Any, Callable, Collection, Dict, List, Mapping

from .delaylevel.config import all_user_config_keys as syncer_user_config_keys
from .delaylevel.config import check_function_config as check_syncer_config
from .deletion.config import DEFAULTS as DELETION_DEFAULTS
from .scheduler.config import all_user_config_keys, check_function_config

USER_CONFIG_KEYS: Dict[str, Collection[str]] = {
    "example_function.ExampleFunction": ("prefix", "countProcessed"),
    "bucket_snapshot_writer.BucketSnapshotWriter": tuple(all_user_config_keys()),
    "ledger_deletion_worker.LedgerDeletionWorker": tuple(sorted(DELETION_DEFAULTS)),
    "delay_level_syncer.DelayLevelSyncer": tuple(syncer_user_config_keys()),
}

#: className -> extra checks `validate` runs on a config of that class (one message per problem).
FUNCTION_CHECKS: Dict[str, Callable[[Mapping[str, Any]], List[str]]] = {
    "bucket_snapshot_writer.BucketSnapshotWriter": check_function_config,
    "delay_level_syncer.DelayLevelSyncer": check_syncer_config,
}
