"""Where BucketSnapshotWriter keeps its bucket index: userConfig `snapshotStorage`, per runtime.

`auto` (the default) keeps the index where the runtime keeps the function's state, because that
is the one durable store every runtime gives a function and the place its dedup state, which must
follow the same index (index_identity.py), already lives:

* under Pulsar's runtime (`functions create`): the BookKeeper table service the worker gave the
  instance for its state (runtime/state_service.py finds it), table `<name>_buckets`. A worker's
  working directory is no place for it: it is neither durable nor kept when the instance moves.
* under `pulsar-lifecycle localrun`: `<--data-dir>/buckets/<tenant>_<namespace>_<name>`, next to
  the local function state, so a restart from another working directory finds the same index.

A set `snapshotDir` (a directory) or `snapshotStorageServiceUrl` (a table service) overrides
that; `directory` and `bookkeeper` name the store outright. `location_problems` is the same
decision made offline, for `pulsar-lifecycle validate`.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from ..config.exceptions import ConfigError
from ..config.settings import read_setting, to_str
from ..config.targets import CLUSTER
from ..runtime.state_service import STATE_URL_ARG, function_state_service
from .config import WriterConfig

AUTO, DIRECTORY, BOOKKEEPER = "auto", "directory", "bookkeeper"


class SnapshotLocationError(ConfigError):
    """The bucket index has no place under this runtime; the message names the userConfig key to set."""


@dataclass(frozen=True)
class SnapshotLocation:
    """The store the index lives in: `directory` at `path`, or `bookkeeper` at `url`."""

    storage: str
    path: Optional[Path] = None
    url: str = ""
    reason: str = ""

    def describe(self) -> str:
        """One line for logs: the store and why it was chosen."""
        where = str(self.path) if self.storage == DIRECTORY else self.url
        return f"storage={self.storage} at={where} reason={self.reason!r}"


def is_local_run(context: Any) -> bool:
    """True under `pulsar-lifecycle localrun`: its context carries the runner's --data-dir."""
    return bool(getattr(context, "data_dir", None))


def _fqfn_table(context: Any) -> str:
    return (f"{context.get_function_tenant()}_{context.get_function_namespace()}_"
            f"{context.get_function_name()}").replace("-", "_")


def default_snapshot_dir(context: Any, per_instance: bool = True) -> Path:
    """`<--data-dir>/buckets/<tenant>_<namespace>_<name>[-instance-<i>]` under the local runner.

    `per_instance=False` (a partitioned scheduling topic): the one directory every instance
    shares, holding one sub-directory per partition. Under Pulsar's own runtime there is none:
    SnapshotLocationError names snapshotDir.
    """
    data_dir = getattr(context, "data_dir", None)
    if not data_dir:
        raise SnapshotLocationError(
            "userConfig snapshotStorage=directory needs snapshotDir under Pulsar's runtime (a worker's working "
            "directory is neither durable nor kept when the instance moves): set snapshotDir to an absolute path "
            "every instance reaches, on durable storage, or remove snapshotStorage (auto) to keep the index on "
            "the table service of the function's state")
    instance = int(context.get_instance_id()) if per_instance else 0
    # Instance 0 keeps the name earlier versions used (`.pulsar-lifecycle/buckets/<table>` = the default data dir).
    table = _fqfn_table(context)
    return Path(data_dir) / "buckets" / (table if instance == 0 else f"{table}-instance-{instance}")


def snapshot_location(cfg: WriterConfig, context: Any, *, per_instance: bool = True,
                      argv: Optional[Sequence[str]] = None) -> SnapshotLocation:
    """Where this instance's index lives (per_instance=False: the partitioned writer's shared root).

    Raises:
        SnapshotLocationError: under Pulsar's runtime, `auto` on a worker without function state
            (naming snapshotStorageServiceUrl and snapshotDir), or `directory` without snapshotDir.
    """
    storage = cfg.snapshot_storage
    if storage == AUTO:
        if cfg.snapshot_dir:
            return SnapshotLocation(DIRECTORY, Path(cfg.snapshot_dir), reason="userConfig snapshotDir")
        if cfg.snapshot_storage_service_url:
            return SnapshotLocation(BOOKKEEPER, url=cfg.snapshot_storage_service_url,
                                    reason="userConfig snapshotStorageServiceUrl")
        if is_local_run(context):
            return SnapshotLocation(DIRECTORY, default_snapshot_dir(context, per_instance),
                                    reason="localrun: next to the function state in --data-dir")
        service = function_state_service(context, argv)
        if service.url is None:
            raise SnapshotLocationError(
                "userConfig snapshotStorage=auto keeps the bucket index on the table service of the function's "
                f"state, and this instance has none ({service.source}): set userConfig snapshotStorageServiceUrl "
                "to a BookKeeper table service (bk://host:4181), or snapshotDir to an absolute path every instance "
                "reaches on durable storage, or give the workers function state (stateStorageServiceUrl in "
                "functions_worker.yml)")
        return SnapshotLocation(BOOKKEEPER, url=service.url, reason=f"function state: {service.source}")
    if storage == BOOKKEEPER:
        return SnapshotLocation(BOOKKEEPER, url=cfg.snapshot_storage_service_url,
                                reason="userConfig snapshotStorageServiceUrl")
    if cfg.snapshot_dir:
        return SnapshotLocation(DIRECTORY, Path(cfg.snapshot_dir), reason="userConfig snapshotDir")
    return SnapshotLocation(DIRECTORY, default_snapshot_dir(context, per_instance),
                            reason="localrun: next to the function state in --data-dir")


def location_problems(user_config: Mapping[str, Any], target: str) -> List[str]:
    """What `snapshot_location` would refuse at the first message on `target`, found offline.

    A bad value of the keys is not reported here: the config class's own check reports it once.
    """
    try:
        storage = read_setting(user_config, "snapshotStorage", to_str, AUTO)
        snapshot_dir = read_setting(user_config, "snapshotDir", to_str, "")
    except ConfigError:
        return []
    if target != CLUSTER:
        return []  # localrun has a default for every snapshotStorage
    if storage == DIRECTORY and not snapshot_dir:
        return ["userConfig snapshotStorage: directory without snapshotDir fails at the first message under "
                "Pulsar's runtime (functions create): set userConfig snapshotDir to an absolute path every instance "
                "reaches on durable storage, or remove snapshotStorage (auto: the index goes to the table service "
                f"the workers keep function state on, passed to each instance as {STATE_URL_ARG})"]
    if storage in (AUTO, DIRECTORY) and snapshot_dir and not posixpath.isabs(snapshot_dir):
        return [f"userConfig snapshotDir {snapshot_dir!r} is relative: under Pulsar's runtime it would resolve "
                "against the instance's working directory on the worker, which is neither durable nor kept when "
                "the instance moves: set an absolute path every instance reaches, on durable storage"]
    return []
