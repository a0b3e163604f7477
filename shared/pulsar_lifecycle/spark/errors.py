"""Errors of the offline Spark pipeline, under the package root PulsarLifecycleError."""
from __future__ import annotations

from ..exceptions import PulsarLifecycleError

__all__ = ["ListingError", "ScanStateError", "SparkJobError", "SparkSetupError"]


class SparkSetupError(PulsarLifecycleError, RuntimeError):
    """Spark cannot start here: Java or PySpark missing or too old (the message says which and how to fix)."""


class SparkJobError(PulsarLifecycleError, RuntimeError):
    """A Spark job was given bad input or found its output inconsistent (the message names the problem)."""


class ListingError(PulsarLifecycleError, RuntimeError):
    """A listing or in-use source failed or may be incomplete: the whole audit must stop."""


class ScanStateError(PulsarLifecycleError, RuntimeError):
    """The scan-state directory cannot be written or holds a damaged record."""
