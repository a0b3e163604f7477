"""The bucket index and the release publisher's dedup state must belong together.

Releases carry the index's sequence ids and the dedup publisher drops every id at or below the
highest one already on the target topic. A fresh index numbering from 1 again (snapshot store
wiped, replaced, or pointed at another directory) would therefore have every release dropped as
a duplicate. Two rules prevent that:

1. Each index has an id (random, kept in the snapshot store) and the function state keeps the
   id of the index its dedup state follows (`dedup/<instance>/index-id`). When they differ the
   writer refuses to start with one error naming both places and what to do; nothing is
   released, nothing acked.
2. A new index starts its sequence ids at `wall-clock ms << 20` (and above the highest id the
   output topic already holds), not at 1, so a new index can never collide with what an older
   one published: an index would have to release more than 2**20 messages per millisecond of
   its lifetime to reach its successor's base. The base fits an int64 until the year 2248.

An operator who knows the old index is gone for good sets userConfig `replaceIndexId` to the id
the error names; the writer then adopts the current (new, empty) index.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ..bucket.proto.BucketIndexState_pb2 import ReleaseCursor
from ..clock import Clock, wall_clock_ms
from ..exceptions import PulsarLifecycleError

log = logging.getLogger(__name__)

STATE_KEY = "index-id"
SEQ_BASE_SHIFT = 20


class IndexMismatchError(PulsarLifecycleError):
    """The snapshot index is not the one the function's dedup state follows."""


@dataclass(frozen=True)
class IdentityResult:
    """What check_index_identity decided."""

    index_id: str
    fresh: bool
    seq_base: int  # the first release gets seq_base + 1 (0 for an existing index: unchanged)


def _refuse(message: str) -> IndexMismatchError:
    log.error("event=bucket_index_mismatch action=refuse_start error=%s", message)
    return IndexMismatchError(message)


def seq_base_for_new_index(now_ms: int, published_seq: int) -> int:
    """Sequence base of a new index: above every id an earlier index could have used."""
    return max(int(now_ms) << SEQ_BASE_SHIFT, int(published_seq))


def is_fresh(storage: Any) -> bool:
    """True when the store holds no index yet (no cursor, manifest, snapshot or journal record)."""
    return (storage.get_cursor() is None and storage.get_manifest() is None
            and not storage.list_snapshots() and not storage.journal_read())


def _followed_and_current(storage: Any, state: Any) -> Tuple[Optional[str], Optional[str]]:
    raw = state.get(STATE_KEY)
    return (raw.decode("ascii", "replace").strip() if raw else None), storage.get_index_id()


def known_identity(storage: Any, state: Any) -> Optional[IdentityResult]:
    """The usual restart, found without the release producer: the store's index is the one the
    state follows (what check_index_identity then returns, with no scan and no write); None
    for every other case, which check_index_identity decides."""
    followed, current = _followed_and_current(storage, state)
    return IdentityResult(current, False, 0) if current is not None and current == followed else None


def check_index_identity(storage: Any, state: Any, *, state_location: str, published_seq: int,
                         replace_index_id: str = "",
                         clock_ms: Clock = wall_clock_ms) -> IdentityResult:
    """Make sure `storage` (the index) and `state` (dedup state of this instance) belong together.

    Args:
        storage: the bucket snapshot store (get/put_index_id, cursor, manifest, journal).
        state: the StateStore holding this instance's dedup state (key STATE_KEY).
        state_location: how to name `state` in an error (function, instance, store).
        published_seq: the highest sequence id the release producer already has on its topic.
        replace_index_id: userConfig `replaceIndexId`: the operator accepts that this index is gone.
    Raises:
        IndexMismatchError: naming both locations, both ids and what to do.
    """
    where = storage.describe() if callable(getattr(storage, "describe", None)) else repr(storage)
    followed, current = _followed_and_current(storage, state)
    if current is not None and current == followed:
        return IdentityResult(current, False, 0)  # the usual restart: no need to scan the store
    fresh = is_fresh(storage)

    if current is None and fresh:
        if followed and followed != replace_index_id:
            raise _refuse(
                f"the bucket index is missing: {where} is empty, but the function state ({state_location}) "
                f"follows index {followed}. The snapshot store was wiped, replaced or snapshotDir points elsewhere; "
                f"the messages pending in index {followed} would never be released. Point snapshotDir back at "
                f"that index (restore it); if it is lost for good, set userConfig replaceIndexId={followed} "
                "to start a new index (its pending messages are then lost).")
        index_id = uuid.uuid4().hex
        base = seq_base_for_new_index(clock_ms(), published_seq)
        # Cursor first: an id without its base would let a restart skip the base.
        storage.put_cursor(ReleaseCursor(has_watermark=False, seq=base).SerializeToString())
        storage.put_index_id(index_id)
        state.put(STATE_KEY, index_id.encode("ascii"))
        if followed:
            log.error("event=bucket_index_replaced old_index=%s new_index=%s snapshots=%s state=%s seq_base=%d",
                      followed, index_id, where, state_location, base)
        else:
            log.info("event=bucket_index_created index=%s snapshots=%s state=%s seq_base=%d",
                     index_id, where, state_location, base)
        return IdentityResult(index_id, True, base)

    if current is None:
        # An index written before ids existed: adopt it when the state follows no other index.
        if followed and followed != replace_index_id:
            raise _refuse(
                f"{where} holds an index without an id, but the function state ({state_location}) follows "
                f"index {followed}: they do not belong together. Point snapshotDir at index {followed}; if it "
                f"is lost for good, move {where} aside and set userConfig replaceIndexId={followed}.")
        current = uuid.uuid4().hex
        storage.put_index_id(current)
        log.info("event=bucket_index_id_assigned index=%s snapshots=%s", current, where)
    elif current != followed and followed is not None:
        if followed == replace_index_id and fresh:
            log.error("event=bucket_index_replaced old_index=%s new_index=%s snapshots=%s state=%s",
                      followed, current, where, state_location)
        else:
            raise _refuse(
                f"{where} holds bucket index {current}, but the function state ({state_location}) follows index "
                f"{followed}: releases of this index would be dropped as duplicates. Point snapshotDir at the "
                f"directory of index {followed}; if that index is lost for good, move {where} aside (its pending "
                f"messages are then lost too) and set userConfig replaceIndexId={followed}.")
    if followed != current:
        state.put(STATE_KEY, current.encode("ascii"))
    return IdentityResult(current, False, 0)
