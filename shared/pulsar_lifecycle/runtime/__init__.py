"""Running functions without a Pulsar cluster, and the seam to Pulsar's own runtime.

Seam (used by the functions, layer 1): `context_api` (the subset of pulsar.Context the package
uses), `client`, `metrics`, `classloader`. Entry points (layer 7): `broker` (the embedded
broker), `localrun` (local run mode), `context` (LocalContext), `instance`. Nothing is imported
here eagerly: pulsar-client and pulsar-lite load with the module that needs them.
"""
from __future__ import annotations

__all__ = ["broker", "classloader", "client", "context", "context_api", "instance", "localrun", "metrics"]
