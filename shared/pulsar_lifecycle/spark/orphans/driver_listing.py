"""Listing bookies from the executors: the orphan audit's biggest live listing, distributed.

BookKeeper's list service pages 100 ledgers at a time and says nothing about how many pages
there are, so the driver hands out rounds of page blocks: each Spark task fetches one block
(BookieListing.pages) and stops at an empty page; the listing ends with the first round in which
some block met an empty page. The rows stay on the executors and are written as Parquet before
anything else happens, so

* storage is still listed completely before the metadata is read (run_audit reads the
  metadata only after this returns), and a lost executor can never re-list pages later: the
  classify step reads the written files, never the HTTP listing;
* any failed page fails its task, the job and the scan (ListingError: nothing reported, nothing
  committed), as a failed page does on the driver.

What stays on the driver, and why: S3 listings are one continuation-token chain per bucket
(sequential by the API) and their HEADs, like the admin REST scan, are rate-limited
(`--max-admin-rps`): spreading them over executors would not make them faster than the limit,
only harder to keep under it. The filesystem offloader's tree and the snapshot store are local
directory walks.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import List, Tuple

from pyspark.sql import DataFrame, SparkSession  # this module runs only under Spark
from pyspark.sql import types as T

from ..failures import cause_of
from ..paths import file_url
from .driver_frames import LISTING_SCHEMA
from .executor import fetch_blocks
from .model import ListingError
from .sources import BookieListing

log = logging.getLogger(__name__)

PAGES_PER_TASK = 20  # 2,000 ledgers per task and round
# What a round writes: kind 0 = a listed ledger (row), kind 1 = an empty page ended the listing.
ROUND_SCHEMA = T.StructType([T.StructField("kind", T.IntegerType(), False),
                             T.StructField("row", LISTING_SCHEMA, True),
                             T.StructField("page", T.LongType(), True)])


def list_bookies(spark: SparkSession, listing: BookieListing, out_dir: Path, tasks: int = 0,
                 pages_per_task: int = PAGES_PER_TASK) -> Tuple[DataFrame, int]:
    """Every ledger the bookie lists, fetched by the executors and written to `out_dir` as
    Parquet (one ledger id once); returns (the listing read back, its row count).
    ListingError when any page fails or the listing has more than `listing.max_pages` pages."""
    sc = spark.sparkContext
    tasks = tasks or max(1, sc.defaultParallelism)
    shutil.rmtree(out_dir, ignore_errors=True)
    first, rounds = 1, 0
    parts: List[str] = []
    try:
        while True:
            if first > listing.max_pages:
                raise ListingError(f"bookie ledger list: more than {listing.max_pages} pages")
            blocks = [(b, min(b + pages_per_task - 1, listing.max_pages))
                      for b in range(first, min(first + tasks * pages_per_task, listing.max_pages + 1), pages_per_task)]
            rdd = sc.parallelize(blocks, len(blocks)).mapPartitions(
                lambda it, _l=listing: fetch_blocks(_l, it))  # type: ignore[misc]  # mypy cannot type a lambda default
            part = file_url(out_dir / f"round-{rounds:06d}")  # the driver's directory, whatever the executors' is
            # One pass over the pages: rows and end markers are written together, then read back.
            spark.createDataFrame(rdd.map(lambda kv: (kv[0], kv[1] if kv[0] == 0 else None, kv[1] if kv[0] == 1 else None)),
                                  ROUND_SCHEMA).write.parquet(part)
            parts.append(part)
            ended = spark.read.parquet(part).where("kind = 1").count() > 0
            rounds += 1
            first += tasks * pages_per_task
            if ended:
                break
    except ListingError:
        raise
    except Exception as exc:  # a task's ListingError arrives wrapped by Py4J / PythonException
        reason = cause_of(exc)
        reason = reason.split("ListingError: ", 1)[1] if reason.startswith("ListingError: ") else reason
        raise ListingError(f"bookie listing on the executors failed: {reason}") from exc
    rows = spark.read.parquet(*parts).where("kind = 0").select("row.*").dropDuplicates(["ledger_id"])
    listing_dir = file_url(out_dir / "listing")
    rows.write.parquet(listing_dir)
    df = spark.read.schema(LISTING_SCHEMA).parquet(listing_dir)
    n = df.count()
    log.info("event=bookie_listing_done rounds=%d tasks=%d ledgers=%d", rounds, tasks, n)
    return df, n
