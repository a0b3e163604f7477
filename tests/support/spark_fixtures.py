"""The one SparkSession of a test run (local[2]), registered by conftest.py.

Spark costs about 10 s to start and about 1 s to stop, and its JVM outlives stop(): one session
for the whole test session (reference/pyspark-on-this-machine.md).
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession shared by every Spark test (PySpark and Java 17+ are required:
    the `test` extra installs PySpark, scripts/setup.sh a JRE)."""
    from pulsar_lifecycle.spark.session import get_spark

    session = get_spark("local[2]", "pulsar-lifecycle-tests", **{
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
    })
    yield session
    session.stop()


def backlog_rows(ledgers: dict, base_ms: int, spread_ms: int, seed: int = 1, topic: str = "persistent://public/default/s",
                 partition: int = -1) -> list:
    """Export rows (backlog.EXPORT_SCHEMA) for {ledger id: message count}: deliver-at times
    spread over `spread_ms` after `base_ms` (with repeats), payload/key/properties varying."""
    import random

    from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

    rnd = random.Random(seed)
    rows = []
    for ledger, count in ledgers.items():
        for entry in range(count):
            at = base_ms + rnd.randrange(spread_ms) // 7 * 7  # coarse: equal timestamps happen
            props = {DELIVER_AT_PROP: str(at), "n": str(entry)}
            rows.append({"ledger_id": ledger, "entry_id": entry, "batch_index": -1, "partition": partition,
                         "deliver_at": at, "payload": f"m-{ledger}-{entry}".encode(),
                         "key": f"k{entry % 5}" if entry % 3 else None, "properties": list(props.items()),
                         "event_time": 1000 + entry if entry % 2 else 0, "target": None,
                         "publish_time": base_ms, "topic": topic})
    return rows


def write_backlog(directory, rows: list, per_file: int = 1000) -> list:
    """Rows as Parquet files (what export-backlog writes) under `directory`; returns the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pulsar_lifecycle.spark.backlog import EXPORT_SCHEMA

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(0, len(rows), per_file):
        path = directory / f"part-{i // per_file:06d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[i:i + per_file], schema=EXPORT_SCHEMA), path)
        paths.append(str(path))
    return paths
