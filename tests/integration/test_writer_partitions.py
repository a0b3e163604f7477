"""The partitioned writer with its index on the BookKeeper table service (local gRPC server):
two instances in one local run split 4 scheduling partitions, each partition's lease and index
live under `bucket/partition-<k>/` of the writer's table; every message released once, none early."""
from __future__ import annotations

import time

import pulsar
import pytest

from pulsar_lifecycle.bucket.storage.bookkeeper_lease import BookKeeperLease
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
