"""A partition's lease in its snapshot directory (the directory backend of lease.py).

Files in the partition's snapshot directory:
    lease.json   the record {epoch, owner, expires_ms}, replaced atomically (durable.atomic_write)
    lease.lock   flock target: a take-over, renewal or release holds it exclusively while it
                 reads and replaces lease.json; every fenced write holds it shared while it
                 checks the epoch and writes. So a write and a take-over never overlap: the write
                 lands before the new epoch exists, or it sees the new epoch and is refused.
    owner.lock   held exclusively by the current owner for as long as it runs. The kernel drops
                 it when the process dies (SIGKILL included), so a free owner.lock means the
                 holder is dead and its lease may be taken at once instead of after it expires. A
                 paused holder keeps it: then the new owner waits for the lease to expire.

Waits on the flocks are bounded (a paused process may hold one): a busy lock is a
LeaseBusyError (take-over) or SnapshotStorageError (a write), never a hang.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from ...clock import Clock, wall_clock_ms
from ...durable import atomic_write
from .base import SnapshotStorageError
from .lease import Lease, LeaseBusyError, check_lease, renewed_lease, taken_lease

log = logging.getLogger(__name__)

LOCK_WAIT_S = 10.0  # longest wait for lease.lock (a paused process may hold it)


class DirectoryLease:
    """PartitionLeaseStore in one partition's snapshot directory (see the module docstring)."""

    def __init__(self, root: os.PathLike | str, clock: Clock = wall_clock_ms, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SnapshotStorageError(f"cannot create snapshot directory {self.root}: {exc}") from exc
        self._record = self.root / "lease.json"
        self._lock_path = self.root / "lease.lock"
        self._owner_path = self.root / "owner.lock"
        self._clock = clock
        self._lock_wait_s = lock_wait_s
        self._owner_fd: Optional[int] = None  # held while this object owns the partition
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"DirectoryLease({str(self.root)!r})"

    # -- locks ----------------------------------------------------------------------------------
    @contextmanager
    def _locked(self, mode: int, what: str) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self._lock_wait_s
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise SnapshotStorageError(
                            f"{self._lock_path}: lease lock still busy after {self._lock_wait_s:g} s ({what}); "
                            "another owner holds it (paused?)") from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _try_owner_lock(self) -> bool:
        """Take owner.lock if free (True): then no live process holds this partition."""
        if self._owner_fd is not None:
            return True
        fd = os.open(self._owner_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._owner_fd = fd
        return True

    def _drop_owner_lock(self) -> None:
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    # -- record ---------------------------------------------------------------------------------
    def current(self) -> Optional[Lease]:
        """The stored lease record, or None before the first take."""
        try:
            raw = self._record.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SnapshotStorageError(f"cannot read lease {self._record}: {exc}") from exc
        return Lease.decode(raw, str(self._record))

    def _put(self, lease: Lease) -> None:
        try:
            atomic_write(self._record, lease.encode())
        except OSError as exc:
            raise SnapshotStorageError(f"cannot write lease {self._record}: {exc}") from exc

    # -- PartitionLeaseStore ----------------------------------------------------------------------
    def acquire(self, owner: str, ttl_ms: int) -> Lease:
        with self._mutex:
            holder_dead = self._try_owner_lock()
            try:
                with self._locked(fcntl.LOCK_EX, "acquire"):
                    current = self.current()
                    new = taken_lease(current, owner, self._clock(), ttl_ms, holder_dead=holder_dead)
                    if new is None:
                        assert current is not None
                        raise LeaseBusyError(
                            f"{self.root}: held by {current.owner} (epoch {current.epoch}) for another "
                            f"{max(0, current.expires_ms - self._clock())} ms")
                    self._put(new)
            except BaseException:
                self._drop_owner_lock()
                raise
        log.info("event=partition_lease_taken dir=%s epoch=%d owner=%s previous=%s holder_dead=%s",
                 self.root, new.epoch, owner, current, holder_dead)
        return new

    def renew(self, lease: Lease, ttl_ms: int) -> Lease:
        with self._mutex:
            self._try_owner_lock()  # a paused previous holder may have died since the take-over
            with self._locked(fcntl.LOCK_EX, "renew"):
                new = renewed_lease(self.current(), lease, self._clock(), ttl_ms)
                self._put(new)
        return new

    def release(self, lease: Lease) -> None:
        with self._mutex:
            try:
                with self._locked(fcntl.LOCK_EX, "release"):
                    current = self.current()
                    if current is not None and current.epoch == lease.epoch and current.owner == lease.owner:
                        self._put(Lease(lease.epoch, lease.owner, 0))
                        log.info("event=partition_lease_released dir=%s epoch=%d", self.root, lease.epoch)
            finally:
                self._drop_owner_lock()

    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        with self._locked(fcntl.LOCK_SH, "write"):
            check_lease(self.current(), lease, str(self.root))
            yield

    def check(self, lease: Lease) -> None:
        check_lease(self.current(), lease, str(self.root))

    def close(self) -> None:
        with self._mutex:
            self._drop_owner_lock()
