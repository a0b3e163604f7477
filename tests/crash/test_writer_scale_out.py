"""Writer scale-out (function-configs/alternatives/bucket-snapshot-writer-partitioned.yaml) on pulsar-lite and
on real Apache Pulsar: 4 scheduling partitions, `localrun --parallelism` 1 -> 2 -> 3 -> 1 with a
SIGKILL before every change. Every message is released exactly once (counted on the output topic
from its start) and none before its deliver-at time; each phase's partition leases name the
owner the assignment gives (k % parallelism). On pulsar-lite the partitions are addressed by
name; on real Pulsar the scheduling topic is a partitioned topic created through the admin REST
API, and producers publish to it as usual (the client spreads the messages over its partitions)."""
from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

import pulsar
import pytest
import yaml

from pulsar_lifecycle.bucket.storage.directory_lease import DirectoryLease
from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from support.broker_fixtures import broker_kinds
from support.crash_runs import (
    crash_broker,
    create_partitioned_topic,
    partition_count,
    sigkill,
    start_localrun,
    topic_stats,
)
from support.helpers import publish_all, stop_process, wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 4
PER_PARTITION = 40  # per phase


def _config(tmp_path: Path, unique: str) -> tuple:
    cfg = load_function_config(REPO / "function-configs" / "alternatives" / "bucket-snapshot-writer-partitioned.yaml")
    sched = f"persistent://public/default/so-sched-{unique}"
    ticks = f"persistent://public/default/so-ticks-{unique}"
    out = f"persistent://public/default/so-out-{unique}"
    cfg["name"] = f"so-writer-{unique}"
    # Ticks only, a receiver queue of 1 each: the broker spreads the ticks, so every instance starts.
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    cfg["output"] = out
    cfg["userConfig"] = dict(cfg["userConfig"], schedulingTopic=sched, tickTopic=ticks, tickMode="runner",
                             tickTimeMillis=200, schedulingTopicPartitions=PARTITIONS, partitionLeaseSeconds=5)
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg, sched, out


def _owners(partition_dirs: list) -> dict:
    """partition -> (epoch, instance id) from each partition's lease record."""
    out = {}
    for k, d in enumerate(partition_dirs):
        lease = DirectoryLease(d).current()
        if lease is not None and lease.expires_ms:
            out[k] = (lease.epoch, int(lease.owner.rsplit("/", 2)[1]))
    return out


@pytest.mark.parametrize("kind", broker_kinds())
def test_parallelism_1_2_3_1_with_sigkills_exactly_once_never_early(request, tmp_path, kind):
    broker = crash_broker(request, kind)
    # Short names: the dedup state's file names hold the producer and topic names.
    config, cfg, sched, out = _config(tmp_path, uuid.uuid4().hex[:8])
    url = broker.service_url
    if broker.standalone is not None:
        create_partitioned_topic(broker.admin_url, sched, PARTITIONS)
        assert partition_count(broker.admin_url, sched) == PARTITIONS
    data = tmp_path / "data"
    log = tmp_path / "localrun.log"
    table = f"public_default_{cfg['name']}".replace("-", "_")
    partition_dirs = [data / "buckets" / table / f"partition-{k}" for k in range(PARTITIONS)]
    rng = random.Random(7)
    sent: dict = {}  # key -> deliver-at ms
    epochs: dict = {}
    proc = None
    try:
        for phase, parallelism in enumerate((1, 2, 3, 1)):
            proc = start_localrun(config, broker, data, log, "--parallelism", str(parallelism))
            client = quiet_client(url)
            try:
                now = int(time.time() * 1000)
                # pulsar-lite: a producer per partition, by name; real Pulsar: one on the
                # partitioned topic, round robin over its partitions (per message: unbatched).
                on_pulsar = broker.standalone is not None
                targets = [sched] if on_pulsar else [f"{sched}-partition-{k}" for k in range(PARTITIONS)]
                for k, target in enumerate(targets):
                    prod = client.create_producer(target, batching_enabled=not on_pulsar, batching_max_publish_delay_ms=5,
                                                  message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
                    keys = [f"p{phase}-k{k}-{i}" for i in range(PER_PARTITION * PARTITIONS // len(targets))]
                    # Due from 0.3 s to 6 s ahead: some leave in this phase, the rest across the kills.
                    due = [now + rng.randint(300, 6000) for _ in keys]
                    publish_all(prod, [x.encode() for x in keys], [{DELIVER_AT_PROP: str(d)} for d in due])
                    prod.close()
                    sent.update(zip(keys, due))
            finally:
                client.close()
            # Each partition taken by the instance the assignment names, under a new epoch (the
            # killed owner's record names the same instance id for some partitions).
            want = {k: k % parallelism for k in range(PARTITIONS)}

            def taken(want=want) -> bool:
                now_owners = _owners(partition_dirs)
                return all(k in now_owners and now_owners[k][1] == i and now_owners[k][0] > epochs.get(k, 0)
                           for k, i in want.items())
            assert wait_for(taken, timeout=30), (parallelism, epochs, _owners(partition_dirs), log.read_text()[-3000:])
            epochs.update({k: e for k, (e, _) in _owners(partition_dirs).items()})
            time.sleep(2.5)  # releases flow; the kill lands among them
            if phase < 3:
                sigkill(proc)

        # The last phase (parallelism 1) releases the rest; read the output topic from its start.
        client = quiet_client(url)
        try:
            consumer = client.subscribe(out, "audit", consumer_type=pulsar.ConsumerType.Shared,
                                        initial_position=pulsar.InitialPosition.Earliest)
            got: dict = {}
            early = []
            deadline = time.monotonic() + max(20.0, (max(sent.values()) - time.time() * 1000) / 1000 + 15)
            quiet_until = None
            while time.monotonic() < deadline:
                try:
                    m = consumer.receive(timeout_millis=200)
                except pulsar.Timeout:
                    if quiet_until is not None and time.monotonic() >= quiet_until:
                        break
                    continue
                key = m.data().decode()
                got.setdefault(key, set()).add((m.message_id().ledger_id(), m.message_id().entry_id(),
                                                m.message_id().batch_index()))
                # The writer's clock when it sent the release (a batch's publish_timestamp is when
                # the batch opened, possibly for an earlier release).
                released_at = int(m.properties()[RELEASED_AT_PROP])
                if released_at < sent.get(key, 0):
                    early.append((key, sent[key], released_at))
                consumer.acknowledge(m)
                if len(got) == len(sent) and quiet_until is None:
                    quiet_until = time.monotonic() + 1.5  # then a little longer: a late duplicate shows up
        finally:
            client.close()
    finally:
        if proc is not None:
            stop_process(proc)
    if broker.standalone is not None:  # the messages really came through every partition
        received = {k: topic_stats(broker.admin_url, f"{sched}-partition-{k}").get("msgInCounter", 0)
                    for k in range(PARTITIONS)}
        assert all(received.values()), received
    missing = sorted(set(sent) - set(got))
    twice = {k: v for k, v in got.items() if len(v) > 1}
    unknown = sorted(set(got) - set(sent))
    assert not missing, f"{len(missing)} of {len(sent)} never released, e.g. {missing[:5]}"
    assert not twice, f"{len(twice)} released more than once, e.g. {list(twice.items())[:3]}"
    assert not unknown, unknown[:5]
    assert not early, f"{len(early)} released early, e.g. {early[:3]}"
