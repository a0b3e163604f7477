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

With a journal file (`--journal PATH`, the *journaled* pipe) it also does, per batch, the least any
writer that is durable before it acks and de-duplicates what it publishes must do: read each
message's position and deliver-at, append one record of them and the payloads to the file with
the writer's own durable append (write, fsync; pulsar_lifecycle.durable), and only then send, each
message with a sequence id and its origin id, on the receiving thread (a journal thread of its own
measured slower: its GIL hand-offs cost more CPU than the fsync it hides). No index, no release
order, no commit: a floor, not a writer.

With `--native` either pipe receives and sends as the writer does: pulsar-client's native consumer's
`batch_receive` (pulsar_lifecycle.pulsar_io.native_consumer) and native message builder (dedup/channel.py),
without the Python wrapper per message; the journaled pipe with `--native` is the floor of the
writer with the writer's own client calls.

    python bench/_pipe.py --service-url URL --input T [--input T2 ...] --output T --subscription S [--journal PATH] [--native]
"""
from __future__ import annotations

import argparse
import os
import signal
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import pulsar

from pulsar_lifecycle.durable import append_durably
from pulsar_lifecycle.pulsar_io import native_consumer
from pulsar_lifecycle.runtime.client import ClientSettings, make_client
from pulsar_lifecycle.scheduling_protocol import (
    DELIVER_AT_PROP,
    ORIGIN_MSG_ID_PROP,
    RELEASED_AT_PROP,
    format_origin_msg_id,
)

try:  # pulsar-client's native message builder, which the writer's publisher sends with
    from _pulsar import MessageBuilder as _MessageBuilder
except ImportError:  # pragma: no cover - another pulsar-client layout: --native sends the public way
    _MessageBuilder = None

BATCH_MESSAGES = 500
BATCH_DELAY_MS = 5
# A journal record's per-message header: ledger, entry, partition, batch index, deliver-at, payload size.
_HEADER = struct.Struct("<qqiiqI")


class _Journal:
    """The journaled pipe's file: one durable append per batch, sequence ids in append order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.seq = 0
        self.lock = threading.Lock()

    def append(self, msgs: List[pulsar.Message]) -> List[Tuple[int, str]]:
        """Journal the batch durably; returns (sequence id, origin id) per message, in order."""
        parts: List[bytes] = []
        origins: List[str] = []
        pack = _HEADER.pack
        for msg in msgs:
            mid = msg.message_id()
            ledger, entry, part, bidx = mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index()
            data = msg.data()
            parts.append(pack(ledger, entry, part, bidx, int(msg.properties()[DELIVER_AT_PROP]), len(data)))
            parts.append(data)
            origins.append(format_origin_msg_id(ledger, entry, part, bidx))
        with self.lock:
            append_durably(self.fd, b"".join(parts), self.path)
            first = self.seq + 1
            self.seq += len(msgs)
        return list(zip(range(first, first + len(msgs)), origins))

    def close(self) -> None:
        os.close(self.fd)


def run_batched_pipe(service_url: str, inputs: Sequence[str], output: str, subscription: str,
                     stop: threading.Event, max_seconds: float = 3600.0, stop_after: Optional[int] = None,
                     stall_s: float = 60.0, journal: Optional[Path] = None, native: bool = False) -> int:
    """Forward from `inputs` to `output` until `stop` is set, `max_seconds` pass, `stop_after`
    messages were forwarded and confirmed, or nothing arrived for `stall_s` while `stop_after` is
    still ahead; returns the messages forwarded and confirmed. One consumer per input topic, each
    on its own thread (as the syncer has one per partition), one producer for all. With `journal`,
    each batch is appended to that file durably before it is sent (the journaled pipe); with `native`,
    messages are received and sent through pulsar-client's native objects, as the writer does."""
    jfile = _Journal(journal) if journal is not None else None
    client = make_client(ClientSettings(service_url))
    producer = client.create_producer(output, block_if_queue_full=True, batching_enabled=True,
                                      batching_max_publish_delay_ms=10, send_timeout_millis=0,
                                      compression_type=pulsar.CompressionType.LZ4)
    # The writer's own client calls (native_consumer.py, dedup/channel.py), where the client has them.
    raw_send = getattr(getattr(producer, "_producer", None), "send_async", None) \
        if native and _MessageBuilder is not None else None
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
            msgs = native_consumer.batch_receive(consumer) if native else consumer.batch_receive()
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
            send_batch(consumer, msgs, jfile.append(msgs) if jfile is not None else None)

    def send_batch(consumer: pulsar.Consumer, msgs: List[pulsar.Message], ids: Optional[List[Tuple[int, str]]]) -> None:
        released_at = str(int(time.time() * 1000))
        last = len(msgs) - 1
        if ids is None and raw_send is None:  # the batched pipe: the baseline, kept to its own loop
            for i, msg in enumerate(msgs):
                props = dict(msg.properties())
                props[RELEASED_AT_PROP] = released_at
                producer.send_async(msg.data(), completion(consumer, msgs) if i == last else None,
                                    properties=props, partition_key=msg.partition_key() or None)
            return
        for i, msg in enumerate(msgs):
            props = dict(msg.properties())
            props[RELEASED_AT_PROP] = released_at
            callback = completion(consumer, msgs) if i == last else None
            seq: Optional[int] = None
            if ids is not None:
                seq, props[ORIGIN_MSG_ID_PROP] = ids[i]
            key = msg.partition_key() or None
            if raw_send is not None:
                builder = _MessageBuilder().content(msg.data()).properties(props)
                if key:
                    builder.partition_key(key)
                if seq is not None:
                    builder.sequence_id(seq)
                raw_send(builder.build(), callback)
            else:
                producer.send_async(msg.data(), callback, properties=props, partition_key=key,
                                    **({} if seq is None else {"sequence_id": seq}))

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
        if jfile is not None:
            jfile.close()
    return counts["confirmed"]


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--service-url", required=True)
    ap.add_argument("--input", action="append", required=True, help="an input topic (repeat for more)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--subscription", required=True)
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    ap.add_argument("--journal", type=Path, help="journal each batch durably to this file before sending it")
    ap.add_argument("--native", action="store_true", help="receive and send through the native client objects")
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_batched_pipe(args.service_url, args.input, args.output, args.subscription, stop, args.max_seconds,
                     journal=args.journal, native=args.native)


if __name__ == "__main__":
    main()
