"""Issue 8, item 7: the whole --data-dir (embedded broker store, function state, bucket index) on a
small filesystem that fills up while scheduling messages arrive; the writer is SIGKILLed while
the disk is full, space returns, the writer restarts: every message the broker confirmed to its
producer is released (none lost, none twice). On real Apache Pulsar the broker keeps its own
disk, as on a cluster: only the writer's --data-dir (function state, bucket index) fills up,
while the broker confirms every send."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pulsar
import pytest
import yaml

from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TICK_PROP
from pulsar_lifecycle.timing import now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import crash_broker, start_localrun
from support.diskfull import SmallDisk
from support.helpers import drain, stop_process, wait_for
from support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO
N = 3000


def _config(tmp_path: Path, unique: str) -> tuple:
    cfg = yaml.safe_load((ROOT / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    sched = f"persistent://public/default/fsched-{unique}"
    ticks = f"persistent://public/default/fticks-{unique}"
    out = f"persistent://public/default/freleased-{unique}"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg.update(output=out, name=f"fwriter-{unique}")
    # No snapshotDir: the index lives in --data-dir, on the small filesystem with everything else.
    # Large, slow intake batches: when the disk fills, the writer still holds a batch of messages
    # the broker has confirmed but the index has not journaled yet (the lost messages).
    # 15 s to fill a batch of 2000 (more than the first third): the disk is filled right after the
    # first third is confirmed, well within that time even on a loaded machine; the test waits for
    # the window to close on the full disk before its SIGKILL.
    cfg["userConfig"].update(schedulingTopic=sched, tickTopic=ticks, tickTimeMillis=200, tickMode="hold",
                             ingestBatchSize=2000, ingestBatchDelayMillis=15_000)
    path = tmp_path / "writer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, sched, ticks, out


def _close_in_background(client: pulsar.Client, timeout: float = 15.0) -> None:
    """Close a client without letting a broker that stopped answering hang the test."""
    t = threading.Thread(target=client.close, daemon=True)
    t.start()
    t.join(timeout)


def _received(consumer: pulsar.Consumer, count: int, timeout: float) -> bool:
    """Whether `consumer` receives `count` messages besides the warm-up one within `timeout` s."""
    got = 0
    deadline = time.monotonic() + timeout
    while got < count and time.monotonic() < deadline:
        try:
            if consumer.receive(timeout_millis=200).data() != b"warm":
                got += 1
        except pulsar.Timeout:
            continue
    return got >= count


@pytest.mark.parametrize("kind", broker_kinds())
def test_whole_data_dir_on_a_full_filesystem_loses_no_acked_message(request, tmp_path, unique, kind):
    broker = crash_broker(request, kind)
    try:
        disk = SmallDisk(tmp_path / "disk", size_mb=20, leave_bytes=8192)
    except RuntimeError:
        pytest.skip("needs a real small filesystem (mounting a tmpfs is not permitted here)")
    data = disk.path / "data"
    log = tmp_path / "localrun.log"
    config, sched, ticks, out = _config(tmp_path, unique)
    proc = start_localrun(config, broker, data, log)
    confirmed: set = set()
    before_kill = 0
    done = [0]
    lock = threading.Lock()
    try:
        client = quiet_client(broker.service_url)
        # Nothing below may block on a broker that stopped answering: no queue-full blocking, no
        # flush(); every send completes through its callback within send_timeout.
        producer = client.create_producer(sched, batching_enabled=True, batching_max_publish_delay_ms=5,
                                          block_if_queue_full=False, max_pending_messages=N + 100,
                                          send_timeout_millis=5_000)
        # tickMode hold: the writer sends nothing on a timer. pulsar-lite closes a connection whose
        # send it cannot store, and with it the writer's consumer and everything prefetched, so a
        # runner tick every 200 ms on the full disk kept the writer from ever holding a batch.
        # Ticks are the only runtime input here: the first one starts the writer.
        client.create_producer(ticks).send(b"tick", properties={TICK_PROP: str(now_ms())})
        # Only once the writer runs (a message released) is it consuming when the disk fills;
        # otherwise the full broker merely refuses its subscription.
        producer.send(b"warm", properties={DELIVER_AT_PROP: str(now_ms())})
        assert drain(client, out, "warm", expect=1, timeout=40), "the writer never started"
        base = now_ms() + 25_000
        # The disk fills only once the broker has dispatched the first third (a second subscription
        # shows it): the writer then holds confirmed messages it has not journaled yet.
        probe = client.subscribe(sched, "dispatch-probe", consumer_type=pulsar.ConsumerType.Shared,
                                 initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=N)

        def sent(payload: bytes):
            def cb(res, _mid) -> None:
                with lock:
                    done[0] += 1
                    if res == pulsar.Result.Ok:
                        confirmed.add(payload)
            return cb

        for i in range(N):
            if i == N // 3:
                assert wait_for(lambda: done[0] >= N // 3, timeout=30)
                assert _received(probe, N // 3, timeout=30), "the broker never dispatched the first third"
                disk.fill()  # the rest arrive while only ~8 KiB are free
            payload = f"m{i}".encode()
            try:
                producer.send_async(payload, sent(payload), properties={DELIVER_AT_PROP: str(base + (i % 50) * 100)})
            except pulsar.PulsarException:
                with lock:
                    done[0] += 1  # refused at once: not confirmed, not expected
        # A broker on a full disk may neither confirm nor fail the rest: those are simply not
        # expected (a confirmation arriving later still counts, the set is read at the end).
        wait_for(lambda: done[0] >= N, timeout=15)
        before_kill = len(confirmed)
        disk.fill()  # whatever was freed meanwhile is taken again
        # The kill lands once the writer's batch window has closed on the full disk: a broker that
        # refuses the sends at once leaves the test here well before the window ends.
        wait_for(lambda: "event=scheduler_persist_failed" in log.read_text(errors="replace"), timeout=40)
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)  # crash while the disk is full
        proc.wait(timeout=30)
        _close_in_background(client)
        disk.release()
        if broker.embedded_port:
            time.sleep(2.0)  # the killed run's broker stops after its grace period
        proc = start_localrun(config, broker, data, log)
        client = quiet_client(broker.service_url)
        counter = client.subscribe(out, "count", consumer_type=pulsar.ConsumerType.Shared,
                                   initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=2000)
        got: dict = {}
        deadline = time.monotonic() + max(0.0, (base + 5_000 - now_ms()) / 1000.0) + 60
        while time.monotonic() < deadline:
            try:
                m = counter.receive(timeout_millis=200)
            except pulsar.Timeout:
                if confirmed and confirmed <= set(got) and now_ms() > base + 8_000:
                    break
                continue
            mid = m.message_id()
            got.setdefault(m.data(), set()).add((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
            counter.acknowledge(m)
        _close_in_background(client)
    finally:
        stop_process(proc, signal.SIGTERM)
        disk.close()
    print(f"confirmed {len(confirmed)} of {N} sends ({before_kill} before the SIGKILL), released {len(got)}")
    text = log.read_text(errors="replace")
    assert "event=scheduler_persist_failed" in text, "the writer never hit the full disk: the test proves nothing"
    assert len(confirmed) >= N // 3, f"only {len(confirmed)} sends confirmed before the disk filled"
    got.pop(b"warm", None)
    lost = confirmed - set(got)
    twice = {k: v for k, v in got.items() if len(v) > 1}
    assert not lost, f"{len(lost)} of {len(confirmed)} confirmed messages never released, e.g. {sorted(lost)[:5]}"
    assert not twice, f"{len(twice)} released more than once"
