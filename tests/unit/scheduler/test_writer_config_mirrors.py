"""The writer's snapshotDeletion* keys mirror the LedgerDeletionWorker's: same defaults.

scheduler/config.py writes those defaults beside the worker's instead of importing the deletion
package (it is not on a writer's start path); this keeps the two from drifting apart.
"""
from __future__ import annotations

from dataclasses import fields

from pulsar_lifecycle.deletion.config import DeletionConfig
from pulsar_lifecycle.scheduler.config import WriterConfig

MIRRORS = {
    "snapshot_deletion_namespace": "deletion_namespace",
    "snapshot_deletion_topic_name": "deletion_topic_name",
    "snapshot_deletion_parallelism": "ledger_deletion_parallelism",
    "snapshot_deletion_send_delay_seconds": "send_delay_seconds",
}


def test_snapshot_deletion_defaults_are_the_workers() -> None:
    writer = {f.name: f.default for f in fields(WriterConfig)}
    worker = {f.name: f.default for f in fields(DeletionConfig)}
    assert {w: writer[w] for w in MIRRORS} == {w: worker[d] for w, d in MIRRORS.items()}
