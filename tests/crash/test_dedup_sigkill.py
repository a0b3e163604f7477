"""A publisher process SIGKILLed mid-stream and restarted leaves each sequence id exactly once.

The child half of the test is this file run as a script:
    python test_dedup_sigkill.py SERVICE_URL TOPIC STATE_DIR N
It publishes ids 1..N through DedupPublisher, printing progress lines, and closes cleanly.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

PRODUCER = "public/default/sigkill-0-release"


def child_main(url: str, topic: str, state_dir: str, n: int) -> None:
    import pulsar

    from pulsar_lifecycle.dedup import DedupPublisher, Outcome
    from pulsar_lifecycle.state.directory import DirectoryStateStore

    client = pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    store = DirectoryStateStore(Path(state_dir), "public", "default", "dedup")
    pub = DedupPublisher(client, PRODUCER, store)
    highest = pub.open(topic)
    stats = pub.recovery_stats(topic)
    print(f"recovered highest={highest} start={stats.start if stats else None} "
          f"matched={stats.matched if stats else 0}", flush=True)
    sent = dup = 0
    for seq in range(1, n + 1):
        if pub.publish(topic, f"payload-{seq}".encode(), seq) is Outcome.SENT:
            sent += 1
        else:
            dup += 1
        if seq % 250 == 0:
            print(f"progress pushed={seq} persisted={pub.persisted_seq(topic)}", flush=True)
            # Spread the stream out so the parent's SIGKILL lands in the middle of it.
            time.sleep(0.01)
    pub.close()
    client.close()
    print(f"done sent={sent} duplicates={dup}", flush=True)


def run_child(url: str, topic: str, state_dir: Path, n: int, kill_after_pushed: Optional[int],
              log: Path, limit_s: float = 120.0) -> Tuple[int, List[str]]:
    """Run the child; SIGKILL it once it reports `kill_after_pushed` pushed. Returns (rc, lines)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, url, topic, str(state_dir), str(n)],
            stdout=subprocess.PIPE, stderr=err, env=env,
        )
    lines: List[str] = []
    buf = b""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + limit_s
    killed = False
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(line.decode())
                if (kill_after_pushed is not None and not killed and line.startswith(b"progress")
                        and int(line.split(b"pushed=")[1].split()[0]) >= kill_after_pushed):
                    os.kill(proc.pid, signal.SIGKILL)  # our own child, by its pid
                    killed = True
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        sel.close()
        proc.stdout.close()
    return rc, lines


def count_topic(url: str, topic: str, expected: int, quiet_s: float = 2.0, limit_s: float = 90.0) -> Counter:
    """Seq -> copies on the topic, read by a fresh Shared subscription in a bounded loop."""
    import pulsar

    from pulsar_lifecycle.dedup import PRODUCER_PROPERTY, SEQUENCE_PROPERTY

    client = pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    counts: Counter = Counter()
    try:
        consumer = client.subscribe(
            topic, "sigkill-count", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000,
        )
        total = 0
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                msg = consumer.receive(int(quiet_s * 1000) if total >= expected else 1000)
            except pulsar.Timeout:
                if total >= expected:
                    break
                continue
            props = msg.properties()
            assert props[PRODUCER_PROPERTY] == PRODUCER
            seq = int(props[SEQUENCE_PROPERTY])
            assert msg.data() == f"payload-{seq}".encode()
            counts[seq] += 1
            total += 1
            consumer.acknowledge(msg)
        consumer.close()
    finally:
        client.close()
    return counts


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [3500, 6000])
def test_sigkill_mid_stream_then_restart_publishes_each_seq_once(broker, unique, tmp_path, kill_after):
    n = 10_000
    topic = f"persistent://public/default/sigkill-{unique}"
    state_dir = tmp_path / "state"
    log = tmp_path / "child.log"

    rc, lines = run_child(broker.service_url, topic, state_dir, n, kill_after, log)
    assert rc == -signal.SIGKILL, f"child was not SIGKILLed (rc={rc}): {lines[-3:]} log={log.read_text()[-800:]}"
    assert not any(line.startswith("done") for line in lines), "the child finished before the kill"
    progress = [line for line in lines if line.startswith("progress")]
    last_pushed = int(progress[-1].split("pushed=")[1].split()[0])
    last_persisted = int(progress[-1].split("persisted=")[1])
    assert kill_after <= last_pushed < n

    rc, lines = run_child(broker.service_url, topic, state_dir, n, None, log)
    assert rc == 0, f"restarted child failed (rc={rc}): {lines[-3:]} log={log.read_text()[-800:]}"
    recovered = lines[0]
    highest = int(recovered.split("highest=")[1].split()[0])
    matched = int(recovered.split("matched=")[1])
    # Everything the first run saw persisted was recovered ...
    assert highest >= last_persisted
    # ... from a snapshot plus a tail, not by replaying the whole topic.
    assert "start=None" not in recovered and matched < highest
    done = lines[-1]
    assert done.startswith("done")
    sent = int(done.split("sent=")[1].split()[0])
    assert sent == n - highest

    counts = count_topic(broker.service_url, topic, n)
    missing = [s for s in range(1, n + 1) if counts[s] == 0]
    extra = {s: c for s, c in counts.items() if c > 1}
    assert not missing, f"{len(missing)} ids missing, first {missing[:10]}"
    assert not extra, f"{len(extra)} ids duplicated, first {sorted(extra.items())[:10]}"
    assert sum(counts.values()) == n


if __name__ == "__main__":
    child_main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
