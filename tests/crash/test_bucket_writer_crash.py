"""BucketSnapshotWriter under SIGKILL, on pulsar-lite and on real Apache Pulsar: every delayed
message released exactly once, never early (direct intake, the shipped config, and runtime
intake); on real Pulsar also with the broker's own de-duplication on, across SIGKILLs, a broker
restart and a new index on the same output topics."""
from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP
from pulsar_lifecycle.timing import now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import CrashBroker, ReleaseCount, crash_broker, sigkill, start_localrun, topic_stats
from support.helpers import publish_all, stop_process
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO

# (intake, broker kind) -> messages, largest delay (ms), SIGKILLs, window the kills fall in (s).
# pulsar-lite runs the most messages on the shipped config; real Pulsar a shorter run (the suite
# runs on both within its time budget).
SIZES: Dict[Tuple[str, str], Tuple[int, int, int, int]] = {
    ("direct", "lite"): (50_000, 60_000, 5, 50),
    ("runtime", "lite"): (10_000, 30_000, 2, 25),
    ("direct", "pulsar"): (20_000, 60_000, 4, 50),
    ("runtime", "pulsar"): (10_000, 30_000, 2, 25),
}


def write_config(tmp_path: Path, unique: str, intake: str = "direct", **user) -> tuple:
    cfg = yaml.safe_load((ROOT / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    sched = f"persistent://public/default/csched-{unique}"
    ticks = f"persistent://public/default/cticks-{unique}"
    out = f"persistent://public/default/creleased-{unique}"
    # The shipped config: direct intake (schedulingTopic) and the scheduling topic also an input on
    # the same subscription (receiver queue 1), which starts the writer; the held tick wakes it.
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"},
                         sched: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    cfg.update(output=out, name=f"cwriter-{unique}", subName=f"cwriter-{unique}")
    cfg["userConfig"].update(schedulingTopic=sched, schedulingSubscription=f"cwriter-{unique}", tickTopic=ticks,
                             snapshotDir=str(tmp_path / "snapshots"), tickTimeMillis=200, **user)
    if intake == "runtime":  # the scheduling topic as a function input, one message per process()
        del cfg["userConfig"]["schedulingTopic"]
        del cfg["userConfig"]["schedulingSubscription"]
        cfg["inputSpecs"][sched] = {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1000}
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, sched, out


def run_with_sigkills(broker: CrashBroker, config: Path, tmp_path: Path, sched: str, counters: Sequence[str],
                      messages: Dict[bytes, Dict[str, str]], kill_times: List[float], max_delay_ms: int,
                      between: Optional[Callable[[int], None]] = None) -> ReleaseCount:
    """Start the writer, publish `messages` (payload -> properties) to `sched`, SIGKILL and restart
    the writer at `kill_times` (s after the publish), then count the releases on `counters` until
    every message was seen (or 60 s after the last one was due) and 3 s more for late copies.
    `between(i)` runs after the i-th restart (a broker restart, say)."""
    data, log = tmp_path / "data", tmp_path / "localrun.log"
    proc = start_localrun(config, broker, data, log, cwd=tmp_path)
    client = quiet_client(broker.service_url)
    tally = ReleaseCount()
    n = len(messages)
    try:
        consumers = [client.subscribe(t, "count", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
                     for t in counters]
        producer = client.create_producer(sched, batching_enabled=True, batching_max_publish_delay_ms=5,
                                          max_pending_messages=5000, block_if_queue_full=True)
        base = now_ms()
        publish_all(producer, list(messages), list(messages.values()))

        def pump(seconds: float, until: int = n) -> None:  # the counters in turn, up to 0.5 s each
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and len(tally.seen) < until:
                for c in consumers:
                    tally.pump(c, min(0.5, max(0.0, deadline - time.monotonic())), until=until)

        t0 = time.monotonic()
        for i, kt in enumerate(kill_times):
            pump(max(0.0, kt - (time.monotonic() - t0)))
            sigkill(proc)
            proc = start_localrun(config, broker, data, log, cwd=tmp_path)
            if between is not None:
                between(i)
        pump(max(0.0, (base + max_delay_ms - now_ms()) / 1000.0) + 60)
        pump(3, until=n + 1)  # anything released twice late would show up here
    finally:
        stop_process(proc)
        client.close()
    return tally


@pytest.mark.parametrize("kind", broker_kinds())
@pytest.mark.parametrize("intake", ["direct", "runtime"])
def test_delayed_messages_with_sigkills_released_exactly_once(request, tmp_path, unique, intake, kind):
    broker = crash_broker(request, kind)
    n, max_delay_ms, kills, kill_window_s = SIZES[intake, kind]
    config, sched, out = write_config(tmp_path, unique, intake)
    rng = random.Random(1234)
    base = now_ms()
    messages = {f"d{i}".encode(): {DELIVER_AT_PROP: str(base + rng.randint(0, max_delay_ms))} for i in range(n)}
    kill_times = sorted(rng.uniform(2, kill_window_s) for _ in range(kills))
    tally = run_with_sigkills(broker, config, tmp_path, sched, [out], messages, kill_times, max_delay_ms)
    tally.assert_exactly_once_never_early(messages, f" (logs in {tmp_path})")


@pytest.mark.pulsar_only("pulsar-lite has no broker de-duplication")
@pytest.mark.parametrize("kind", broker_kinds())
def test_broker_deduplication_drops_no_release_across_sigkills_a_broker_restart_and_a_new_index(
        request, tmp_path, unique, kind):
    # The writer's releases name their producer and carry explicit sequence ids, which the
    # broker's de-duplication keys on: whatever it drops as a duplicate must really be one.
    broker = crash_broker(request, kind, deduplication=True)
    standalone = broker.standalone
    assert standalone is not None
    other = f"persistent://public/default/cother-{unique}"  # a per-message target: a second channel
    config, sched, out = write_config(tmp_path, unique, allowedTargetPrefix="persistent://public/default/")
    n, max_delay_ms = 10_000, 40_000
    rng = random.Random(99)
    base = now_ms()
    messages: Dict[bytes, Dict[str, str]] = {}
    for i in range(n):
        props = {DELIVER_AT_PROP: str(base + rng.randint(0, max_delay_ms))}
        if i % 4 == 0:
            props[TARGET_PROP] = other
        messages[f"d{i}".encode()] = props

    def restart_broker(i: int) -> None:
        if i == 1:  # the writer runs on; its client reconnects and re-sends what was pending
            standalone.restart()

    tally = run_with_sigkills(broker, config, tmp_path, sched, [out, other], messages, [4.0, 9.0, 30.0],
                              max_delay_ms, between=restart_broker)
    tally.assert_exactly_once_never_early(messages, f" (first run; logs in {tmp_path})")
    for topic in (out, other):
        assert topic_stats(broker.admin_url, topic).get("deduplicationStatus") == "Enabled", topic

    # A new index on the same topics (snapshots and function state gone): its releases keep the
    # producer names, so their sequence ids must lie above everything the broker has stored.
    shutil.rmtree(tmp_path / "snapshots")
    shutil.rmtree(tmp_path / "data")
    later = now_ms()
    fresh = {f"e{i}".encode(): {DELIVER_AT_PROP: str(later + rng.randint(1000, 4000)),
                                **({TARGET_PROP: other} if i % 4 == 0 else {})} for i in range(400)}
    again = run_with_sigkills(broker, config, tmp_path, sched, [out, other], fresh, [], 4000)
    again.assert_exactly_once_never_early(fresh, f" (new index; logs in {tmp_path})")
