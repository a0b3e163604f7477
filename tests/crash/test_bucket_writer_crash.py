"""BucketSnapshotWriter under SIGKILL: 50,000 delayed messages released exactly once, never early
(direct intake, the shipped config), and a smaller run with runtime intake."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pulsar
import pytest
import yaml

from pulsar_lifecycle.runtime.broker import free_port, port_open
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP
from pulsar_lifecycle.timing import now_ms
from support.helpers import publish_all, stop_process, wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO


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


def localrun(config: Path, port: int, tmp_path: Path) -> subprocess.Popen:
    """localrun with its own embedded broker: SIGKILL takes the broker down with it.

    (A separate pulsar-lite keeps a SIGKILLed client's consumer registered when the socket is
    reset, holding its unacked messages until the broker restarts; see docs/operations.md.)
    """
    with open(tmp_path / "localrun.log", "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "WARNING", "localrun",
             "--function-config-file", str(config), "--embedded-broker-port", str(port),
             "--data-dir", str(tmp_path / "data")],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp_path,
        )
    assert wait_for(lambda: port_open("127.0.0.1", port), timeout=30), (tmp_path / "localrun.log").read_text()[-2000:]
    return proc


@pytest.mark.parametrize("intake, n, max_delay_ms, kills, kill_window_s", [
    ("direct", 50_000, 120_000, 5, 100),  # the acceptance run, on the shipped config
    ("runtime", 10_000, 30_000, 2, 25),  # the other intake, smaller
])
def test_delayed_messages_with_sigkills_released_exactly_once(tmp_path, unique, intake, n, max_delay_ms, kills,
                                                               kill_window_s):
    config, sched, out = write_config(tmp_path, unique, intake)
    port = free_port()
    proc = localrun(config, port, tmp_path)
    client = quiet_client(f"pulsar://127.0.0.1:{port}")
    counter = client.subscribe(out, "count", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
    producer = client.create_producer(sched, batching_enabled=True, batching_max_publish_delay_ms=5,
                                      max_pending_messages=5000, block_if_queue_full=True)
    rng = random.Random(1234)
    expected = {}
    base = now_ms()
    # payload -> distinct message ids: a copy on the topic has a new id, a redelivery the same one.
    seen: dict = {}
    early = []

    def pump(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(seen) < n:
            try:
                m = counter.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            key = m.data()
            mid = m.message_id()
            seen.setdefault(key, set()).add((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
            deliver_at = int(m.properties()[DELIVER_AT_PROP])
            if int(m.properties()[RELEASED_AT_PROP]) < deliver_at or time.time() * 1000 < deliver_at:
                early.append(key)
            counter.acknowledge(m)

    try:
        for i in range(n):
            expected[f"d{i}".encode()] = base + rng.randint(0, max_delay_ms)
        publish_all(producer, list(expected), [{DELIVER_AT_PROP: str(at)} for at in expected.values()])
        kill_times = sorted(rng.uniform(2, kill_window_s) for _ in range(kills))
        t0 = time.monotonic()
        for kt in kill_times:
            pump(max(0.0, kt - (time.monotonic() - t0)))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc = localrun(config, port, tmp_path)
        remaining = (base + max_delay_ms - now_ms()) / 1000.0
        pump(max(0.0, remaining) + 60)
        pump(3)  # anything released twice late would show up here
    finally:
        stop_process(proc)
        client.close()
    missing = set(expected) - set(seen)
    twice = {k: len(ids) for k, ids in seen.items() if len(ids) > 1}
    assert not missing, f"{len(missing)} never released, e.g. {sorted(missing)[:5]}"
    assert not twice, f"{len(twice)} released more than once, e.g. {list(twice.items())[:5]}"
    assert not early, f"{len(early)} released early, e.g. {early[:5]}"
    assert len(seen) == n
