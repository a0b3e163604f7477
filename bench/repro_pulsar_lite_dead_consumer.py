"""Reproduction (docs/delay-levels.md, "Lateness after a crash"): pulsar-lite and a SIGKILLed consumer.

30 topics of 600 messages (entries of up to 100); a child process subscribes all 30 on one Shared
subscription with a receiver queue of 200, receives one message each and is SIGKILLed; this
process then subscribes the same subscriptions and counts what it receives for `--observe`
seconds. On real Pulsar it receives all 18,000 (the dead consumers' messages are redelivered).
On pulsar-lite it sometimes gets `Consumer N already exists` (a subscribe the broker refuses
while it still holds the dead connection's consumer with the same client-chosen id), and after
a connection reset it never receives the 200 per topic the dead consumers had prefetched.

    python bench/repro_pulsar_lite_dead_consumer.py [--attempts 4] [--observe 20] [--burn]

`--burn` first creates and closes 30 consumers elsewhere, so the new consumers' ids differ from
the dead ones' (what the syncer's rotated subscribe order does).
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pulsar

from pulsar_lifecycle.runtime.broker import EmbeddedBroker

N_TOPICS, PER_TOPIC = 30, 600
HOLDER = """
import sys, time, pulsar
c = pulsar.Client(sys.argv[1], logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
cons = [c.subscribe(f"{sys.argv[2]}-{k}", "S", consumer_type=pulsar.ConsumerType.Shared,
                    initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=200) for k in range(int(sys.argv[3]))]
for x in cons:
    x.receive(5000)
print("ready", flush=True)
time.sleep(600)
"""


def attempt(burn: bool, observe_s: float) -> str:
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(data_dir=Path(d) / "b", log_level="info") as broker:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=5,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        topic = "persistent://public/default/repro"
        for k in range(N_TOPICS):
            p = client.create_producer(f"{topic}-{k}", batching_max_messages=100)
            for _ in range(PER_TOPIC):
                p.send_async(b"x", None)
            p.flush()
            p.close()
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.service_url, topic, str(N_TOPICS)],
                                  stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        t0 = time.monotonic()
        if burn:
            for k in range(N_TOPICS):
                client.subscribe("persistent://public/default/repro-burn", f"burn-{k}").close()
        consumers, refused = [], 0
        for k in range(N_TOPICS):
            while True:
                try:
                    consumers.append(client.subscribe(f"{topic}-{k}", "S", consumer_type=pulsar.ConsumerType.Shared,
                                                      receiver_queue_size=200))
                    break
                except pulsar.Timeout:
                    refused += 1  # the broker kept refusing this consumer id for 5 s
        got = 0
        deadline = time.monotonic() + observe_s
        while time.monotonic() < deadline and got < N_TOPICS * PER_TOPIC:
            for c in consumers:
                try:
                    while True:
                        c.acknowledge(c.receive(20))
                        got += 1
                except pulsar.Timeout:
                    pass
        log = (Path(d) / "b" / "pulsar-lite.log").read_text()
        client.close()
    resets = log.count("Connection reset by peer")
    clashes = log.count("already exists")
    return (f"received {got} of {N_TOPICS * PER_TOPIC} in {time.monotonic() - t0:.1f} s; subscribe timeouts {refused}; "
            f"broker log: {clashes} 'already exists', {resets} connection resets")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=4)
    ap.add_argument("--observe", type=float, default=20.0)
    ap.add_argument("--burn", action="store_true")
    args = ap.parse_args()
    for i in range(args.attempts):
        print(f"attempt {i + 1}: {attempt(args.burn, args.observe)}", flush=True)


if __name__ == "__main__":
    main()
