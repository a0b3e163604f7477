"""The batched consume->produce pipe: the one throughput baseline of every benchmark that compares a
function with a pipe (the writer's, the syncer's, and bench_vs_pulsar.py's), so their ratios mean
the same thing.

What it does, on one client with the runtime's settings (runtime/client.py `make_client`):
- a Shared consumer per input topic (one topic, or every partition of a delay-level topic), each
  on its own thread, Earliest, receiver queue 2 x BATCH_MESSAGES, `batch_receive` of up to BATCH_MESSAGES messages
  waiting at most BATCH_DELAY_MS to fill (the writer's ingest defaults: scheduler/config.py
  `ingestBatchSize`, `ingestBatchDelayMillis`);
- one producer with the runtime's output settings (batching, 10 ms, LZ4, no send timeout, blocking
  when its queue is full);
- each received batch is sent with its payloads, keys and properties (plus `__pl_released_at__`),
  without per-message callbacks: one completion callback on the batch's last send (a producer
  completes its sends in order, so its success completes the batch), and the batch's acks in it.

    python bench/_pipe.py --service-url URL --input T [--input T2 ...] --output T --subscription S
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Callable, List, Optional, Sequence

import pulsar

from pulsar_lifecycle.runtime.client import ClientSettings, make_client
from pulsar_lifecycle.scheduling_protocol import RELEASED_AT_PROP

BATCH_MESSAGES = 500
BATCH_DELAY_MS = 5


def run_batched_pipe(service_url: str, inputs: Sequence[str], output: str, subscription: str,
                     stop: threading.Event, max_seconds: float = 3600.0, stop_after: Optional[int] = None,
                     stall_s: float = 60.0) -> int:
    """Forward from `inputs` to `output` until `stop` is set, `max_seconds` pass, `stop_after`
    messages were forwarded and confirmed, or nothing arrived for `stall_s` while `stop_after` is
    still ahead; returns the messages forwarded and confirmed. One consumer per input topic, each
    on its own thread (as the syncer has one per partition), one producer for all."""
    client = make_client(ClientSettings(service_url))
    producer = client.create_producer(output, block_if_queue_full=True, batching_enabled=True,
                                      batching_max_publish_delay_ms=10, send_timeout_millis=0,
                                      compression_type=pulsar.CompressionType.LZ4)
    consumers = [client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest,
                                  receiver_queue_size=2 * BATCH_MESSAGES,
                                  batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(
                                      BATCH_MESSAGES, 16 * 1024 * 1024, BATCH_DELAY_MS))
                 for topic in inputs]
    counts = {"sent": 0, "confirmed": 0}
    lock = threading.Lock()
    finished = threading.Event()  # stop_after confirmed, or a stall
    deadline = time.monotonic() + max_seconds
    last_progress = [time.monotonic()]

    def completion(consumer: pulsar.Consumer, msgs: List[pulsar.Message]) -> Callable[[pulsar.Result, object], None]:
        def done(res: pulsar.Result, _mid: object) -> None:
            settle = consumer.acknowledge if res == pulsar.Result.Ok else consumer.negative_acknowledge
            for m in msgs:
                settle(m)
            if res == pulsar.Result.Ok:
                with lock:
                    counts["confirmed"] += len(msgs)
                    if stop_after is not None and counts["confirmed"] >= stop_after:
                        finished.set()
        return done

    def forward(consumer: pulsar.Consumer) -> None:
        while not stop.is_set() and not finished.is_set() and time.monotonic() < deadline:
            msgs = consumer.batch_receive()
            if not msgs:
                with lock:
                    stalled = (stop_after is not None and counts["sent"] < stop_after
                               and time.monotonic() - last_progress[0] > stall_s)
                if stalled:
                    print(f"batched pipe: {counts['sent']} of {stop_after} after {stall_s:.0f} s without a message",
                          file=sys.stderr, flush=True)
                    finished.set()
                continue
            with lock:
                last_progress[0] = time.monotonic()
                counts["sent"] += len(msgs)
            released_at = str(int(time.time() * 1000))
            last = len(msgs) - 1
            for i, msg in enumerate(msgs):
                props = dict(msg.properties())
                props[RELEASED_AT_PROP] = released_at
                producer.send_async(msg.data(), completion(consumer, msgs) if i == last else None,
                                    properties=props, partition_key=msg.partition_key() or None)

    threads = [threading.Thread(target=forward, args=(c,), name=f"pipe-{k}", daemon=True)
               for k, c in enumerate(consumers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.flush()
    finally:
        for c in consumers:
            c.close()
        producer.close()
        client.close()
    return counts["confirmed"]


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--service-url", required=True)
    ap.add_argument("--input", action="append", required=True, help="an input topic (repeat for more)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--subscription", required=True)
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_batched_pipe(args.service_url, args.input, args.output, args.subscription, stop, args.max_seconds)


if __name__ == "__main__":
    main()
