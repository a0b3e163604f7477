"""Errors of the offline Spark pipeline."""
from __future__ import annotations


class SparkSetupError(RuntimeError):
    """Spark cannot start here: Java or PySpark missing or too old (the message says which and how to fix)."""


class SparkJobError(RuntimeError):
    """A Spark job was given bad input or found its output inconsistent (the message names the problem)."""
