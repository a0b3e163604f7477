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
