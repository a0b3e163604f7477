"""Acceptance (issue 11, item 9): 20,000 delayed messages through delay-level partitions, the
DelayLevelSyncer and the BucketSnapshotWriter, each a `localrun --broker-service-url` process on
one broker: a pulsar-lite of the test's own, or the session's real Apache Pulsar, where the
delay-level topic is a partitioned topic created through the admin REST API. The syncer is
SIGKILLed 3 times and the writer once; the broker lives on. Every message reaches the business
topic exactly once and none early. On pulsar-lite, outside the kill downtime, at most 5% later
than the documented bound (docs/delay-levels.md: lateness <= lookahead + the writer's tick, when
nothing is down) and none later than it plus 2 s, what a shared machine's pauses add; on real
Pulsar the lateness is reported (below)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.producer import DelayLevelMessageId, DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import ORIGIN_PARTITION_PROP, partition_topic
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduler.service import RELEASED_AT_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP
from pulsar_lifecycle.timing import DelayedProducer, now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import (
    CrashBroker,
    crash_broker,
    create_partitioned_topic,
    start_localrun,
    stop_all,
    wait_subscribed,
)
from support.helpers import receive_payloads
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]
ROOT = REPO
NS = "persistent://public/default"

N = int(os.environ.get("DL_CRASH_MESSAGES", "20000"))
UNIT_S = int(os.environ.get("DL_CRASH_UNIT_SECONDS", "2"))
UNITS = 30
LOOKAHEAD_MS = 1000
WRITER_TICK_MS = 200
# Documented bound (docs/delay-levels.md) for messages due while both processes run.
BOUND_MS = LOOKAHEAD_MS + WRITER_TICK_MS
# What a shared 2-core machine adds on its own: a process not scheduled for a second or more (seen
# as single messages 10-50 ms over the bound, and as restarts slower than the window). Every message
# outside the downtime must be within the bound plus this (a stalled partition is not), and all but
# OVER_BOUND_SHARE of them within the bound itself (a systematic delay is not).
MACHINE_PAUSE_MS = 2000
OVER_BOUND_SHARE = 0.05
# After a restart the process needs this long to be serving again (start, recovery, first tick):
# 2-3 s on a quiet machine; a loaded 2-core CI machine took 4.0-7.3 s from kill to the first
# release after it (the syncer's third restart the slowest).
RECOVERY_GRACE_MS = 9000
# Diagnosis: the functions' log level (their logs are in the test's tmp_path) and the broker's.
LOG_LEVEL = os.environ.get("DL_CRASH_LOG_LEVEL", "WARNING")
BROKER_LOG_LEVEL = os.environ.get("DL_CRASH_BROKER_LOG_LEVEL", "warn")
PIPELINE_DEPTH = os.environ.get("DL_CRASH_PIPELINE_DEPTH", "")  # the syncer's forwardPipelineDepth (default: shipped)
PY_SPY = os.environ.get("DL_CRASH_PY_SPY", "")  # a py-spy binary: dump each process's threads before its kill
WARM_UP = b"warm-up"  # payload prefix of the messages that show both functions serve before the run


def configs(tmp_path: Path, unique: str) -> Tuple[Path, Path, Dict[str, str]]:
    unique = unique[-8:]  # state keys embed producer and topic names; keep file names short
    t = {"sched": f"{NS}/dlc-sched-{unique}", "wticks": f"{NS}/dlc-wticks-{unique}",
         "sticks": f"{NS}/dlc-sticks-{unique}", "business": f"{NS}/dlc-biz-{unique}"}
    t["dl"] = t["business"] + "-delay-level"
    w = yaml.safe_load((ROOT / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    w["inputSpecs"] = {t["wticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    w.update(output=t["business"], name=f"dlc-writer-{unique}", subName=f"dlc-writer-{unique}")
    w["userConfig"].update(schedulingTopic=t["sched"], tickTopic=t["wticks"], tickTimeMillis=WRITER_TICK_MS,
                           snapshotDir=str(tmp_path / "snapshots"), schedulingSubscription="writer",
                           tickMode="runner")  # the local runner's ticks start it (tick topic only input)
    s = yaml.safe_load((ROOT / "function-configs" / "delay-level-syncer.yaml").read_text())
    s["inputSpecs"] = {t["sticks"]: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    s.update(name=f"dlc-syncer-{unique}", subName=f"dlc-syncer-{unique}")
    s["userConfig"].update(delayLevelTopic=t["dl"], schedulingTopic=t["sched"], schedulingSubscription="writer",
                           partitionBy="SECONDS", unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=UNITS * UNIT_S,
                           lookaheadMillis=LOOKAHEAD_MS, tickTopic=t["sticks"], tickTimeMillis=200,
                           tickMode="runner")  # as the writer: the local runner's ticks start it
    if PIPELINE_DEPTH:
        s["userConfig"]["forwardPipelineDepth"] = int(PIPELINE_DEPTH)
    wp, sp = tmp_path / "writer.yaml", tmp_path / "syncer.yaml"
    wp.write_text(yaml.safe_dump(w))
    sp.write_text(yaml.safe_dump(s))
    return wp, sp, t


def localrun(config: Path, broker: CrashBroker, tmp_path: Path, name: str) -> subprocess.Popen:
    return start_localrun(config, broker, tmp_path / f"data-{name}", tmp_path / f"{name}.log", log_level=LOG_LEVEL)


def read_forwards(tap: pulsar.Consumer) -> Dict[bytes, Tuple[int, str]]:
    """payload -> (first publish time on the scheduling topic, source partition) of every forward."""
    out: Dict[bytes, Tuple[int, str]] = {}
    for _ in range(10 * N):  # bounded: at most a few copies of each message
        try:
            m = tap.receive(timeout_millis=2000)
        except pulsar.Timeout:
            break
        tap.acknowledge(m)
        origin = m.properties().get(ORIGIN_PARTITION_PROP, "near-term")
        at = m.publish_timestamp()
        if m.data() not in out or at < out[m.data()][0]:
            out[m.data()] = (at, origin.rsplit("-", 1)[-1])
    return out


def explain(too_late: List[Tuple[bytes, int, int]], forwarded: Dict[bytes, Tuple[int, str]]) -> str:
    """Which side the late ones were late on: forwarded after deliver-at - lookahead (syncer) or
    released late after a timely forward (writer); per source partition."""
    syncer: Dict[str, List[int]] = {}
    writer: Dict[str, List[int]] = {}
    for payload, deliver_at, _lateness in too_late:
        fwd_at, part = forwarded.get(payload, (0, "?"))
        side = syncer if fwd_at > deliver_at else writer  # the syncer's margin is the whole lookahead
        side.setdefault(part, []).append(fwd_at - deliver_at)

    def fmt(d: Dict[str, List[int]]) -> str:
        return ", ".join(f"p{k}: {len(v)} (forward-deliver_at {min(v)}..{max(v)} ms)" for k, v in sorted(d.items()))
    return f"late after a late forward (syncer): {fmt(syncer) or 'none'}; late after a timely forward (writer): {fmt(writer) or 'none'}"


def warm_up(producer: DelayLevelProducer, counter: pulsar.Consumer, timeout_s: float = 120.0) -> None:
    """Return once a message due at once (released by the writer) and one parked in a delay-level
    partition (forwarded by the syncer, which subscribes every partition before its first forward,
    then released) have both reached the business topic."""
    delays = {WARM_UP + b"-near-term": 0, WARM_UP + b"-parked": 3 * UNIT_S * 1000}
    for payload, delay in delays.items():
        assert producer.send(payload, delay_ms=delay).parked == (delay > 0), payload
    got = receive_payloads(counter, len(delays), timeout_s)
    assert sorted(got) == sorted(p.decode() for p in delays), \
        f"the functions did not serve within {timeout_s:.0f} s: released {got} of {sorted(delays)}"


@pytest.mark.parametrize("kind", broker_kinds())
def test_syncer_and_writer_sigkilled_every_message_once_never_early_bounded_late(request, tmp_path, unique, kind):
    wcfg, scfg, t = configs(tmp_path, unique)
    lite: Optional[EmbeddedBroker] = None
    if kind == "lite":
        # Not owned by a localrun: both functions share it, and the test may restart it (below).
        lite = EmbeddedBroker(data_dir=tmp_path / "broker", log_level=BROKER_LOG_LEVEL)
        lite.start()
        broker = CrashBroker("lite", lite.service_url)
    else:
        broker = crash_broker(request, kind)
        create_partitioned_topic(broker.admin_url, t["dl"], UNITS)
    url = broker.service_url
    procs = {"writer": localrun(wcfg, broker, tmp_path, "writer"), "syncer": localrun(scfg, broker, tmp_path, "syncer")}
    client = quiet_client(url)
    counter = client.subscribe(t["business"], "count", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
    # Diagnosis of late messages: a second subscription on the scheduling topic, read at the end,
    # tells when the syncer forwarded each one (the forward's publish time).
    tap = client.subscribe(t["sched"], "tap", consumer_type=pulsar.ConsumerType.Shared,
                           initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000)
    strategy = DelayLevelTopicPartitionStrategy(UNITS * UNIT_S, PartitionBy.SECONDS, unit_seconds=UNIT_S)
    producer = DelayLevelProducer(client, t["business"], DelayedProducer(client, scheduling_topic=t["sched"]),
                                  delay_level_topic=t["dl"],
                                  strategy=strategy, max_pending_messages=5000)
    rng = random.Random(11)
    seen: Dict[bytes, Set[Tuple[int, int, int]]] = {}
    late: List[Tuple[bytes, int, int]] = []  # (payload, deliver_at, lateness) measured by receive time
    early: List[bytes] = []
    windows: List[Tuple[int, int]] = []  # kill downtime: [kill, restart + grace]
    failed: List[int] = []
    forwarded: Dict[bytes, Tuple[int, str]] = {}
    due: Dict[bytes, int] = {}  # payload -> deliver_at as sent
    delays: Dict[bytes, int] = {}  # payload -> delay as sent (its delay-level partition)
    sources: Dict[bytes, str] = {}  # payload -> its parked position "<ledger>:<entry>:<batch>" (diagnosis)
    held_back = 0  # messages still missing when the broker was restarted (pulsar-lite held them)
    after_restart: Set[bytes] = set()  # released after that restart: their lateness is the broker's

    def sent(i: int, res: pulsar.Result, dl_id: Optional[DelayLevelMessageId]) -> None:
        if res != pulsar.Result.Ok:
            failed.append(i)
        elif dl_id is not None:
            mid = dl_id.message_id
            sources[f"m{i}".encode()] = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.batch_index()}"

    def pump(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(seen) < N:
            try:
                m = counter.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            if m.data().startswith(WARM_UP):  # a copy of a warm-up message: not one of the N
                counter.acknowledge(m)
                continue
            now = now_ms()
            mid = m.message_id()
            seen.setdefault(m.data(), set()).add((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
            deliver_at = int(m.properties()[DELIVER_AT_PROP])
            if int(m.properties()[RELEASED_AT_PROP]) < deliver_at or now < deliver_at:
                early.append(m.data())
            late.append((m.data(), deliver_at, int(m.properties()[RELEASED_AT_PROP]) - deliver_at))
            if held_back:
                after_restart.add(m.data())
            counter.acknowledge(m)

    try:
        # Both functions build their services on their first tick; wait for their subscriptions.
        if broker.standalone is not None:
            wait_subscribed(broker.admin_url, [t["sched"]] + [partition_topic(t["dl"], k) for k in range(UNITS)])
        # And until both serve: a cold start on a loaded machine can take longer than a fixed wait,
        # and messages due before then would count as late outside any kill window.
        warm_up(producer, counter)
        base = now_ms()
        for i in range(N):
            delay = rng.randint(0, UNITS * UNIT_S * 1000)
            due[f"m{i}".encode()] = now_ms() + delay
            delays[f"m{i}".encode()] = delay
            producer.send_async(f"m{i}".encode(), lambda res, mid, i=i: sent(i, res, mid), delay_ms=delay)
        producer.flush()
        assert not failed, f"{len(failed)} sends failed"
        span_s = UNITS * UNIT_S
        kills = [("syncer", 0.15 * span_s), ("syncer", 0.4 * span_s), ("writer", 0.55 * span_s), ("syncer", 0.75 * span_s)]
        t0 = time.monotonic()
        for name, at in kills:
            pump(max(0.0, at - (time.monotonic() - t0)))
            if PY_SPY:
                with open(tmp_path / f"{name}.log", "ab") as log:
                    log.write(f"--- py-spy dump before the kill at {now_ms() - base} ms\n".encode())
                    log.flush()
                    subprocess.run([PY_SPY, "dump", "--pid", str(procs[name].pid)], stdout=log, stderr=log, timeout=30)
            killed = now_ms()
            procs[name].send_signal(signal.SIGKILL)
            procs[name].wait(timeout=10)
            procs[name] = localrun(wcfg if name == "writer" else scfg, broker, tmp_path, name)
            windows.append((killed, now_ms() + RECOVERY_GRACE_MS))
        pump(max(0.0, (base + span_s * 1000 - now_ms()) / 1000.0) + 30)
        if len(seen) < N and lite is not None:
            # pulsar-lite can keep messages assigned to a SIGKILLed syncer's consumer and never
            # dispatch them again (docs/delay-levels.md, "Lateness after a crash"); the syncer does
            # not forward past them (strict position order), so the rest of that partition waits
            # too. A restart of the broker alone (the functions keep running and reconnect, as
            # with a real broker restart) hands them out again. A message the functions acked
            # without forwarding is gone for good and stays missing below.
            held_back = N - len(seen)
            lite.restart()
            pump(60)
        pump(3)  # a copy released late would show up here
    finally:
        forwarded = read_forwards(tap)
        producer.close()
        stop_all(procs.values())
        client.close()
        if lite is not None:
            lite.stop(remove_data=BROKER_LOG_LEVEL == "warn")  # a diagnosis keeps the broker's log
    expected = {f"m{i}".encode() for i in range(N)}
    missing = expected - set(seen)
    twice = {k: len(v) for k, v in seen.items() if len(v) > 1}
    outside = [(p, at, lat) for p, at, lat in late
               if p not in after_restart and not any(a - LOOKAHEAD_MS <= at <= b for a, b in windows)]
    too_late = [x for x in outside if x[2] > BOUND_MS]
    stalled = [x for x in too_late if x[2] > BOUND_MS + MACHINE_PAUSE_MS]
    worst = max((x[2] for x in outside), default=0)
    print(f"\nDL crash: n={N} unit={UNIT_S}s released={len(seen)} outside-downtime={len(outside)} "
          f"worst lateness outside downtime={worst} ms (bound {BOUND_MS} ms); "
          f"worst overall={max((x[2] for x in late), default=0)} ms; held back until a broker restart={held_back}; "
          f"windows={[(a - base, b - base) for a, b in windows]}")
    # payload deliver_at lateness forwarded_at partition parked-position
    with open(tmp_path / "lateness.tsv", "w") as out:
        for p, at, lat in late:
            fwd = forwarded.get(p, (0, "?"))
            out.write(f"{p.decode()}\t{at}\t{lat}\t{fwd[0]}\t{fwd[1]}\t{sources.get(p, '?')}\n")
        for p in sorted(missing):  # never released: lateness -1
            fwd = forwarded.get(p, (0, "?"))
            out.write(f"{p.decode()}\t{due[p]}\t-1\t{fwd[0]}\t{fwd[1]}\t{sources.get(p, '?')}\n")
    unforwarded = sorted(p for p in missing if p not in forwarded)
    assert not twice, f"{len(twice)} released more than once, e.g. {list(twice.items())[:5]}"
    assert not early, f"{len(early)} released early, e.g. {early[:5]}"
    assert not missing, (f"{len(missing)} never released ({len(unforwarded)} of them never forwarded), "
                         f"e.g. {sorted(missing)[:5]}; logs and lateness.tsv in {tmp_path}")
    # The bound is checked on a real share of the messages: about 7,000 of 20,000 lie outside the windows.
    assert len(outside) > N // 4
    if lite is None:
        # Real Pulsar: the bound is reported, not asserted. A restarted syncer needs 3-5 s there
        # before it forwards again (it recovers every partition's publisher from the scheduling
        # topic, with the broker's JVM on the same 2 cores), close to the 6 s the downtime window
        # allows, so on a busy machine the bound measures the load as much as the syncer.
        if too_late:
            warnings.warn(f"real Pulsar: {len(too_late)} later than {BOUND_MS} ms outside kill downtime "
                          f"(worst {worst} ms); {explain(too_late, forwarded)}", stacklevel=1)
        return
    # Lateness outside the kill downtime (docs/delay-levels.md: lookahead + the writer's tick).
    # A dedup tail-replay reader that stalls at a restart is restarted after 1 s, so a syncer start
    # is not held up by one partition's replay; the message names the late side (the syncer's
    # forward or the writer's release).
    where = f"{explain(too_late, forwarded)}; logs and lateness.tsv in {tmp_path}"
    assert not stalled, (f"{len(stalled)} later than {BOUND_MS} + {MACHINE_PAUSE_MS} ms outside kill downtime "
                         f"(worst {worst} ms), e.g. {stalled[:5]}; {where}")
    assert len(too_late) <= OVER_BOUND_SHARE * len(outside), (
        f"{len(too_late)} of {len(outside)} later than {BOUND_MS} ms outside kill downtime (worst {worst} ms), "
        f"e.g. {too_late[:5]}; {where}")
    if too_late:
        warnings.warn(f"{len(too_late)} of {len(outside)} later than {BOUND_MS} ms outside kill downtime "
                      f"(worst {worst} ms); {where}", stacklevel=1)
