"""What the DelayLevelProducer's batch cap costs: parked sends per second and broker entries with
`batching_max_messages` 100 (the default, DEFAULT_BATCH_MAX_MESSAGES) and 1,000 (pulsar-client's).

The cap exists for pulsar-lite (an entry larger than half the syncer's receiver queue can leave a
crashed syncer's successor a permit deficit; Apache Pulsar has none:
tests/integration/test_broker_quirks.py). This measures whether it costs anything, on either
broker: each run parks `--messages` 100-byte messages in one delay-level partition and counts the
distinct (ledger, entry) pairs of their message ids.

    python bench/bench_delay_level_batch_cap.py --broker lite|pulsar [--messages 20000] [--runs 2]
    python bench/bench_delay_level_batch_cap.py --service-url pulsar://host:6650
"""
from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from pulsar_lifecycle.delaylevel import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.delaylevel.producer import DelayLevelMessageId, DelayLevelProducer
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.timing import DelayedProducer

CAPS = (100, 1000)


def one_run(service_url: str, cap: int, messages: int) -> Tuple[float, int]:
    """(messages per second, broker entries) of one run with batches of at most `cap`."""
    client = quiet_client(service_url)
    suffix = uuid.uuid4().hex[:8]
    business = f"persistent://public/default/batch-cap-{suffix}"
    producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=f"{business}-sched"),
                                  delay_level_topic=business + "-delay-level",
                                  strategy=DelayLevelTopicPartitionStrategy(3600, PartitionBy.SECONDS, unit_seconds=600),
                                  max_pending_messages=5000, batching_max_messages=cap)
    ids: List[Optional[DelayLevelMessageId]] = []
    try:
        t0 = time.monotonic()
        for _ in range(messages):  # 20 minutes: all in partition 1
            producer.send_async(b"x" * 100, lambda _res, mid: ids.append(mid), delay_ms=1_200_000)
        producer.flush()
        seconds = time.monotonic() - t0
    finally:
        producer.close()
        client.close()
    entries = {(m.message_id.ledger_id(), m.message_id.entry_id()) for m in ids if m is not None}
    if len(ids) != messages or None in ids:
        raise SystemExit(f"cap {cap}: {sum(m is None for m in ids)} sends failed, {len(ids)} callbacks")
    return messages / seconds, len(entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=("lite", "pulsar"), default="lite")
    ap.add_argument("--service-url", default=None, help="an already running broker instead of --broker")
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    broker: Any = None
    if args.service_url is None:
        broker = EmbeddedBroker() if args.broker == "lite" else PulsarStandalone()
        broker.start()
    url = args.service_url or broker.service_url
    try:
        results: Dict[int, List[Tuple[float, int]]] = {cap: [] for cap in CAPS}
        for _ in range(args.runs):
            for cap in CAPS:  # interleaved, so load on the machine hits both alike
                results[cap].append(one_run(url, cap, args.messages))
        for cap in CAPS:
            rates = [r for r, _ in results[cap]]
            print(f"batching_max_messages={cap}: {args.messages} messages, entries {[e for _, e in results[cap]]}, "
                  f"rate msg/s min {min(rates):,.0f} median {statistics.median(rates):,.0f}", flush=True)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
