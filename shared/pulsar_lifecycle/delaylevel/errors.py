"""Errors of the delay-level package."""
from __future__ import annotations

from ..config.exceptions import ConfigError
from ..exceptions import PulsarLifecycleError


class DelayLevelError(PulsarLifecycleError):
    """Base of the errors this package raises on purpose."""


# ConfigError (a setting is invalid; the message names the key and the value) is the package-wide
# one of config/exceptions.py, raised by the shared userConfig converters too.
__all__ = ["ConfigError", "DelayLevelError", "DelayTooLongError", "ParkedMessageError", "PartitionRefusedError",
           "ShrinkRefusedError", "StrategyError", "TrailFormatError"]


class StrategyError(DelayLevelError, ConfigError):
    """An unreasonable strategy: too many partitions, a bad unit or maximum."""


class DelayTooLongError(DelayLevelError, ValueError):
    """A delay above the strategy's maximum (never silently dropped or clamped)."""


class ShrinkRefusedError(DelayLevelError):
    """Fewer partitions were configured while a removed partition still holds parked messages."""


class PartitionRefusedError(DelayLevelError):
    """The broker refuses a partition the strategy needs (a partitioned topic with fewer partitions)."""


class ParkedMessageError(DelayLevelError, ValueError):
    """A parked message lacks, or has a malformed, delay-level property."""


class TrailFormatError(DelayLevelError, ValueError):
    """A stored trail that cannot be read (it is rebuilt from the next checkpoint on)."""
