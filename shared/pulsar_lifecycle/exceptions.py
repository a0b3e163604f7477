"""The root of the errors this package raises on purpose (STYLE §8).

The CLI turns a PulsarLifecycleError into one line on stderr and exit status 1.
"""
from __future__ import annotations

__all__ = ["PulsarLifecycleError"]


class PulsarLifecycleError(Exception):
    """Base of every error this package raises on purpose."""
