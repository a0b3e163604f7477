"""Cost of client-side de-duplication: DedupPublisher vs a bare producer with the same settings.

Runs against a fresh embedded broker and prints, per run, the throughput of both and their ratio,
plus the time to recover a topic from a snapshot + tail and from no snapshot at all.

    python bench/bench_dedup.py [--messages 50000] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pulsar

from pulsar_lifecycle.dedup import DedupPublisher
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
    args = ap.parse_args()
    payload = b"p" * args.payload_bytes
    ratios = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(data_dir=Path(tmp) / "broker") as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        for run in range(args.runs):
            base = bare(client, f"bench-bare-{run}", args.messages, payload)
            state = Path(tmp) / f"state-{run}"
            ours = dedup(client, f"bench-dedup-{run}", args.messages, payload, state)
            ratios.append(ours / base)
            print(f"run {run}: bare {base:,.0f} msg/s  dedup {ours:,.0f} msg/s  ratio {ours / base:.2f}")
        # Recovery: with the snapshot written at close (tail ~empty) and with the state lost.
        t_snap = recovery(client, "bench-dedup-0", Path(tmp) / "state-0")
        t_full = recovery(client, "bench-dedup-0", Path(tmp) / "state-none")
        print(f"recovery of {args.messages} msgs: from snapshot {t_snap:.3f}s, without snapshot {t_full:.3f}s, "
              f"ratio {t_full / max(t_snap, 1e-9):.1f}")
        client.close()
    print(f"median dedup/bare throughput ratio: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
