"""The writer's release pipeline under SIGKILL, on pulsar-lite and on real Apache Pulsar.

The release thread pops and sends the next round while earlier rounds' confirmations are
outstanding (up to `releaseRoundsInFlight` rounds). A SIGKILL then lands with rounds in flight:
sent, maybe stored, not confirmed, beyond the committed release watermark. Bursts of messages due
at the same instant keep several full rounds in flight; a 10 ms commit interval has the watermark
move while they are. Every message must still be released once: the watermark never passes an
unconfirmed round (a lost message otherwise) and the re-released tail is de-duplicated (a double
otherwise). With the watermark committed when a round is popped, before its sends are confirmed,
this test fails on pulsar-lite with 1,142 of 30,000 never released; a watermark that passes only
rounds already handed to the client got through one run there (on loopback nearly everything
handed over is stored at once), so it checks the order pop -> send -> confirm -> commit, not the
last hop (docs/architecture.md, "Release pipeline").
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP
from pulsar_lifecycle.timing import now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import CrashBroker, ReleaseCount, crash_broker, sigkill, start_localrun
from support.helpers import publish_all, stop_process
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# broker kind -> (bursts, messages per burst, spread messages)
SIZES: Dict[str, Tuple[int, int, int]] = {
    "lite": (6, 4000, 6000),
    "pulsar": (4, 3000, 4000),
}
BURST_EVERY_MS = 3000
FIRST_BURST_MS = 3000


def write_config(tmp_path: Path, unique: str, **user: object) -> Tuple[Path, str, str]:
    """The shipped writer config (direct intake) on this test's topics, with `user` settings."""
    cfg = yaml.safe_load((REPO / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    sched = f"persistent://public/default/psched-{unique}"
    ticks = f"persistent://public/default/pticks-{unique}"
    out = f"persistent://public/default/preleased-{unique}"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"},
                         sched: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe", "receiverQueueSize": 1}}
    cfg.update(output=out, name=f"pwriter-{unique}", subName=f"pwriter-{unique}")
    cfg["userConfig"].update(schedulingTopic=sched, schedulingSubscription=f"pwriter-{unique}", tickTopic=ticks,
                             snapshotDir=str(tmp_path / "snapshots"), tickTimeMillis=200, **user)
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, sched, out


def run_killing_mid_release(broker: CrashBroker, config: Path, tmp_path: Path, sched: str, out: str,
                            messages: Dict[bytes, Dict[str, str]], kill_at: List[int], last_due_ms: int) -> ReleaseCount:
    """Start the writer, publish `messages`, and SIGKILL (then restart) it each time the count of
    distinct releases seen passes the next of `kill_at`: while releases stream out, so with rounds
    in flight. Then count until every message was seen (or 60 s after the last was due) and 3 s
    more for late copies."""
    data, log = tmp_path / "data", tmp_path / "localrun.log"
    proc = start_localrun(config, broker, data, log, cwd=tmp_path)
    client = quiet_client(broker.service_url)
    tally = ReleaseCount()
    n = len(messages)
    try:
        consumer = client.subscribe(out, "count", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
        producer = client.create_producer(sched, batching_enabled=True, batching_max_publish_delay_ms=5,
                                          max_pending_messages=5000, block_if_queue_full=True)
        base = now_ms()
        publish_all(producer, list(messages), list(messages.values()))
        for threshold in kill_at:
            deadline = time.monotonic() + 120
            while len(tally.seen) < threshold and time.monotonic() < deadline:
                tally.pump(consumer, 0.05, until=threshold)
            sigkill(proc)
            proc = start_localrun(config, broker, data, log, cwd=tmp_path)
        tally.pump(consumer, max(0.0, (base + last_due_ms - now_ms()) / 1000.0) + 60, until=n)
        tally.pump(consumer, 3, until=n + 1)  # anything released twice late would show up here
    finally:
        stop_process(proc)
        client.close()
    return tally


@pytest.mark.parametrize("kind", broker_kinds())
def test_sigkill_with_rounds_in_flight_neither_loses_nor_doubles(request, tmp_path, unique, kind):
    broker = crash_broker(request, kind)
    bursts, per_burst, spread = SIZES[kind]
    # Small rounds, many of them in flight, and a watermark committed every 10 ms.
    config, sched, out = write_config(tmp_path, unique, releaseBatchSize=250, releaseRoundsInFlight=8,
                                      commitIntervalMillis=10)
    rng = random.Random(4242)
    base = now_ms()
    last_burst_ms = FIRST_BURST_MS + (bursts - 1) * BURST_EVERY_MS
    messages: Dict[bytes, Dict[str, str]] = {}
    for b in range(bursts):
        at = str(base + FIRST_BURST_MS + b * BURST_EVERY_MS)  # one instant: a saturated release
        for i in range(per_burst):
            # 1 KB payloads: the client holds more bytes unsent (queued, in its socket buffer)
            # when the kill lands, bytes a watermark past the confirmed rounds would lose.
            messages[f"b{b}-{i}-".encode().ljust(1024, b"x")] = {DELIVER_AT_PROP: at}
    for i in range(spread):  # paced releases between the bursts
        messages[f"s{i}".encode()] = {DELIVER_AT_PROP: str(base + rng.randint(0, last_burst_ms))}
    n = len(messages)
    # A kill in the middle of each burst's release (by the count seen), and one more in between.
    kill_at = sorted({(b * per_burst + per_burst // 2) * n // (bursts * per_burst) for b in range(bursts)})
    tally = run_killing_mid_release(broker, config, tmp_path, sched, out, messages, kill_at, last_burst_ms)
    tally.assert_exactly_once_never_early(messages, f" (logs in {tmp_path})")
