"""Where a function config is meant to run: what `pulsar-lifecycle validate --target` judges it for.

* `cluster` (the default): `pulsar-admin functions create` on a cluster, run by Pulsar's own
  Python instance on workers that have function state (`stateStorageServiceUrl` in
  `functions_worker.yml`), with the worker's checks of a Python function config.
* `localrun`: `pulsar-lifecycle localrun`, this package's local run mode (function state and
  the writer's index in `--data-dir` unless told otherwise; no `functions create` checks).
"""
from __future__ import annotations

from typing import Dict, Tuple

__all__ = ["CLUSTER", "LOCALRUN", "TARGETS", "TARGET_MEANINGS"]

CLUSTER = "cluster"
LOCALRUN = "localrun"
TARGETS: Tuple[str, ...] = (CLUSTER, LOCALRUN)
TARGET_MEANINGS: Dict[str, str] = {
    CLUSTER: "pulsar-admin functions create, under Pulsar's Python runtime on workers with function state",
    LOCALRUN: "pulsar-lifecycle localrun",
}
