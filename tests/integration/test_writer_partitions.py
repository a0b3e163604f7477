"""The partitioned writer with its index on the BookKeeper table service (local gRPC server):
two instances in one local run split 4 scheduling partitions, each partition's lease and index
live under `bucket/partition-<k>/` of the writer's table; every message released once, none early."""
from __future__ import annotations

import time

import pulsar
import pytest

from pulsar_lifecycle.bucket.storage.bookkeeper_lease import BookKeeperLease
from pulsar_lifecycle.bucket.storage.lease import new_incarnation
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from pulsar_lifecycle.state.bk_table import BookKeeperTable
from servers.bk_table_server import start_table_server
from support.helpers import publish_all, receive_payloads, shipped_writer_spec, wait_for

pytestmark = [pytest.mark.integration]
PARTITIONS = 4


def test_two_instances_split_partitions_on_the_table_service(broker, tmp_path, unique):
    with start_table_server() as server:
        spec, sched = shipped_writer_spec(unique[-8:], "wp-", schedulingTopicPartitions=PARTITIONS,
                                          snapshotStorage="bookkeeper", snapshotStorageServiceUrl=server.url)
        spec.parallelism = 2
        # The ticks spread over the instances (a receiver queue of 1), so both start.
        spec.input_specs[next(iter(spec.input_specs))]["receiverQueueSize"] = 1
        runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)).start()
        client = quiet_client(broker.service_url)
        try:
            out = client.subscribe(spec.output, "check", consumer_type=pulsar.ConsumerType.Shared,
                                   initial_position=pulsar.InitialPosition.Earliest)
            due = {}
            now = int(time.time() * 1000)
            for k in range(PARTITIONS):
                prod = client.create_producer(f"{sched}-partition-{k}", batching_enabled=True,
                                              batching_max_publish_delay_ms=5)
                keys = [f"k{k}-{i}" for i in range(10)]
                for j, key in enumerate(keys):
                    due[key] = now + 300 + 100 * j
                publish_all(prod, [x.encode() for x in keys], [{DELIVER_AT_PROP: str(due[x])} for x in keys])
                prod.close()
            got = []
            deadline = time.monotonic() + 30
            while len(got) < len(due) and time.monotonic() < deadline:
                try:
                    m = out.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                got.append((m.data().decode(), int(m.properties()[RELEASED_AT_PROP])))
                out.acknowledge(m)
            got_keys = [k for k, _ in got]
            got_keys += receive_payloads(out, 1, 1.0)  # a duplicate would show up here
            assert sorted(got_keys) == sorted(due), (len(got_keys), len(due))
            assert all(released >= due[k] for k, released in got), "released early"
            # Each partition's lease is held by the instance k % 2 names.
            fns = runner.functions()
            assert wait_for(lambda: all(f.service is not None for f in fns), timeout=10)
            assert sorted(fns[0].service.services) == [0, 2] and sorted(fns[1].service.services) == [1, 3]
            table = BookKeeperTable(server.url, "public_default", f"{spec.name}_buckets".replace("-", "_"))
            try:
                for k in range(PARTITIONS):
                    lease = BookKeeperLease(table, f"bucket/partition-{k}/")
                    lease_owner = lease.current()
                    assert lease_owner is not None and lease_owner.owner.split("/")[-2] == str(k % 2)
            finally:
                table.close()
        finally:
            client.close()
            runner.stop()


def test_an_idle_partition_taken_over_stops_at_once_and_is_claimed_again_when_freed(broker, tmp_path, unique):
    """A later incarnation of instance 0 (a rebalance's new copy) takes partition 0 while the
    running copy has nothing to write or release: the running copy's renewal finds the lease
    taken and stops that partition's service (its producers close, out of the successor's way)
    without waiting for a write; its other partition runs on; once the successor releases the
    lease, the copy claims the partition again and releases what is due there, once."""
    with start_table_server() as server:
        spec, sched = shipped_writer_spec(unique[-8:], "wt-", schedulingTopicPartitions=2, partitionLeaseSeconds=3,
                                          snapshotStorage="bookkeeper", snapshotStorageServiceUrl=server.url)
        runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)).start()
        client = quiet_client(broker.service_url)
        table = BookKeeperTable(server.url, "public_default", f"{spec.name}_buckets".replace("-", "_"))
        try:
            fns = runner.functions()
            assert wait_for(lambda: fns[0].service is not None and sorted(fns[0].service.services) == [0, 1],
                            timeout=30)
            writer = fns[0].service
            lease = BookKeeperLease(table, "bucket/partition-0/")
            held = lease.current()
            assert held is not None
            successor = f"{held.owner.rsplit('/', 1)[0]}/{new_incarnation(int(time.time() * 1000) + 60_000)}"
            taken = lease.acquire(successor, 60_000)
            assert taken.epoch == held.epoch + 1
            # Stopped by the renewal (every second here), not by a write: nothing is due or sent.
            assert wait_for(lambda: 0 not in writer.services and 0 in writer.waiting, timeout=10), writer.waiting
            assert 1 in writer.services
            time.sleep(2)  # claimed again every round meanwhile: the running copy cannot take it back
            assert 0 not in writer.services and lease.current() == taken
            lease.release(taken)
            assert wait_for(lambda: 0 in writer.services, timeout=15), writer.waiting
            out = client.subscribe(spec.output, "check", initial_position=pulsar.InitialPosition.Earliest)
            prod = client.create_producer(f"{sched}-partition-0")
            due = int(time.time() * 1000) + 300
            prod.send(b"after", properties={DELIVER_AT_PROP: str(due)})
            prod.close()
            got = receive_payloads(out, 1, 15.0) + receive_payloads(out, 1, 1.0)
            assert got == ["after"], got
        finally:
            table.close()
            client.close()
            runner.stop()
