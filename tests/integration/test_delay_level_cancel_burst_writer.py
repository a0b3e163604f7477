"""Cancels of forwarded messages reach a real partitioned writer in time (issue 41, item 4), on real
Apache Pulsar: the DelayLevelSyncerService forwards 200 parked messages into a 4-partition
scheduling topic read by a partitioned BucketSnapshotWriter (`localrun --parallelism 2`,
`schedulingTopicPartitions` 4); then 200 cancels at 200/s, each sent 3 s or more before its message
is due. The writer applies every one (its `event=cancel_request ... outcome=cancelled` log line,
none `already_released`) and releases none of them; 40 uncancelled messages are released. The
cancel -> writer latency (cancel sent to the writer's log line) is printed, not asserted."""
from __future__ import annotations

import re
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Dict, List

import pulsar
import pytest
import yaml

from pulsar_lifecycle.dedup.recovery import PRODUCER_PROPERTY
from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.config import parse_syncer_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_MSG_ID_PROP
from pulsar_lifecycle.delaylevel.service import DelayLevelSyncerService
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import MessageRef
from pulsar_lifecycle.state.directory import DirectoryStateStore
from pulsar_lifecycle.timing import DelayedProducer
from support.crash_runs import (
    CrashBroker,
    ReleaseCount,
    admin_request,
    create_partitioned_topic,
    start_localrun,
    stop_all,
)
from support.helpers import wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.pulsar_only("a partitioned writer behind a partitioned scheduling topic the client routes to")]
NS = "persistent://public/default"
UNIT_S = 2
PARTITIONS = 4
N_CANCELLED, N_KEPT = 200, 40
CANCEL_LINE = re.compile(r"^(\S+ \S+) .*event=cancel_request id=(\S+) result=\S+ outcome=(\S+)")


def _writer_config(tmp_path: Path, t: Dict[str, str], unique: str) -> Path:
    w = yaml.safe_load((REPO / "function-configs" / "alternatives" / "bucket-snapshot-writer-partitioned.yaml").read_text())
    w["inputSpecs"] = {t["wticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    w.update(output=t["business"], name=f"dlcb-writer-{unique}")
    w["userConfig"].update(schedulingTopic=t["sched"], tickTopic=t["wticks"], tickMode="runner", tickTimeMillis=200,
                           schedulingTopicPartitions=PARTITIONS, partitionLeaseSeconds=5,
                           schedulingSubscription="writer")
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(w))
    return path


def _applied(log: Path) -> Dict[str, List[tuple]]:
    """cancel target -> [(epoch s of the writer's log line, outcome)]."""
    out: Dict[str, List[tuple]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = CANCEL_LINE.match(line)
        if m:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.setdefault(m.group(2), []).append((at, m.group(3)))
    return out


def _percentile(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def test_cancel_burst_of_forwarded_messages_applied_by_a_partitioned_writer(broker, tmp_path):
    unique = uuid.uuid4().hex[:8]
    t = {"sched": f"{NS}/dlcb-sched-{unique}", "wticks": f"{NS}/dlcb-wticks-{unique}",
         "business": f"{NS}/dlcb-biz-{unique}"}
    create_partitioned_topic(broker.admin_url, t["sched"], PARTITIONS)
    log = tmp_path / "writer.log"
    writer = start_localrun(_writer_config(tmp_path, t, unique), CrashBroker("pulsar", broker.service_url, broker),
                            tmp_path / "data-writer", log, "--parallelism", "2", log_level="INFO")
    client = quiet_client(broker.service_url)
    out = client.subscribe(t["business"], "count", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    tap = client.subscribe(t["sched"], "tap", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest)
    cfg = parse_syncer_config({"delayLevelTopic": t["business"] + "-delay-level", "schedulingTopic": t["sched"],
                               "schedulingSubscription": "writer", "partitionBy": "SECONDS", "unitSeconds": UNIT_S,
                               "messageMaximumDelayTimeSeconds": 30, "lookaheadMillis": 15000})
    service = DelayLevelSyncerService(cfg, client, subscription="syncer", producer_prefix="cb-syncer",
                                      state=DirectoryStateStore(tmp_path / "state", "public", "default", "syncer"),
                                      record_metric=lambda name, value: None).start()
    strategy = DelayLevelTopicPartitionStrategy(30, PartitionBy.SECONDS, unit_seconds=UNIT_S)
    producer = DelayLevelProducer(client, t["business"], DelayedProducer(client, scheduling_topic=t["sched"]),
                                  delay_level_topic=t["business"] + "-delay-level", strategy=strategy)
    count = ReleaseCount()
    forwards: Dict[str, str] = {}  # origin ref -> the forward's position in cancel form
    sent: Dict[str, float] = {}  # the forward's position -> when its cancel was sent (epoch s)
    due_ms: Dict[str, int] = {}
    try:
        # Wait for the writer's instances to read the scheduling topic's partitions.
        assert wait_for(lambda: all(_subscribed(broker.admin_url, t["sched"], k) for k in range(PARTITIONS)),
                        timeout=90, interval=0.5), log.read_text()[-3000:]
        n = N_CANCELLED + N_KEPT
        ids, due_of = [], []
        for i in range(n):
            due_of.append(int(time.time() * 1000) + 20000 + 10 * i)
            ids.append(producer.send(f"c{i}".encode(), deliver_at_ms=due_of[-1], key=f"k{i}" if i % 2 else None))
        assert all(i.parked for i in ids)
        deadline = time.monotonic() + 40
        while len(forwards) < n and time.monotonic() < deadline:
            try:
                m = tap.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            tap.acknowledge(m)
            if m.properties().get(PRODUCER_PROPERTY, "").startswith("cb-syncer"):
                forwards[m.properties()[ORIGIN_MSG_ID_PROP]] = MessageRef.of(m.message_id()).format_cancel()
        assert len(forwards) == n, f"{len(forwards)} of {n} forwarded"
        start = time.monotonic()
        for j, mid in enumerate(ids[:N_CANCELLED]):
            pause = start + j / 200.0 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            m_id = mid.message_id
            b = m_id.batch_index()
            ref = f"{m_id.ledger_id()}:{m_id.entry_id()}:{b}" if b >= 0 else f"{m_id.ledger_id()}:{m_id.entry_id()}"
            sent[forwards[ref]] = time.time()
            due_ms[forwards[ref]] = due_of[j]
            producer.cancel(mid)
        # Until every message is due, and a little longer: a cancelled one released late shows up.
        last_due = max(due_of) / 1000.0
        count.pump(out, max(0.0, last_due - time.time()) + 8)
    finally:
        service.stop()
        producer.close()
        stop_all([writer])
        client.close()
    applied = _applied(log)
    lead = [due_ms[k] / 1000.0 - at for k, at in sent.items()]
    assert min(lead) >= 3.0, f"a cancel sent only {min(lead):.1f} s before its message was due"
    cancelled_released = sorted(p for p in count.seen if int(p[1:]) < N_CANCELLED)
    not_applied = [k for k in sent if not any(o == "cancelled" for _, o in applied.get(k, []))]
    too_late = [k for k in sent if any(o == "already_released" for _, o in applied.get(k, []))]
    latencies = [1000 * (min(at for at, o in applied[k] if o == "cancelled") - s)
                 for k, s in sent.items() if k not in not_applied]
    print(f"\ncancel -> partitioned writer ({N_CANCELLED} cancels at 200/s, {PARTITIONS} partitions, 2 writer "
          f"instances): applied {len(latencies)}; p50 {_percentile(latencies, 0.5):.0f} ms, "
          f"p99 {_percentile(latencies, 0.99):.0f} ms, max {max(latencies, default=0):.0f} ms; "
          f"cancels sent {min(lead):.1f}-{max(lead):.1f} s before due")
    assert not cancelled_released, f"{len(cancelled_released)} released after their cancel, e.g. {cancelled_released[:5]}"
    assert not too_late, f"{len(too_late)} cancels reached the writer after the release, e.g. {too_late[:5]}"
    assert not not_applied, f"{len(not_applied)} cancels never applied by the writer, e.g. {not_applied[:5]}; log {log}"
    count.assert_exactly_once_never_early([f"c{i}".encode() for i in range(N_CANCELLED, N_CANCELLED + N_KEPT)])


def _subscribed(admin_url: str, topic: str, k: int) -> bool:
    res = admin_request(admin_url, "GET", f"{topic}-partition-{k}", "/stats")
    return res.status_code == 200 and "writer" in res.json().get("subscriptions", {})
