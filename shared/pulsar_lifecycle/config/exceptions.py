"""Errors of the config package."""
from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A userConfig value or key is invalid; the message names the key and the value."""
