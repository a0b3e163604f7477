"""Ledger storage backends of the deletion worker, one module per backend: BookKeeper through the
bookie HTTP admin API (`bookie_http`), S3-compatible tiered storage (`s3`), the filesystem
offloader (`filesystem`) and the bucket scheduler's snapshot store (`snapshot`); `http` is their
JSON-over-HTTP helper. The contract they implement is `deletion.ports.LedgerStorage`.

Nothing is imported eagerly: boto3 costs ~0.5 s and only the S3 backend needs it.
"""
from __future__ import annotations

__all__ = ["bookie_http", "filesystem", "http", "s3", "snapshot"]
