"""The orphan audit's Spark part: listings and in-use sets as DataFrames, one anti-join.

Everything heavy runs on the executors: reading exported lists, the distinct of the in-use ids,
the join of listing against in-use on (id_space, ledger_id), the per-row status, the counts and
writing the candidates. The driver only receives the counts and at most `sample` rows.
Status rules are described in model.py; they are written once, here, as Column expressions.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from pyspark.sql import Column, DataFrame, SparkSession  # this module runs only under Spark
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ...topics import DOMAINS
from ..errors import SparkJobError
from ..failures import spark_step
from ..paths import file_url
from .model import (
    ADMIN_COMPONENTS,
    ANY_NAMESPACE,
    COVERAGE_COLUMNS,
    IN_USE_COLUMNS,
    LEDGER_SPACE,
    LISTING_COLUMNS,
    STATUS_IN_USE,
    STATUS_NEWER,
    STATUS_ORPHAN,
    STATUS_TOO_YOUNG,
    STATUS_UNCOVERED,
    STATUS_UNLABELLED,
    STATUSES,
    Coverage,
)

LISTING_SCHEMA = T.StructType([
    T.StructField("store", T.StringType(), False),
    T.StructField("id_space", T.StringType(), False),
    T.StructField("ledger_id", T.LongType(), False),
    T.StructField("component", T.StringType(), True),
    T.StructField("owner", T.StringType(), True),
    T.StructField("owner_ns", T.StringType(), True),
    T.StructField("detail", T.StringType(), True),
    T.StructField("location", T.StringType(), True),
    T.StructField("created_ms", T.LongType(), True),
])
IN_USE_SCHEMA = T.StructType([
    T.StructField("id_space", T.StringType(), False),
    T.StructField("ledger_id", T.LongType(), False),
    T.StructField("source", T.StringType(), False),
])
COVERAGE_SCHEMA = T.StructType([T.StructField(c, T.StringType(), False) for c in COVERAGE_COLUMNS])
MAX_KNOWN_SCHEMA = T.StructType([T.StructField("id_space", T.StringType(), False),
                                 T.StructField("max_known", T.LongType(), False)])
#: The columns of a scan's candidate files (the listing's plus the status).
CANDIDATE_COLUMNS = LISTING_COLUMNS + ("status",)
#: Rows that identify "the same orphan" across two scans (null-safe).
IDENTITY_COLUMNS = ("store", "id_space", "ledger_id", "detail")


@dataclass(frozen=True)
class AuditRules:
    """The thresholds of one scan (all in ms since the epoch / ms)."""

    now_ms: int
    older_than_ms: int


# -- reading exported lists -----------------------------------------------------------------------
def _read_any(spark: SparkSession, path: str, what: str) -> DataFrame:
    """Parquet, CSV (header) or JSON lines by extension; a directory must carry Spark's _SUCCESS
    marker (no marker: the export may have died half-way, a partial listing)."""
    if not os.path.exists(path):
        raise SparkJobError(f"{what} {path} does not exist")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "_SUCCESS")):
        raise SparkJobError(f"{what} {path} is a directory without _SUCCESS: the export may be incomplete")
    probe = path
    if os.path.isdir(path):
        names = [n for n in os.listdir(path) if not n.startswith(("_", "."))]
        if not names:
            raise SparkJobError(f"{what} {path} holds no data files")
        probe = names[0]
    lower = probe.lower()
    url = file_url(path)  # checked here on the driver's disk: the same file for every executor
    with spark_step(f"cannot read {what} {path}"):
        if lower.endswith((".csv", ".csv.gz")):
            return spark.read.option("header", "true").option("mode", "FAILFAST").csv(url)
        if lower.endswith((".json", ".jsonl", ".ndjson", ".json.gz")):
            return spark.read.option("mode", "FAILFAST").json(url)
        return spark.read.parquet(url)


def _require(df: DataFrame, column: str, what: str, path: str) -> None:
    if column not in df.columns:
        raise SparkJobError(f"{what} {path} has no column {column!r} (columns: {', '.join(df.columns)})")


def _owner_ns(owner: Column) -> Column:
    """tenant/namespace of an owner (same rule as model.namespace_of)."""
    bare = F.regexp_replace(owner, "^(" + "|".join(re.escape(d) for d in DOMAINS) + ")://", "")
    parts = F.split(bare, "/")
    return F.when((F.size(parts) >= 3) & (F.length(parts[0]) > 0) & (F.length(parts[1]) > 0),
                  F.concat_ws("/", parts[0], parts[1]))


def read_listing_file(spark: SparkSession, path: str) -> DataFrame:
    """An exported listing: `ledger_id` required; `store` (default the file), `id_space` (default
    `ledger`), `component`, `owner`, `detail`, `location`, `created_ms` optional. A row without a
    component names no Pulsar component (UNLABELLED); without created_ms its age is unknown."""
    df = _read_any(spark, path, "listing")
    _require(df, "ledger_id", "listing", path)
    cols = set(df.columns)

    def opt(name: str, default: Any, dtype: T.DataType) -> Column:
        return (F.col(name) if name in cols else F.lit(default)).cast(dtype).alias(name)

    out = df.select(
        opt("store", f"export:{os.path.realpath(path)}", T.StringType()),
        opt("id_space", LEDGER_SPACE, T.StringType()),
        F.col("ledger_id").cast(T.LongType()).alias("ledger_id"),
        opt("component", None, T.StringType()),
        opt("owner", None, T.StringType()),
        (F.col("owner_ns").cast(T.StringType()) if "owner_ns" in cols else _owner_ns(opt("owner", None, T.StringType())))
        .alias("owner_ns"),
        opt("detail", None, T.StringType()),
        opt("location", None, T.StringType()),
        opt("created_ms", None, T.LongType()),
    )
    return out


def read_in_use_file(spark: SparkSession, path: str) -> DataFrame:
    """An exported in-use list: `ledger_id` required, `id_space` optional (default `ledger`)."""
    df = _read_any(spark, path, "in-use list")
    _require(df, "ledger_id", "in-use list", path)
    space = F.col("id_space").cast(T.StringType()) if "id_space" in df.columns else F.lit(LEDGER_SPACE)
    return df.select(space.alias("id_space"), F.col("ledger_id").cast(T.LongType()).alias("ledger_id"),
                     F.lit(f"export:{os.path.realpath(path)}").alias("source"))


def check_ids(df: DataFrame, what: str) -> int:
    """Row count; SparkJobError when any ledger id is missing or not a number (a damaged export
    would otherwise drop ledgers from the in-use set silently)."""
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.when(F.col("ledger_id").isNull(), 1).otherwise(0)).alias("bad")
                 ).collect()[0]
    if row["bad"]:
        raise SparkJobError(f"{what}: {row['bad']} row(s) without a numeric ledger_id")
    return int(row["n"])


# -- the audit ------------------------------------------------------------------------------------
def classify(listing: DataFrame, in_use: DataFrame, coverage: Sequence[Coverage],
             max_known: Dict[str, int], rules: AuditRules) -> DataFrame:
    """The listed ledgers NOT in use, each with its `status` (see model.py; IN_USE rows are
    dropped by the anti-join, count them as listed minus these). `max_known` holds newest ids the
    driver's sources know beyond `in_use` itself; the in-use files' own maxima are added here."""
    spark = listing.sparkSession
    keys = ["id_space", "ledger_id"]
    # The anti-join needs no distinct of the in-use side (duplicates cannot multiply rows).
    # A shuffled hash join: no sort of either side (the in-use ids hash well per partition).
    unused = listing.join(in_use.select(*keys).hint("shuffle_hash"), keys, "left_anti")
    newest = in_use.groupBy("id_space").agg(F.max("ledger_id").alias("max_known"))
    if max_known:
        extra = spark.createDataFrame(list(max_known.items()), MAX_KNOWN_SCHEMA)
        newest = newest.unionByName(extra).groupBy("id_space").agg(F.max("max_known").alias("max_known"))
    cov_rows = [c.row() for c in coverage]
    cov_any = spark.createDataFrame([(s, c) for s, c, n in cov_rows if n == ANY_NAMESPACE] or [("", "")],
                                    "id_space string, component string").withColumn("_cov_any", F.lit(True))
    cov_ns = spark.createDataFrame([r for r in cov_rows if r[2] != ANY_NAMESPACE] or [("", "", "")],
                                   "id_space string, component string, owner_ns string").withColumn("_cov_ns", F.lit(True))
    joined = (unused.join(F.broadcast(newest), ["id_space"], "left")
              .join(F.broadcast(cov_any.dropDuplicates(["id_space", "component"])), ["id_space", "component"], "left")
              .join(F.broadcast(cov_ns.dropDuplicates()), ["id_space", "component", "owner_ns"], "left"))
    cutoff = rules.now_ms - rules.older_than_ms
    status = (F.when(F.col("component").isNull(), F.lit(STATUS_UNLABELLED))
              .when(F.col("_cov_any").isNull() & F.col("_cov_ns").isNull(), F.lit(STATUS_UNCOVERED))
              .when(F.col("max_known").isNull() | (F.col("ledger_id") > F.col("max_known")), F.lit(STATUS_NEWER))
              .when(F.col("created_ms").isNull() | (F.col("created_ms") > F.lit(cutoff)), F.lit(STATUS_TOO_YOUNG))
              .otherwise(F.lit(STATUS_ORPHAN)))
    return joined.select(*[F.col(c) for c in LISTING_COLUMNS], status.alias("status"))


def count_statuses(not_in_use: DataFrame, listed: int) -> Dict[str, int]:
    """Listed ledgers per status (every status present, 0 when none); IN_USE = listed - the rest."""
    counts = {s: 0 for s in STATUSES}
    for row in not_in_use.groupBy("status").count().collect():
        counts[row["status"]] = int(row["count"])
    counts[STATUS_IN_USE] = listed - sum(counts.values())
    if counts[STATUS_IN_USE] < 0:
        raise SparkJobError(f"{listed} ledgers listed but {listed - counts[STATUS_IN_USE]} classified: "
                            "the listing changed while it was read")
    return counts


def write_candidates(orphans: DataFrame, path: str) -> None:
    """Write the scan's orphans as Parquet from the executors."""
    orphans.select(*CANDIDATE_COLUMNS).write.mode("errorifexists").parquet(path)


def confirmed(current: DataFrame, previous: DataFrame) -> DataFrame:
    """Current orphans that the previous (confirming) scan also reported: the same store, id
    space, ledger and detail (offload uuid / cursor / bucket key), compared null-safely."""
    cond = [current[c].eqNullSafe(previous[c]) for c in IDENTITY_COLUMNS]
    return current.join(previous.select(*IDENTITY_COLUMNS), cond, "left_semi")


def rows_to_listing(spark: SparkSession, rows: Iterable[Tuple]) -> DataFrame:
    """A listing DataFrame from ListedLedger.row() tuples gathered on the driver."""
    return spark.createDataFrame(list(rows), LISTING_SCHEMA)


def rows_to_in_use(spark: SparkSession, rows: Iterable[Tuple]) -> DataFrame:
    """An in-use DataFrame from InUseSet.rows() tuples gathered on the driver."""
    return spark.createDataFrame(list(rows), IN_USE_SCHEMA)


def union_all(frames: List[DataFrame], empty: DataFrame) -> DataFrame:
    """Union by name (empty frame when there are none)."""
    out = empty
    for df in frames:
        out = out.unionByName(df)
    return out


def default_export_coverage(components: Optional[Sequence[str]] = None) -> List[Coverage]:
    """What an exported in-use list vouches for: the given components (default the admin ones),
    in the `ledger` id space, in every namespace."""
    return [Coverage(LEDGER_SPACE, c) for c in (components or ADMIN_COMPONENTS)]


def collect_sample(df: DataFrame, n: int) -> List[Dict[str, Any]]:
    """Up to n rows as dicts, ordered by ledger id (deterministic reports)."""
    if n <= 0:
        return []
    return [r.asDict() for r in df.orderBy("id_space", "ledger_id", "store").limit(n).collect()]


__all__ = ["AuditRules", "CANDIDATE_COLUMNS", "IN_USE_COLUMNS", "classify", "confirmed", "count_statuses",
           "read_in_use_file", "read_listing_file", "write_candidates"]
