"""The userConfig keys each shipped function understands (used by `validate` and the docs test)."""
from __future__ import annotations

from typing import Collection, Dict

from .deletion.config import DEFAULTS as DELETION_DEFAULTS
from .scheduler.config import all_user_config_keys

USER_CONFIG_KEYS: Dict[str, Collection[str]] = {
    "example_function.ExampleFunction": ("prefix", "countProcessed"),
    "bucket_snapshot_writer.BucketSnapshotWriter": tuple(all_user_config_keys()),
    "ledger_deletion_worker.LedgerDeletionWorker": tuple(sorted(DELETION_DEFAULTS)),
}
