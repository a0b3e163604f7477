"""A partition's lease on the BookKeeper table service passes at once to a new incarnation of
the instance that held it (bucket/storage/lease.py, `superseded`).

On a cluster of function workers a lost worker's writer instance i is started again on another
worker; its predecessor died without releasing its partitions' leases, and the table service
cannot tell a dead holder from a live one. Before, the moved instance waited out
`partitionLeaseSeconds` for each partition (measured on two Pulsar workers: the partitions of
the lost worker served again only after the lease's remaining time). Now a new incarnation of the
same instance id takes the lease at once under a higher epoch and the earlier one cannot take it back; the old incarnation's writes are
refused; another instance still waits for the expiry. Runs against the local table server.
"""
from __future__ import annotations

import pytest

from pulsar_lifecycle.bucket.storage import bookkeeper_partition_storage
from pulsar_lifecycle.bucket.storage.lease import LeaseBusyError, LeaseLostError, new_incarnation
from servers.bk_table_server import start_table_server

pytestmark = [pytest.mark.integration]
FQFN = "public/default/writer-x"
TTL_MS = 30_000


def test_a_moved_instance_takes_its_partition_at_once_and_fences_its_predecessor():
    with start_table_server() as server:
        def take(owner: str):
            return bookkeeper_partition_storage(server.url, "public", "default", "writer-x", "partition-1",
                                                owner, TTL_MS)

        first, second = new_incarnation(1_000_000), new_incarnation(2_000_000)  # two process starts
        old_store, old_leases, old = take(f"{FQFN}/1/{first}")  # instance 1, then lost unreleased
        old_store.put_cursor(b"before")
        with pytest.raises(LeaseBusyError):
            take(f"{FQFN}/0/{second}")  # another instance waits for the expiry
        new_store, new_leases, new = take(f"{FQFN}/1/{second}")  # instance 1 started again elsewhere
        try:
            assert new.epoch == old.epoch + 1 and new.owner.endswith(f"/1/{second}")
            with pytest.raises(LeaseBusyError):
                take(f"{FQFN}/1/{first}")  # the earlier copy, still stopping, cannot take it back
            assert new_store.get_cursor() == b"before"  # what the predecessor wrote is there
            with pytest.raises(LeaseLostError):
                old_store.put_cursor(b"stale")  # the predecessor, were it still running, is fenced
            new_store.put_cursor(b"after")
            assert new_store.get_cursor() == b"after"
        finally:
            for store, leases in ((old_store, old_leases), (new_store, new_leases)):
                store.close()
                leases.close()
