"""Partition ownership in the snapshot store: a lease with a fencing epoch (docs/scaling.md).

Each scheduling partition's snapshot namespace holds one lease record `{epoch, owner, expires}`.
An owner takes it only when it is free (never taken, released, expired, or its holder is known
dead) and every take increments the epoch. The epoch is the fencing token: every durable write
of the owner (journal, snapshots, manifest, cursor, deletions) and every release round checks,
under the store's lease lock, that the record still carries its epoch; a stale owner (paused,
not dead, while its lease ran out and another took over) is refused with LeaseLostError before
it changes anything, and its service stops. Clocks only decide *when* a lease may be taken over
(liveness); which writes land is decided by the epoch (safety).

This module holds the record, the pure rules and the store-side contract; `directory_lease.py`
implements it on a (shared) directory, `FencedSnapshotStorage` puts the check in front of every
mutating call of a BucketSnapshotStorage.
"""
from __future__ import annotations

import json
import logging
import threading
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

from .base import BucketSnapshotStorage, SnapshotStorageError, SnapshotWriter, write_whole

log = logging.getLogger(__name__)

__all__ = [
    "FencedSnapshotStorage",
    "Lease",
    "LeaseBusyError",
    "LeaseKeeper",
    "LeaseLostError",
    "PartitionLeaseStore",
    "renewed_lease",
    "new_incarnation",
    "superseded",
    "taken_lease",
]


class LeaseBusyError(SnapshotStorageError):
    """The partition's lease is held by another live owner: try again later."""


class LeaseLostError(SnapshotStorageError):
    """This owner's lease was taken over (or released): it must not write or release any more."""


@dataclass(frozen=True)
class Lease:
    """One partition's lease record. `expires_ms` is wall-clock ms; 0 = released."""

    epoch: int
    owner: str
    expires_ms: int

    def encode(self) -> bytes:
        """The stored form (JSON)."""
        return json.dumps({"epoch": self.epoch, "owner": self.owner, "expires_ms": self.expires_ms},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> "Lease":
        """Parse a stored record; SnapshotStorageError naming `where` when it is not one."""
        try:
            d = json.loads(raw)
            lease = cls(int(d["epoch"]), str(d["owner"]), int(d["expires_ms"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotStorageError(f"{where}: lease record {raw[:200]!r} is malformed: {exc}") from None
        if lease.epoch < 1:
            raise SnapshotStorageError(f"{where}: lease record has epoch {lease.epoch} (must be >= 1)")
        return lease


def new_incarnation(now_ms: int) -> str:
    """An incarnation name for a process started at `now_ms`: `<start ms>-<random hex>`, ordered by
    its start (`superseded`), unique by its random part."""
    return f"{int(now_ms)}-{uuid.uuid4().hex[:12]}"


def _incarnation_order(incarnation: str) -> Tuple[int, str]:
    # A name without a start (`<hex>`, as owners were named before) sorts before every started one.
    start, sep, rest = incarnation.partition("-")
    if sep and start.isdigit():
        return int(start), rest
    return -1, incarnation


def superseded(holder: str, owner: str) -> bool:
    """True when `owner` may take `holder`'s running lease at once: both name the same instance and
    `owner` is the same incarnation or a later one (it started later).

    Owners are named `<fqfn>/<instance id>/<incarnation>` (scheduler/factory.py), one incarnation
    per process (`new_incarnation`). Pulsar runs one copy of each instance id of a function: a
    worker starts instance i only once i's previous assignment is gone (its worker stopped it, or
    died and the leader reassigned it). So a later incarnation of i finding i's lease still running
    knows its holder is dead or being stopped, and need not wait for the expiry; a holder that
    still runs is fenced by the new epoch. Only the later one may: during a rebalance both copies
    run for a moment, and an earlier copy that could take the lease back would take turns with its
    successor, each take a recovery that releases everything after the committed watermark again.
    The same incarnation (a partition rebuilt in the same process) takes it too: its earlier
    service is stopped, or fenced by the new epoch. Start times come from each worker's clock; a
    successor whose clock is behind its predecessor's by more than the time between their starts
    waits for the lease to expire or be released, as for another instance."""
    h, o = holder.rsplit("/", 1), owner.rsplit("/", 1)
    if len(h) != 2 or len(o) != 2 or h[0] != o[0]:
        return False
    return h[1] == o[1] or _incarnation_order(o[1]) > _incarnation_order(h[1])


def taken_lease(current: Optional[Lease], owner: str, now_ms: int, ttl_ms: int,
                holder_dead: bool = False) -> Optional[Lease]:
    """The lease `owner` gets now, or None while another owner's lease still runs.

    Free = never taken, released (`expires_ms == 0`), expired, its holder known dead (the
    directory store sees a dead holder's process lock go), or its holder the same or an earlier
    incarnation of the same instance (`superseded`: on the table service, which cannot see a dead holder,
    an instance moved to another worker would otherwise wait out the lease). A take always
    increments the epoch, also for the same owner name: a restarted process must fence its own
    earlier incarnation.
    """
    if ttl_ms < 1:
        raise ValueError(f"lease ttl must be >= 1 ms, got {ttl_ms}")
    if current is not None and not holder_dead and current.expires_ms > now_ms \
            and not superseded(current.owner, owner):
        return None
    epoch = (current.epoch if current is not None else 0) + 1
    return Lease(epoch, owner, now_ms + ttl_ms)


def renewed_lease(current: Optional[Lease], mine: Lease, now_ms: int, ttl_ms: int) -> Lease:
    """`mine` extended to now + ttl; LeaseLostError when the record is no longer `mine`'s epoch."""
    check_lease(current, mine)
    return Lease(mine.epoch, mine.owner, now_ms + ttl_ms)


def check_lease(current: Optional[Lease], mine: Lease, where: str = "") -> None:
    """LeaseLostError unless the stored record still carries `mine`'s epoch and owner."""
    if current is None or current.epoch != mine.epoch or current.owner != mine.owner:
        now = "no lease" if current is None else f"epoch {current.epoch} of {current.owner}"
        raise LeaseLostError(f"{where + ': ' if where else ''}lease epoch {mine.epoch} of {mine.owner} "
                             f"was taken over (the store now holds {now}): this owner is fenced")
    if current.expires_ms == 0:
        raise LeaseLostError(f"{where + ': ' if where else ''}lease epoch {mine.epoch} of {mine.owner} was released")


class PartitionLeaseStore(Protocol):
    """Where one partition's lease lives (a backend of the snapshot store)."""

    def acquire(self, owner: str, ttl_ms: int) -> Lease:
        """Take the lease (epoch + 1) or raise LeaseBusyError; the returned lease is now current."""

    def renew(self, lease: Lease, ttl_ms: int) -> Lease:
        """Extend `lease`; LeaseLostError when it was taken over."""

    def release(self, lease: Lease) -> None:
        """Give the lease up (the next owner takes it at once); a lost lease is left alone."""

    def fenced(self, lease: Lease) -> AbstractContextManager[None]:
        """Check `lease` is current and keep it so (no take-over) until the block ends."""

    def check(self, lease: Lease) -> None:
        """LeaseLostError unless `lease` is current."""

    def close(self) -> None:
        """Release local resources (not the lease: see release)."""


class LeaseKeeper:
    """Renews an owned lease every ttl/3 on a daemon thread; close() stops and releases it.

    A renewal that finds the lease taken over stops renewing and calls `on_lost` (given here or
    later through `watch`); the owner's next fenced write or release round is refused anyway (the
    epoch, not this thread, is the fence), but an owner with nothing to write or release would
    otherwise notice only then, keeping its producers open in its successor's way.
    """

    def __init__(self, store: PartitionLeaseStore, lease: Lease, ttl_ms: int,
                 on_lost: Optional[Callable[[BaseException], None]] = None) -> None:
        self.store = store
        self.lease = lease
        self.ttl_ms = ttl_ms
        self.lost: Optional[BaseException] = None
        self._on_lost = on_lost
        self._lost_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition-lease", daemon=True)

    def start(self) -> "LeaseKeeper":
        """Start renewing."""
        self._thread.start()
        return self

    def watch(self, on_lost: Callable[[BaseException], None]) -> None:
        """Call `on_lost(error)` when a renewal finds the lease taken over; at once when one already did."""
        with self._lost_lock:
            self._on_lost = on_lost
            lost = self.lost
        if lost is not None:
            on_lost(lost)

    def _run(self) -> None:
        interval = max(0.05, self.ttl_ms / 3000.0)
        while not self._stop.wait(interval):
            try:
                self.lease = self.store.renew(self.lease, self.ttl_ms)
            except LeaseLostError as exc:
                log.error("event=partition_lease_lost store=%r epoch=%d error=%s", self.store, self.lease.epoch, exc)
                with self._lost_lock:
                    self.lost = exc
                    on_lost = self._on_lost
                if on_lost is not None:
                    on_lost(exc)
                return
            except Exception as exc:  # a storage hiccup: the next renewal retries before expiry
                log.warning("event=partition_lease_renew_failed store=%r epoch=%d error=%r",
                            self.store, self.lease.epoch, exc)

    def close(self) -> None:
        """Stop renewing and give the lease up, so the next owner takes it without waiting."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            if self.lost is None:
                self.store.release(self.lease)
        except Exception as exc:  # the lease then expires by itself
            log.warning("event=partition_lease_release_failed store=%r error=%r", self.store, exc)
        finally:
            self.store.close()


class _FencedWriter:
    """A SnapshotWriter whose every step is fenced."""

    def __init__(self, inner: SnapshotWriter, fence: "FencedSnapshotStorage") -> None:
        self._inner = inner
        self._fence = fence
        self.bucket_id = inner.bucket_id

    def add_segment(self, data: bytes) -> None:
        with self._fence.fenced():
            self._inner.add_segment(data)

    def finish(self, metadata: bytes) -> int:
        with self._fence.fenced():
            return self._inner.finish(metadata)

    def abort(self) -> None:
        # Drops only this writer's own unfinished snapshot (an id the counter never hands out again).
        self._inner.abort()


class FencedSnapshotStorage:
    """A BucketSnapshotStorage whose mutating calls run only while this owner's lease is current.

    Reads pass through. Every write (and deletion) is checked against the stored lease under
    the lease store's lock, which a take-over also takes: a write either completes before a new
    owner's epoch exists (and the new owner's recovery, which starts after the take-over, sees
    it) or is refused with LeaseLostError.
    """

    def __init__(self, inner: BucketSnapshotStorage, leases: PartitionLeaseStore, lease: Lease) -> None:
        self.inner = inner
        self.leases = leases
        self.lease = lease

    def __getattr__(self, name: str) -> Any:  # describe(), root, ... of the backend
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"FencedSnapshotStorage({self.inner!r}, epoch={self.lease.epoch})"

    def fenced(self) -> AbstractContextManager[None]:
        """The lease check around one write."""
        return self.leases.fenced(self.lease)

    # -- writes: fenced -------------------------------------------------------------------------
    def create_snapshot(self, metadata: bytes, segments: Sequence[bytes], bucket_key: str,
                        topic: str, cursor: str) -> int:
        return write_whole(self, metadata, segments, bucket_key, topic, cursor)

    def begin_snapshot(self, bucket_key: str, topic: str, cursor: str,
                       bucket_id: Optional[int] = None) -> SnapshotWriter:
        with self.fenced():
            inner = (self.inner.begin_snapshot(bucket_key, topic, cursor) if bucket_id is None
                     else self.inner.begin_snapshot(bucket_key, topic, cursor, bucket_id=bucket_id))
        return _FencedWriter(inner, self)

    def reserve_bucket_ids(self, count: int) -> int:
        with self.fenced():
            return self.inner.reserve_bucket_ids(count)

    def delete(self, bucket_id: int) -> None:
        with self.fenced():
            self.inner.delete(bucket_id)

    def journal_append(self, record: bytes) -> int:
        with self.fenced():
            return self.inner.journal_append(record)

    def journal_truncate(self, upto: int) -> None:
        with self.fenced():
            self.inner.journal_truncate(upto)

    def put_index_id(self, index_id: str) -> None:
        with self.fenced():
            self.inner.put_index_id(index_id)

    def put_manifest(self, data: bytes) -> None:
        with self.fenced():
            self.inner.put_manifest(data)

    def put_cursor(self, data: bytes) -> None:
        with self.fenced():
            self.inner.put_cursor(data)

    # -- reads: unfenced ------------------------------------------------------------------------
    def get_metadata(self, bucket_id: int) -> bytes:
        return self.inner.get_metadata(bucket_id)

    def get_segments(self, bucket_id: int, first: int, last: int) -> List[bytes]:
        return self.inner.get_segments(bucket_id, first, last)

    def get_length(self, bucket_id: int) -> int:
        return self.inner.get_length(bucket_id)

    def list_snapshots(self, after_id: int = 0) -> List[int]:
        return self.inner.list_snapshots(after_id)

    def journal_read(self) -> List[Tuple[int, bytes]]:
        return self.inner.journal_read()

    def snapshot_info(self, bucket_id: int) -> Any:
        return self.inner.snapshot_info(bucket_id)

    def get_index_id(self) -> Optional[str]:
        return self.inner.get_index_id()

    def get_manifest(self) -> Optional[bytes]:
        return self.inner.get_manifest()

    def get_cursor(self) -> Optional[bytes]:
        return self.inner.get_cursor()

    def close(self) -> None:
        self.inner.close()
