"""Cost of client-side de-duplication: DedupPublisher vs a bare producer with the same settings.

Runs against a fresh embedded broker and prints, per run, the throughput of the bare producer
(a callback per message, the usual idiom), of `DedupPublisher.publish` (a callback per message)
and of `DedupPublisher.publish_many` in bursts of --burst (one callback per burst), their ratios
to the bare producer, plus the time to recover a topic from a snapshot + tail and from no
snapshot at all.

    python bench/bench_dedup.py [--messages 50000] [--runs 3] [--burst 1000]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pulsar

from pulsar_lifecycle.dedup import DedupPublisher, OutMessage
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.state.directory import DirectoryStateStore


def bare(client: pulsar.Client, topic: str, n: int, payload: bytes) -> float:
    prod = client.create_producer(
        topic, producer_name="bench-bare", block_if_queue_full=True, batching_enabled=True,
        batching_max_publish_delay_ms=10, send_timeout_millis=0, compression_type=pulsar.CompressionType.LZ4,
    )
    done = [0]

    def cb(res: object, _mid: object) -> None:
        done[0] += 1

    t0 = time.perf_counter()
    for seq in range(1, n + 1):
        prod.send_async(payload, cb, sequence_id=seq,
                        properties={"__pl_producer__": "bench-bare", "__pl_seq__": str(seq)})
    prod.flush()
    dt = time.perf_counter() - t0
    prod.close()
    assert done[0] == n
    return n / dt


def dedup(client: pulsar.Client, topic: str, n: int, payload: bytes, state: Path) -> float:
    pub = DedupPublisher(client, "bench-dedup", DirectoryStateStore(state, "public", "default", "bench"))
    pub.open(topic)
    t0 = time.perf_counter()
    for seq in range(1, n + 1):
        pub.publish(topic, payload, seq)
    pub.flush(120)
    dt = time.perf_counter() - t0
    assert pub.persisted_seq(topic) == n, (pub.persisted_seq(topic), n)
    pub.close()
    return n / dt


def dedup_many(client: pulsar.Client, topic: str, n: int, payload: bytes, state: Path, burst: int) -> float:
    pub = DedupPublisher(client, "bench-dedup", DirectoryStateStore(state, "public", "default", "bench"))
    pub.open(topic)
    t0 = time.perf_counter()
    for start in range(1, n + 1, burst):
        pub.publish_many(topic, [OutMessage(payload, seq) for seq in range(start, min(n, start + burst - 1) + 1)])
    pub.flush(120)
    dt = time.perf_counter() - t0
    assert pub.persisted_seq(topic) == n
    pub.close()
    return n / dt


def recovery(client: pulsar.Client, topic: str, state: Path) -> float:
    pub = DedupPublisher(client, "bench-dedup", DirectoryStateStore(state, "public", "default", "bench"))
    t0 = time.perf_counter()
    pub.open(topic)
    dt = time.perf_counter() - t0
    pub.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--burst", type=int, default=1000, help="messages per publish_many call")
    args = ap.parse_args()
    if args.messages < 1 or args.runs < 1 or args.burst < 1:
        ap.error("--messages, --runs and --burst must be >= 1")
    payload = b"p" * args.payload_bytes
    ratios = []
    many_ratios = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(data_dir=Path(tmp) / "broker") as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        for run in range(args.runs):
            base = bare(client, f"bench-bare-{run}", args.messages, payload)
            state = Path(tmp) / f"state-{run}"
            ours = dedup(client, f"bench-dedup-{run}", args.messages, payload, state)
            many = dedup_many(client, f"bench-dedup-many-{run}", args.messages, payload, Path(tmp) / f"many-{run}",
                              args.burst)
            ratios.append(ours / base)
            many_ratios.append(many / base)
            print(f"run {run}: bare {base:,.0f} msg/s  publish {ours:,.0f} msg/s ({ours / base:.2f}x)  "
                  f"publish_many {many:,.0f} msg/s ({many / base:.2f}x)", flush=True)
        # Recovery: with the snapshot written at close (tail ~empty) and with the state lost.
        t_snap = recovery(client, "bench-dedup-0", Path(tmp) / "state-0")
        t_full = recovery(client, "bench-dedup-0", Path(tmp) / "state-none")
        print(f"recovery of {args.messages} msgs: from snapshot {t_snap:.3f}s, without snapshot {t_full:.3f}s, "
              f"ratio {t_full / max(t_snap, 1e-9):.1f}")
        client.close()
    print(f"median ratio to the bare producer: publish {statistics.median(ratios):.2f}, "
          f"publish_many {statistics.median(many_ratios):.2f}")


if __name__ == "__main__":
    main()
