"""Errors of the config package."""
from __future__ import annotations

from ..exceptions import PulsarLifecycleError

__all__ = ["ConfigError", "FunctionConfigError"]


class ConfigError(PulsarLifecycleError, ValueError):
    """A userConfig value or key is invalid; the message names the key and the value."""


class FunctionConfigError(PulsarLifecycleError, ValueError):
    """A function config file cannot be read or is not a YAML mapping."""
