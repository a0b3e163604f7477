"""What a running `up` runs: `<data-dir>/up-functions.json`, written once everything started and
removed when it stops.

`up` runs some configs with changes for the machine (on the embedded broker the deletion worker
has no admin REST or bookie URLs); a command that needs the terms of a running function (e.g.
`deletion enqueue`: the worker's delay backend and what it can delete) reads them here instead of
from the config file, when the manifest names the broker the command talks to.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

log = logging.getLogger(__name__)

MANIFEST_NAME = "up-functions.json"


@dataclass(frozen=True)
class RunningFunction:
    """One function as `up` runs it."""

    name: str
    class_name: str
    config: str  # the config file it came from
    user_config: Dict[str, Any]
    embedded: bool  # on up's embedded broker (pulsar-lite)


def write_manifest(data_dir: Path, service_url: str, embedded: bool, plans: Iterable[Any]) -> Path:
    """Write the manifest of `plans` (FunctionPlan: path, spec) atomically; returns its path."""
    path = Path(data_dir) / MANIFEST_NAME
    doc = {"broker": service_url, "embedded": embedded,
           "functions": [{"name": p.spec.name, "className": p.spec.class_name, "config": str(p.path),
                          "userConfig": dict(p.spec.user_config or {})} for p in plans]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)
    return path


def remove_manifest(data_dir: Path) -> None:
    """Remove the manifest (nothing runs any more); missing is fine."""
    try:
        (Path(data_dir) / MANIFEST_NAME).unlink()
    except FileNotFoundError:
        pass


def running_function(data_dir: Path, service_url: str, class_name: str) -> Optional[RunningFunction]:
    """The function of `class_name` a running `up` with `data_dir` runs on `service_url`, or None
    (no manifest, another broker's, none of that class, unreadable)."""
    path = Path(data_dir) / MANIFEST_NAME
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("event=up_manifest_unreadable path=%s error=%r", path, exc)
        return None
    if not isinstance(doc, dict) or doc.get("broker") != service_url:
        return None
    for fn in doc.get("functions") or []:
        if isinstance(fn, dict) and fn.get("className") == class_name:
            return RunningFunction(str(fn.get("name")), class_name, str(fn.get("config")),
                                   dict(fn.get("userConfig") or {}), bool(doc.get("embedded")))
    return None
