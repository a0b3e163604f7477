"""The orphan audit's executor side: what a Spark task runs in its Python worker (no PySpark import).

The driver (driver_listing.list_bookies) hands each task a few blocks of the bookie's list pages;
the task fetches them with the BookieListing it was shipped (sources.py) and yields the rows.
"""
from __future__ import annotations

from typing import Any, Iterator, Tuple

from .sources import BookieListing


def fetch_blocks(listing: BookieListing, blocks: Iterator[Tuple[int, int]]) -> Iterator[Tuple[int, Any]]:
    """(0, listing row) per ledger, then (1, first page of the block) when an
    empty page ended the listing inside it."""
    for first, last in blocks:
        ledgers, ended = listing.pages(first, last)
        for ledger in ledgers:
            yield 0, ledger.row()
        if ended:
            yield 1, first
