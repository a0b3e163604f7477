"""The userConfig keys each shipped function understands (used by `validate`)."""
from __future__ import annotations

from typing import Collection, Dict

from .scheduler.config import all_user_config_keys

USER_CONFIG_KEYS: Dict[str, Collection[str]] = {
    "example_function.ExampleFunction": ("prefix",),
    "bucket_snapshot_writer.BucketSnapshotWriter": tuple(all_user_config_keys()),
}
