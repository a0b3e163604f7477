"""Building the function package (`pulsar-lifecycle package`): one zip with the library and its
dependencies for Pulsar's Python runtime (`zip_builder`)."""
from __future__ import annotations

__all__ = ["zip_builder"]
