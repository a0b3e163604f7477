"""The shipped functions: their config classes (the userConfig keys each understands) and the
checks `validate` runs on their configs, in general and for where they will run (used by
`validate`, the docs generator and the docs test)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Tuple

from ..bucket.config import BucketConfig
from ..config.example import ExampleConfig
from ..config.settings import settings_of, user_config_keys
from ..config.system import FunctionTopology, generic_topology
from ..delaylevel.config import SyncerConfig, syncer_topology
from ..deletion.config import DeletionConfig, worker_topology
from ..scheduler.config import WriterConfig, check_writer_inputs, writer_topology
from ..scheduler.snapshot_location import location_problems

FunctionCheck = Callable[[Mapping[str, Any]], List[str]]
#: (function config, target) -> problems there; targets in config/targets.py.
TargetCheck = Callable[[Mapping[str, Any], str], List[str]]
#: (function config, its file) -> what it reads, writes and serves (`validate --system`).
Topology = Callable[[Mapping[str, Any], str], FunctionTopology]


def _user_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = cfg.get("userConfig")
    return raw if isinstance(raw, Mapping) else {}


def _writer_target_checks(cfg: Mapping[str, Any], target: str) -> List[str]:
    """Where the writer's bucket index would live on `target` (scheduler/snapshot_location.py)."""
    return location_problems(_user_config(cfg), target)


@dataclass(frozen=True)
class FunctionEntry:
    """One shipped function: entry class, config classes (in docs order), how it builds its
    config from userConfig, and any check of the rest of its function config."""

    class_name: str
    configs: Tuple[type, ...]
    parse: Callable[[Mapping[str, Any]], Any]
    other_checks: Optional[FunctionCheck] = None
    target_checks: Optional[TargetCheck] = None
    topology: Topology = generic_topology

    @property
    def title(self) -> str:
        """The entry class's name (the docs section title)."""
        return self.class_name.rsplit(".", 1)[-1]

    def check(self, cfg: Mapping[str, Any]) -> List[str]:
        """The problems `validate` reports for a config of this function: its known userConfig
        values built as the function builds them (unknown keys are reported by the key check)."""
        user = _user_config(cfg)
        keys = {k for cls in self.configs for k in settings_of(cls)}
        problems: List[str] = []
        try:
            self.parse({k: v for k, v in user.items() if k in keys})
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
        return problems + (self.other_checks(cfg) if self.other_checks else [])


FUNCTIONS: Tuple[FunctionEntry, ...] = (
    FunctionEntry("example_function.ExampleFunction", (ExampleConfig,), ExampleConfig.from_user_config),
    FunctionEntry("bucket_snapshot_writer.BucketSnapshotWriter", (WriterConfig, BucketConfig),
                  WriterConfig.from_user_config, check_writer_inputs, _writer_target_checks, writer_topology),
    # Offline, a secret is only named: any name resolves.
    FunctionEntry("ledger_deletion_worker.LedgerDeletionWorker", (DeletionConfig,),
                  lambda user: DeletionConfig.from_user_config(user, lambda name: "(offline)"),
                  topology=worker_topology),
    FunctionEntry("delay_level_syncer.DelayLevelSyncer", (SyncerConfig,), SyncerConfig.from_user_config,
                  topology=syncer_topology),
)

USER_CONFIG_KEYS: Dict[str, Collection[str]] = {
    entry.class_name: tuple(user_config_keys(*entry.configs)) for entry in FUNCTIONS
}

#: className -> the checks `validate` runs on a config of that class (one message per problem).
FUNCTION_CHECKS: Dict[str, FunctionCheck] = {entry.class_name: entry.check for entry in FUNCTIONS}

#: className -> its checks for a target (what would fail at start-up or on the first message there).
TARGET_CHECKS: Dict[str, TargetCheck] = {
    entry.class_name: entry.target_checks for entry in FUNCTIONS if entry.target_checks is not None
}

_TOPOLOGIES: Dict[str, Topology] = {entry.class_name: entry.topology for entry in FUNCTIONS}


def topology_of(cfg: Mapping[str, Any], source: str) -> FunctionTopology:
    """What a function config reads, writes and serves; a class this package does not ship reads
    its inputs and writes its output. ValueError (ConfigError) when the config cannot say."""
    class_name = cfg.get("className")
    return _TOPOLOGIES.get(class_name if isinstance(class_name, str) else "", generic_topology)(cfg, source)
