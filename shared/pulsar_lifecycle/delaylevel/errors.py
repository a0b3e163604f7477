"""Errors of the delay-level package."""
from __future__ import annotations
from ..exceptions import PulsarLifecycleError


class DelayLevelError(PulsarLifecycleError):
    """Base of the errors this package raises on purpose."""


class ConfigError(DelayLevelError, ValueError):
    """A setting is invalid; the message names the key and the value."""


class StrategyError(ConfigError):
    """An unreasonable strategy: too many partitions, a bad unit or maximum."""


class DelayTooLongError(DelayLevelError, ValueError):
    """A delay above the strategy's maximum (never silently dropped or clamped)."""


class ShrinkRefusedError(DelayLevelError):
    """Fewer partitions were configured while a removed partition still holds parked messages."""


class ParkedMessageError(DelayLevelError, ValueError):
    """A parked message lacks, or has a malformed, delay-level property."""
