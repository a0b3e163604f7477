"""A BucketSnapshotWriter with a brand-new index SIGKILLed before its first durable batch while
its direct consumer holds scheduling messages, on a pulsar-lite that lives on: the restarted
writer releases every one of them, once and none early, without a broker restart.

The messages reach the writer's connection while its process is stopped: unread in its socket at
the kill, so the connection ends with a reset, and pulsar-lite keeps the dead consumer with them
until it restarts. The index has nothing added, so its floor is the one taken at its first start
(`intake/start`, scheduler/intake_gaps.py): the topic's end then, or its beginning when it held
no message. With messages already on the topic and acked on the subscription before the first
start (another index's), the floor is their end: none of them is read or released. Apache Pulsar
hands a dead consumer's messages to the next one by itself (test_bucket_writer_crash.py).
"""
from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pulsar
import pytest
import yaml

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.crash_runs import CrashBroker, ReleaseCount, sigkill, start_localrun, stop_all
from support.helpers import wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration]
NS = "persistent://public/default"
HELD = 400
DELAY_MS = 5000  # due after the restart: released early would show
RECOVERY_S = 40  # from the restart to the last release; a loaded machine adds
GAP_FOUND = re.compile(r"event=intake_gap_read how=gap .* found=(\d+) ")


def writer_config(tmp_path: Path, unique: str) -> "tuple[Path, str, str]":
    """The shipped writer config (direct intake, the scheduling topic also an input with receiver
    queue 1) on this test's topics, runner ticks so it starts without a scheduling message."""
    sched, business = f"{NS}/fresh-sched-{unique}", f"{NS}/fresh-biz-{unique}"
    ticks = f"{NS}/fresh-ticks-{unique}"
    w = yaml.safe_load((REPO / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    w["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"},
                       sched: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    w.update(output=business, name=f"fresh-writer-{unique}", subName="writer")
    w["userConfig"].update(schedulingTopic=sched, schedulingSubscription="writer", tickTopic=ticks,
                           tickMode="runner", tickTimeMillis=200, snapshotStorage="directory",
                           snapshotDir=str(tmp_path / "snapshots"))
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(w))
    return path, sched, business


@pytest.mark.lite_only("Apache Pulsar redelivers a dead consumer's messages (test_bucket_writer_crash.py)")
@pytest.mark.parametrize("before", [0, 60], ids=["empty-topic", "acked-before-start"])
def test_a_fresh_writers_held_tail_is_released_after_its_restart(broker, tmp_path, unique, before):
    config, sched, business = writer_config(tmp_path, unique[-8:])
    shared = CrashBroker("lite", broker.service_url)  # outlives the writer's processes
    log = tmp_path / "writer.log"
    client = quiet_client(broker.service_url)
    delayed = DelayedProducer(client, scheduling_topic=sched)
    procs = []
    try:
        if before:
            # Another index's messages: on the topic and acked on the subscription before the
            # first start. The new index must not read them (they would be released again).
            for i in range(before):
                delayed.send(business, b"old%d" % i, now_ms() + DELAY_MS)
            other = client.subscribe(sched, "writer", consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest)
            for _ in range(before):
                other.acknowledge(other.receive(timeout_millis=10_000))
            other.close()
        counter = client.subscribe(business, "count", consumer_type=pulsar.ConsumerType.Shared,
                                   initial_position=pulsar.InitialPosition.Earliest)
        procs.append(start_localrun(config, shared, tmp_path / "data", log, log_level="INFO"))
        assert wait_for(lambda: "event=scheduling_consumer_subscribed" in log.read_text(), timeout=60), \
            log.read_text()[-3000:]
        time.sleep(2)  # idle: the consumer waits for messages
        procs[0].send_signal(signal.SIGSTOP)
        sent = [b"held%d" % i for i in range(HELD)]
        for p in sent:
            delayed.send_async(business, p, now_ms() + DELAY_MS, lambda res, _mid: None)
        delayed.flush()
        time.sleep(1)  # dispatched into the stopped writer's socket
        sigkill(procs.pop())
        first_run = log.read_text()
        procs.append(start_localrun(config, shared, tmp_path / "data", log, log_level="INFO"))
        restarted = time.monotonic()
        count = ReleaseCount()
        count.pump(counter, RECOVERY_S, until=HELD)
        took = time.monotonic() - restarted
        count.pump(counter, 3)  # a copy released late, or an old message, would show up here
        after = log.read_text()[len(first_run):]
        where = f"; restarted writer's log: {after[-3000:]}"
        assert len(count.seen) == HELD, (f"{HELD - len(set(sent) & set(count.seen))} of {HELD} held messages not "
                                         f"released {RECOVERY_S} s after the restart (no broker restart){where}")
        count.assert_exactly_once_never_early(sent, where)
        read = sum(int(n) for n in GAP_FOUND.findall(after))
        assert read > 0, f"nothing was read from a gap: the messages were not held{where}"
        print(f"before={before}: {read} of {HELD} read from the held tail; all released {took:.1f} s after the "
              f"restart")
    finally:
        stop_all(procs)
        delayed.close()
        client.close()
