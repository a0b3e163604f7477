"""Partition assignment (pure) and the per-partition lease with its fencing epoch."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsar_lifecycle.bucket.storage import DirectorySnapshotStorage
from pulsar_lifecycle.bucket.storage.directory_lease import DirectoryLease
from pulsar_lifecycle.bucket.storage.lease import (
    FencedSnapshotStorage,
    Lease,
    LeaseBusyError,
    LeaseKeeper,
    LeaseLostError,
    new_incarnation,
    renewed_lease,
    superseded,
    taken_lease,
)
from pulsar_lifecycle.clock import FakeClock
from pulsar_lifecycle.scheduler.partition_assignment import PartitionAssignment, assign_partitions
from pulsar_lifecycle.topics import TopicName

# -- assignment -------------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 16))
def test_every_partition_has_exactly_one_owner(partitions, instances):
    owners = [assign_partitions(partitions, i, instances) for i in range(instances)]
    flat = sorted(k for owned in owners for k in owned)
    assert flat == list(range(partitions))
    # As even as it gets: shares differ by at most one.
    sizes = [len(o) for o in owners]
    assert max(sizes) - min(sizes) <= 1


def test_assignment_examples_and_errors():
    assert [assign_partitions(4, i, 3) for i in range(3)] == [(0, 3), (1,), (2,)]
    assert assign_partitions(4, 0, 1) == (0, 1, 2, 3)
    assert assign_partitions(2, 3, 5) == ()  # more instances than partitions: idle
    for bad in [(0, 0, 1), (4, -1, 2), (4, 2, 2), (4, 0, 0), (True, 0, 1)]:
        with pytest.raises(ValueError):
            assign_partitions(*bad)


def test_assignment_names_partitions_like_pulsar():
    a = PartitionAssignment(TopicName.parse("persistent://t/ns/sched"), 4, 1, 2)
    assert a.owned == (1, 3)
    assert a.topic_of(3) == "persistent://t/ns/sched-partition-3"
    with pytest.raises(ValueError):
        a.topic_of(4)


# -- the pure lease rules -----------------------------------------------------------------------


def test_take_rules():
    assert taken_lease(None, "a", 1000, 500) == Lease(1, "a", 1500)
    held = Lease(3, "a", 2000)
    assert taken_lease(held, "b", 1999, 500) is None  # still running
    assert taken_lease(held, "b", 2000, 500) == Lease(4, "b", 2500)  # expired
    assert taken_lease(held, "b", 1000, 500, holder_dead=True) == Lease(4, "b", 1500)
    assert taken_lease(Lease(3, "a", 0), "b", 10, 5) == Lease(4, "b", 15)  # released
    # The same owner name takes a new epoch too: it fences its own earlier incarnation.
    assert taken_lease(Lease(3, "a", 0), "a", 10, 5).epoch == 4


def test_only_the_same_or_a_later_incarnation_of_the_instance_supersedes():
    fn = "public/default/writer"
    early, late = new_incarnation(1_000), new_incarnation(2_000)
    held = Lease(3, f"{fn}/0/{early}", 10_000)
    # A later copy of instance 0 (moved to another worker) takes the running lease at once ...
    assert taken_lease(held, f"{fn}/0/{late}", 5_000, 500) == Lease(4, f"{fn}/0/{late}", 5_500)
    # ... and the earlier copy, still stopping during a rebalance, cannot take it back.
    assert taken_lease(Lease(4, f"{fn}/0/{late}", 10_000), f"{fn}/0/{early}", 5_000, 500) is None
    # The same process (a partition rebuilt after a failure) takes it again, under a new epoch.
    assert taken_lease(held, f"{fn}/0/{early}", 5_000, 500) == Lease(4, f"{fn}/0/{early}", 5_500)
    # Another instance, or another function, waits for the expiry whatever its start.
    assert taken_lease(held, f"{fn}/1/{late}", 5_000, 500) is None
    assert taken_lease(held, f"public/default/other/0/{late}", 5_000, 500) is None
    # An owner named before incarnations had a start counts as the earliest.
    assert superseded(f"{fn}/0/0123456789ab", f"{fn}/0/{early}")
    assert not superseded(f"{fn}/0/{early}", f"{fn}/0/0123456789ab")
    # Two starts in the same ms: exactly one of them supersedes the other.
    a, b = new_incarnation(7), new_incarnation(7)
    assert superseded(f"{fn}/0/{a}", f"{fn}/0/{b}") != superseded(f"{fn}/0/{b}", f"{fn}/0/{a}")


def test_renew_rules():
    mine = Lease(2, "a", 100)
    assert renewed_lease(mine, mine, 150, 100) == Lease(2, "a", 250)
    for current in (None, Lease(3, "b", 999), Lease(2, "b", 999), Lease(2, "a", 0)):
        with pytest.raises(LeaseLostError):
            renewed_lease(current, mine, 150, 100)


# -- the directory store --------------------------------------------------------------------------


def assert_fenced(old_store, old_leases, old, new_store, new_leases, new, snap) -> None:
    """The paused old owner resumes after `new` took over: every write, renewal and release check
    of it is refused, the index is as the new owner recovered it, its release leaves `new` alone."""
    for write in (lambda: old_store.put_cursor(b"stale"), lambda: old_store.journal_append(b"stale"),
                  lambda: old_store.put_manifest(b"stale"), lambda: old_store.delete(snap),
                  lambda: old_store.create_snapshot(b"m", [b"s"], "k", "t", "c"),
                  lambda: old_leases.check(old), lambda: old_leases.renew(old, 5000)):
        with pytest.raises(LeaseLostError):
            write()
    assert new_store.get_cursor() == b"c1"
    assert [p for _, p in new_store.journal_read()] == [b"r1"]
    assert new_store.list_snapshots() == [snap]
    assert new_store.get_metadata(snap) == b"m0"
    new_store.put_cursor(b"c2")
    old_leases.release(old)
    new_leases.check(new)


def test_busy_until_expiry_then_old_owner_fenced(tmp_path):
    """A paused (not dead) owner: the new owner waits out its lease, then the old one is refused."""
    clock = FakeClock(1_000_000)
    root = tmp_path / "partition-0"
    old_leases = DirectoryLease(root, clock=clock)
    old = old_leases.acquire("old", 5000)
    old_store = FencedSnapshotStorage(DirectorySnapshotStorage(root), old_leases, old)
    old_store.put_cursor(b"c1")
    old_store.journal_append(b"r1")
    snap = old_store.create_snapshot(b"m0", [b"s0"], "k", "t", "c")

    new_leases = DirectoryLease(root, clock=clock)  # its own owner.lock: the old one is "alive"
    with pytest.raises(LeaseBusyError):
        new_leases.acquire("new", 5000)
    clock.advance(5000)  # the old owner is paused past its lease
    new = new_leases.acquire("new", 5000)
    assert new.epoch == old.epoch + 1
    new_store = FencedSnapshotStorage(DirectorySnapshotStorage(root), new_leases, new)
    assert new_store.get_cursor() == b"c1"  # recovered from the shared store

    # The old owner wakes up: every write and every release check is refused, nothing changed.
    assert_fenced(old_store, old_leases, old, new_store, new_leases, new, snap)
    old_leases.close()
    new_leases.close()


def test_release_lets_the_next_owner_in_at_once(tmp_path):
    clock = FakeClock(0)
    a, b = DirectoryLease(tmp_path, clock=clock), DirectoryLease(tmp_path, clock=clock)
    la = a.acquire("a", 60_000)
    with pytest.raises(LeaseBusyError):
        b.acquire("b", 60_000)
    a.release(la)
    assert b.acquire("b", 60_000).epoch == la.epoch + 1
    with pytest.raises(LeaseLostError):
        a.check(la)
    b.close()


def _hold_forever(root: str, ready) -> None:  # pragma: no cover - runs in a child process
    DirectoryLease(root).acquire("child", 3_600_000)
    ready.set()
    time.sleep(60)


def test_dead_holder_is_taken_over_without_waiting_for_expiry(tmp_path):
    """SIGKILL drops the holder's owner.lock: its hour-long lease is taken over at once."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_hold_forever, args=(str(tmp_path), ready))
    child.start()
    try:
        assert ready.wait(20)
        leases = DirectoryLease(tmp_path)
        with pytest.raises(LeaseBusyError):
            leases.acquire("parent", 1000)  # alive: its lease runs for an hour
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert leases.acquire("parent", 1000).epoch == 2
        leases.close()
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)


def test_keeper_renews_and_releases(tmp_path):
    leases = DirectoryLease(tmp_path)
    lease = leases.acquire("k", 300)
    keeper = LeaseKeeper(leases, lease, 300).start()
    time.sleep(0.5)  # past the first expiry: renewed in between
    other = DirectoryLease(tmp_path)
    # Only the (still held) owner.lock and the renewed expiry keep it: both must say busy.
    assert leases.current().expires_ms > lease.expires_ms
    keeper.close()
    assert leases.current().expires_ms == 0
    assert other.acquire("o", 300).epoch == lease.epoch + 1
    other.close()


def test_keeper_reports_a_take_over(tmp_path):
    clock = FakeClock(0)
    mine = DirectoryLease(tmp_path, clock=clock)
    lease = mine.acquire("me", 150)
    lost = []
    keeper = LeaseKeeper(mine, lease, 150, on_lost=lost.append)
    thief = DirectoryLease(tmp_path, clock=clock)
    clock.advance(1000)
    thief.acquire("thief", 60_000)
    keeper.start()
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lost and isinstance(lost[0], LeaseLostError)
    late: list = []
    keeper.watch(late.append)  # a watcher that comes after the loss hears of it at once
    assert late == lost[:1]
    keeper.close()  # does not release the thief's lease
    thief.check(thief.current())
    thief.close()


# -- the BookKeeper table service store (local gRPC server) ----------------------------------------


def test_bookkeeper_paused_owner_is_fenced_by_txn(tmp_path):
    """Same scenario on the table service: takes and writes are Txns guarded by the epoch key."""
    from pulsar_lifecycle.bucket.storage import bookkeeper_partition_storage
    from pulsar_lifecycle.bucket.storage.bookkeeper_lease import BookKeeperLease
    from pulsar_lifecycle.state.bk_table import BookKeeperTable
    from servers.bk_table_server import start_table_server

    clock = FakeClock(1_000_000)

    def open_partition(label: str, owner: str):
        return bookkeeper_partition_storage(server.url, "t", "ns", "w", label, owner, 5000, clock=clock)

    with start_table_server() as server:
        old_store, old_leases, old = open_partition("partition-1", "old")
        old_fenced = FencedSnapshotStorage(old_store, old_leases, old)
        old_fenced.put_cursor(b"c1")
        old_fenced.journal_append(b"r1")
        snap = old_fenced.create_snapshot(b"m0", [b"s0"], "k", "t", "c")
        with pytest.raises(LeaseBusyError):
            open_partition("partition-1", "new")
        # Another partition of the same table is independent.
        other_store, other_leases, _ = open_partition("partition-2", "x")
        assert other_store.get_cursor() is None
        other_leases.close()
        clock.advance(5000)  # the old owner is paused past its lease
        new_store, new_leases, new = open_partition("partition-1", "new")
        assert new.epoch == old.epoch + 1
        assert new_store.get_cursor() == b"c1"
        assert_fenced(old_fenced, old_leases, old, new_store, new_leases, new, snap)
        new_leases.release(new)
        # Released: the next owner takes it at once.
        table = BookKeeperTable(server.url, "t_ns", "w_buckets")
        assert BookKeeperLease(table, "bucket/partition-1/").acquire("next", 500).epoch == new.epoch + 1
        table.close()
        for closer in (old_store, new_store, old_leases, new_leases):
            closer.close()


# -- config checks and the instance count ----------------------------------------------------------


def test_validate_partitioned_writer_inputs():
    from pulsar_lifecycle.scheduler.config import check_writer_inputs

    sched, ticks = "persistent://public/default/s", "persistent://public/default/t"
    base = {"name": "w", "userConfig": {"schedulingTopic": sched, "tickTopic": ticks, "schedulingTopicPartitions": 4}}
    assert check_writer_inputs(dict(base, inputs=[ticks])) == []
    problems = check_writer_inputs(dict(base, inputs=[ticks, sched]))
    assert any("must not be a function input" in p for p in problems), problems


def test_validate_partitioned_writer_tick_input_reaches_every_instance():
    from pulsar_lifecycle.scheduler.config import check_writer_inputs

    sched, ticks = "persistent://public/default/s", "persistent://public/default/t"
    base = {"name": "w", "parallelism": 2,
            "userConfig": {"schedulingTopic": sched, "tickTopic": ticks, "schedulingTopicPartitions": 4}}
    assert check_writer_inputs(dict(base, inputSpecs={ticks: {"receiverQueueSize": 1}})) == []
    for specs in ({ticks: {"receiverQueueSize": 1000}}, {ticks: {}}, None):
        cfg = dict(base, inputSpecs=specs) if specs is not None else dict(base, inputs=[ticks])
        problems = check_writer_inputs(cfg)
        assert len(problems) == 1 and "receiverQueueSize: 1" in problems[0] and ticks in problems[0], problems
    # one instance is started by whatever tick it gets
    assert check_writer_inputs(dict(base, parallelism=1, inputs=[ticks])) == []


def test_num_instances_from_each_context_kind():
    from types import SimpleNamespace

    from pulsar_lifecycle.runtime.context_api import num_instances

    assert num_instances(SimpleNamespace(get_num_instances=lambda: 3)) == 3
    # Pulsar's ContextImpl: FunctionDetails.parallelism of its instance_config.
    details = SimpleNamespace(parallelism=5)
    assert num_instances(SimpleNamespace(instance_config=SimpleNamespace(function_details=details))) == 5
    assert num_instances(SimpleNamespace()) == 1


def test_bookkeeper_lease_reads_again_when_a_take_lands_between_its_two_gets():
    """The epoch key and the record are two gets; a take (one Txn) between them makes one read
    disagree. It is read again; only a disagreement that stays is an error."""
    import types

    from pulsar_lifecycle.bucket.storage.base import SnapshotStorageError
    from pulsar_lifecycle.bucket.storage.bookkeeper_lease import READ_ATTEMPTS, BookKeeperLease, epoch_value

    taken = Lease(1, "public/default/w/0/1-abc", 5_000)

    class Table:
        service = types.SimpleNamespace(url="bk://test")

        def __init__(self, stale_epoch_reads: int) -> None:
            self.stale = stale_epoch_reads

        def routed_get(self, _routing: bytes, key: bytes):
            if key.endswith(b"lease/epoch"):
                value = b"" if self.stale > 0 else epoch_value(taken)  # read before the take landed
                self.stale -= 1
            else:
                value = taken.encode()
            return types.SimpleNamespace(is_number=False, value=value) if value else None

    assert BookKeeperLease(Table(stale_epoch_reads=1), "bucket/partition-0/").current() == taken
    with pytest.raises(SnapshotStorageError, match="disagree"):
        BookKeeperLease(Table(stale_epoch_reads=READ_ATTEMPTS), "bucket/partition-0/").current()
