"""A partition's lease on the BookKeeper table service (the table-service backend of lease.py).

Two keys under the partition's prefix, both under the partition's one routing key (the prefix),
which every key of the partition's index also uses (BookKeeperTableSnapshotStorage with
`routing_key`), so that one Txn can compare the lease and write the index:

    <prefix>lease/epoch    "<epoch>:<owner>"; changes only when an owner takes the partition
    <prefix>lease/record   Lease.encode() (epoch, owner, expiry); renewals and releases replace it

A take is one Txn: if both keys still hold what the taker read, write the new epoch and record
(two takers racing: one wins, the other gets LeaseBusyError). Renew and release are Txns guarded
by the epoch key. The fence is in the index's own writes: every put and delete of the fenced
snapshot storage is a Txn guarded by `<prefix>lease/epoch` == this owner's value, so a stale
owner's write changes nothing and raises LeaseLostError. The table service cannot tell a dead
holder from a live one: a new owner waits for the lease to expire (or be released).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional, Tuple

from ...clock import Clock, wall_clock_ms
from ...state.bk_table import BookKeeperTable
from .base import SnapshotStorageError
from .lease import Lease, LeaseBusyError, LeaseLostError, check_lease, renewed_lease, taken_lease

log = logging.getLogger(__name__)

READ_ATTEMPTS = 3


def epoch_value(lease: Lease) -> bytes:
    """What `<prefix>lease/epoch` holds for `lease`."""
    return f"{lease.epoch}:{lease.owner}".encode()


class BookKeeperLease:
    """PartitionLeaseStore under `prefix` of an open table (see the module docstring). Owns `table`
    when `own_table` (closed with close())."""

    def __init__(self, table: BookKeeperTable, prefix: str, *, clock: Clock = wall_clock_ms,
                 own_table: bool = False) -> None:
        self.table = table
        self.prefix = prefix
        self.routing_key = prefix.encode("utf-8")
        self.epoch_key = self.routing_key + b"lease/epoch"
        self._record_key = self.routing_key + b"lease/record"
        self._clock = clock
        self._own_table = own_table

    def __repr__(self) -> str:
        return f"BookKeeperLease({self.table.service.url!r}, prefix={self.prefix!r})"

    def _get(self, key: bytes) -> bytes:
        kv = self.table.routed_get(self.routing_key, key)
        if kv is not None and kv.is_number:
            raise SnapshotStorageError(f"{self!r}: key {key!r} holds a counter, expected bytes")
        return bytes(kv.value) if kv is not None else b""

    def _read(self) -> Tuple[bytes, bytes, Optional[Lease]]:
        # Two gets, not one read: a take (one Txn writing both keys) can land between them, and
        # then they disagree for that read only; read again. Only a disagreement that stays is an error.
        for _attempt in range(READ_ATTEMPTS):
            epoch_raw, record_raw = self._get(self.epoch_key), self._get(self._record_key)
            lease = Lease.decode(record_raw, repr(self)) if record_raw else None
            if lease is None or epoch_raw == epoch_value(lease):
                return epoch_raw, record_raw, lease
        raise SnapshotStorageError(f"{self!r}: lease record {record_raw!r} and epoch {epoch_raw!r} disagree "
                                   f"({READ_ATTEMPTS} reads)")

    def current(self) -> Optional[Lease]:
        """The stored lease record, or None before the first take."""
        return self._read()[2]

    def guard(self, lease: Lease) -> Tuple[bytes, bytes]:
        """The (key, value) every fenced write of `lease`'s owner is conditioned on."""
        return self.epoch_key, epoch_value(lease)

    def acquire(self, owner: str, ttl_ms: int) -> Lease:
        epoch_raw, record_raw, current = self._read()
        new = taken_lease(current, owner, self._clock(), ttl_ms)
        if new is None:
            assert current is not None
            raise LeaseBusyError(f"{self!r}: held by {current.owner} (epoch {current.epoch}) for another "
                                 f"{max(0, current.expires_ms - self._clock())} ms")
        if not self.table.txn(self.routing_key, [(self.epoch_key, epoch_raw), (self._record_key, record_raw)],
                              puts=[(self.epoch_key, epoch_value(new)), (self._record_key, new.encode())]):
            raise LeaseBusyError(f"{self!r}: another owner took the lease at the same time")
        log.info("event=partition_lease_taken store=%r epoch=%d owner=%s previous=%s", self, new.epoch, owner, current)
        return new

    def renew(self, lease: Lease, ttl_ms: int) -> Lease:
        _, _, current = self._read()
        new = renewed_lease(current, lease, self._clock(), ttl_ms)
        if not self.table.txn(self.routing_key, [self.guard(lease)], puts=[(self._record_key, new.encode())]):
            raise LeaseLostError(f"{self!r}: lease epoch {lease.epoch} of {lease.owner} was taken over")
        return new

    def release(self, lease: Lease) -> None:
        released = Lease(lease.epoch, lease.owner, 0)
        if self.table.txn(self.routing_key, [self.guard(lease)], puts=[(self._record_key, released.encode())]):
            log.info("event=partition_lease_released store=%r epoch=%d", self, lease.epoch)

    @contextlib.contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        # The guard is inside each write's own Txn (BookKeeperTableSnapshotStorage(fence=...)).
        yield

    def check(self, lease: Lease) -> None:
        _, _, current = self._read()
        check_lease(current, lease, repr(self))

    def close(self) -> None:
        if self._own_table:
            self.table.close()
