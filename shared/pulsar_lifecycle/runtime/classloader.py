"""Resolving `className` exactly as Pulsar's Python runtime (util.import_class) does."""
from __future__ import annotations

import importlib
from typing import Any

from ..exceptions import PulsarLifecycleError


class ClassLoadError(PulsarLifecycleError, RuntimeError):
    """The configured className could not be imported or instantiated."""


def import_class(name: str) -> Any:
    """`module.Class` -> the class; no dot -> the module; `serde.X` -> pulsar.functions.serde.X."""
    if "." not in name:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            raise ClassLoadError(f"could not import module {name!r}: {exc}") from exc
    module_name, attr = name.rsplit(".", 1)
    if module_name == "serde":
        module_name = "pulsar.functions.serde"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ClassLoadError(f"could not import module {module_name!r} for className {name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ClassLoadError(f"module {module_name!r} has no attribute {attr!r} (className {name!r})") from exc


def instantiate_function(name: str) -> Any:
    """Build the user function like the runtime: `Class()` with no arguments.

    The stock runtime silently falls back to calling `Class.process(input)` when `__init__`
    raises; we fail loudly instead, since that fallback only ever produces TypeErrors.
    """
    kls = import_class(name)
    if not isinstance(kls, type):
        return kls  # a module with a top-level process(input): "pure function" mode
    try:
        return kls()
    except Exception as exc:
        raise ClassLoadError(f"{name}() raised {exc!r}; Pulsar would silently fall back to pure-function mode") from exc
