"""`inspect syncer` with a partitioned scheduling topic (issue 41) on real Apache Pulsar: the
syncer's forwards land on the topic's partitions, de-duplicated (and snapshotted) per partition,
and the handled position is recorded before each ack. The view finds each delay-level
partition's last forwarded message from them (it read the plain topic's name before, and showed
none), and nothing still parked behind it."""
from __future__ import annotations

import time
import uuid
from typing import Dict, Optional

import pulsar
import pytest
import yaml

from pulsar_lifecycle.cli.syncer_view import STATE_PREFIX, inspect_syncer
from pulsar_lifecycle.config.function_config import spec_from_config
from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.config import parse_syncer_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_MSG_ID_PROP
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.context_state import ContextStateStore
from pulsar_lifecycle.timing import DelayedProducer
from support.crash_runs import create_partitioned_topic
from support.paths import REPO

pytestmark = [pytest.mark.integration,
              pytest.mark.pulsar_only("pulsar-lite cannot create partitioned topics (only address partitions by name)")]
NS = "persistent://public/default"
UNIT_S = 2


class MemState:
    """The function state as localrun keeps it: the Context's str values, read back raw."""

    def __init__(self) -> None:
        self.values: Dict[str, bytes] = {}

    # the Context side (ContextStateStore writes base64 text through it)
    def put_state(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def get_state(self, key: str) -> Optional[bytes]:
        return self.values.get(key)

    # the StateStore side inspect reads
    def get(self, key: str) -> Optional[bytes]:
        return self.values.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value


def test_inspect_syncer_reads_the_last_forward_of_each_partition_over_a_partitioned_scheduling_topic(broker):
    unique = uuid.uuid4().hex[:8]
    sched, business = f"{NS}/isp-sched-{unique}", f"{NS}/isp-biz-{unique}"
    create_partitioned_topic(broker.admin_url, sched, 4)
    cfg = yaml.safe_load((REPO / "function-configs" / "delay-level-syncer.yaml").read_text())
    cfg.update(name=f"isp-syncer-{unique}", subName=f"isp-syncer-{unique}")
    cfg["userConfig"].update(delayLevelTopic=business + "-delay-level", schedulingTopic=sched, partitionBy="SECONDS",
                             unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=20, lookaheadMillis=9000)
    spec = spec_from_config(cfg)
    fqfn = f"public/default/{cfg['name']}"
    state = MemState()
    client = quiet_client(broker.service_url)
    tap = client.subscribe(sched, "tap", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    service = DelayLevelSyncerService(parse_syncer_config(cfg["userConfig"]), client, subscription=cfg["subName"],
                                      producer_prefix=f"{fqfn}-0", state=ContextStateStore(state, prefix=STATE_PREFIX),
                                      record_metric=lambda name, value: None).start()
    strategy = DelayLevelTopicPartitionStrategy(20, PartitionBy.SECONDS, unit_seconds=UNIT_S)
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=sched),
                                  delay_level_topic=business + "-delay-level", strategy=strategy)
    try:
        ids = [producer.send(f"m{i}".encode(), delay_ms=4000 + 100 * i, key=f"k{i}") for i in range(40)]
        levels = {i.partition for i in ids}
        last: Dict[int, str] = {}
        for i in ids:
            m = i.message_id
            last[i.partition] = f"{m.ledger_id()}:{m.entry_id()}:{max(0, m.batch_index())}"  # type: ignore[index]
        got, deadline = 0, time.monotonic() + 30
        while got < len(ids) and time.monotonic() < deadline:
            try:
                m = tap.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            tap.acknowledge(m)
            got += ORIGIN_MSG_ID_PROP in m.properties()
        assert got == len(ids), f"{got} of {len(ids)} forwarded"
        time.sleep(1)  # the last batch's ack
    finally:
        service.stop()
        producer.close()
    try:
        report = inspect_syncer(spec, client, state, admin_url=broker.admin_url, empty_wait_s=None, timeout_s=20)
    finally:
        client.close()
    parts = {p.partition: p for p in report.partitions}
    shown = {k: parts[k].last_forwarded for k in levels}
    assert shown == {k: last[k] for k in levels}, f"last forwarded per delay-level partition: {shown}, sent {last}"
    assert all(parts[k].parked == 0 for k in levels), {k: parts[k].parked for k in levels}
