"""Memory of the bucket index vs an in-memory heap holding every pending message.

    .venv/bin/python bench/bench_bucket_memory.py            # 1M and 10M
    .venv/bin/python bench/bench_bucket_memory.py --sizes 1000000 --layout batched:100

Each variant runs in its own child process, which reports its RSS growth (VmRSS after adding N
pending 100-byte messages, in add() calls of --batch messages, and dropping the last batch the
bench built, minus VmRSS before, after imports and setup).

--layout says where the messages sit on the scheduling topic, which decides their index ids
(entry << 10 | batch index) and so the shape of the index's bitmaps of pending and seen ids:
* unbatched (default): one message per entry, ledgers of 50,000 entries (Pulsar's
  managedLedgerMaxEntriesPerLedger);
* batched:K: batches of K messages per entry, ledgers of 50,000 entries;
* small-ledgers: batches of 1,024 messages in ledgers of 49 entries (50,000 messages a ledger),
  the worst case for the bitmaps: every batch index of a ledger is a container of its own.

Variants:
* bucket: BucketIndex with default settings on DirectorySnapshotStorage in a temp dir;
* heap (baseline): what Pulsar's InMemoryDelayedDeliveryTracker does — every pending message in
  one in-memory priority queue — holding (deliver_at, ledger, entry, payload) because a function
  outside the broker needs the body at release time.
When the machine lacks memory for the baseline at some size, it is measured at 1M and scaled
linearly (the output says so). Prints growth per variant and the ratio heap / bucket.
"""
from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from pulsar_lifecycle.bucket.records import MAX_BATCH_INDEX, index_id

LEDGER_ENTRIES = 50_000  # Pulsar's managedLedgerMaxEntriesPerLedger
SMALL_LEDGER_BATCH = 1_024
SMALL_LEDGER_MESSAGES = 50_000
HOUR_MS = 3_600_000
BASE_MS = 1_900_000_000_000


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def deliver_at(i: int) -> int:
    # Deterministic spread over 1 h .. 25 h from now (a cheap hash of i, no RNG state).
    return BASE_MS + HOUR_MS + (i * 2_654_435_761) % (24 * HOUR_MS)


def payload(i: int) -> bytes:
    return b"p" * 92 + i.to_bytes(8, "little")  # 100 bytes, a distinct object per message


def position(layout: str, i: int) -> tuple:
    """(ledger id, index id) of message i under `layout` (see the module docstring)."""
    if layout == "small-ledgers":
        per_entry, per_ledger = SMALL_LEDGER_BATCH, SMALL_LEDGER_MESSAGES
    else:
        per_entry = 1 if layout == "unbatched" else int(layout.split(":", 1)[1])
        per_ledger = LEDGER_ENTRIES * per_entry
    ledger, k = divmod(i, per_ledger)
    entry, b = divmod(k, per_entry)
    return 1 + ledger, index_id(entry, b)


def parse_layout(text: str) -> str:
    """argparse type of --layout: unbatched, batched:K (1 <= K <= 1024) or small-ledgers."""
    if text in ("unbatched", "small-ledgers"):
        return text
    if text.startswith("batched:") and text[8:].isdigit() and 1 <= int(text[8:]) <= MAX_BATCH_INDEX + 1:
        return text
    raise argparse.ArgumentTypeError(f"--layout must be unbatched, batched:K (1 <= K <= 1024) or small-ledgers, "
                                     f"got {text!r}")


def child_bucket(n: int, batch: int, layout: str) -> dict:
    from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, DirectorySnapshotStorage

    tmp = tempfile.mkdtemp(prefix="bench-bucket-mem-")
    try:
        ix = BucketIndex(DirectorySnapshotStorage(tmp), BucketConfig(), clock=lambda: BASE_MS)
        ix.recover()
        gc.collect()
        before = rss_bytes()
        t0 = time.monotonic()
        peak = before
        for start in range(0, n, batch):
            msgs = [DelayedMessage(*position(layout, i), 0, deliver_at(i), payload(i))
                    for i in range(start, min(n, start + batch))]
            ix.add(msgs)
            if (start // batch) % 50 == 0:
                peak = max(peak, rss_bytes())
        elapsed = time.monotonic() - t0
        # The caller's last batch of messages is not the index's memory: drop it before reading.
        msgs = []
        gc.collect()
        after = rss_bytes()
        s = ix.stats()
        assert s.pending == n, (s.pending, n)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
        return {"growth": after - before, "peak_growth": max(peak, after) - before, "seconds": elapsed,
                "buckets": s.immutable_buckets, "loaded": s.loaded, "disk_bytes": disk,
                "merges": s.op_count[("merge", "succeed")], "seals": s.op_count[("create", "succeed")]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def child_heap(n: int, batch: int, layout: str) -> dict:
    heap: list = []
    gc.collect()
    before = rss_bytes()
    t0 = time.monotonic()
    for i in range(n):
        heapq.heappush(heap, (deliver_at(i), *position(layout, i), payload(i)))
    elapsed = time.monotonic() - t0
    gc.collect()
    after = rss_bytes()
    assert len(heap) == n
    return {"growth": after - before, "peak_growth": after - before, "seconds": elapsed}


def run_child(variant: str, n: int, batch: int, layout: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--n", str(n), "--batch", str(batch),
                          "--layout", layout],
                         check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000000,10000000", help="comma-separated pending counts")
    ap.add_argument("--batch", type=int, default=500, help="messages per add() call (the writer's ingestBatchSize: 500)")
    ap.add_argument("--layout", type=parse_layout, default="unbatched",
                    help="where the messages sit on the scheduling topic: unbatched, batched:K or small-ledgers")
    ap.add_argument("--child", choices=("bucket", "heap"), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = child_bucket if args.child == "bucket" else child_heap
        print(json.dumps(fn(args.n, args.batch, args.layout)))
        return
    mb = 1024 * 1024
    heap_1m = None
    for n in (int(x) for x in args.sizes.split(",")):
        bucket = run_child("bucket", n, args.batch, args.layout)
        # The baseline needs ~300 B per message; keep a 2x margin or extrapolate from 1M.
        if mem_available() > n * 600:
            heap = run_child("heap", n, args.batch, args.layout)
            how = "measured"
        else:
            heap_1m = heap_1m or run_child("heap", 1_000_000, args.batch, args.layout)
            heap = {k: v * n / 1_000_000 for k, v in heap_1m.items()}
            how = "extrapolated linearly from 1M"
        if n == 1_000_000:
            heap_1m = heap
        print(f"N={n:,} pending 100-byte messages, layout {args.layout}, add() batches of {args.batch:,}")
        print(f"  bucket index : RSS growth {bucket['growth'] / mb:8.1f} MB (peak {bucket['peak_growth'] / mb:.1f} MB), "
              f"{bucket['seconds']:.1f} s to add, {bucket['buckets']} buckets, {bucket['loaded']} indexes loaded, "
              f"{bucket['seals']} seals, {bucket['merges']} merges, {bucket['disk_bytes'] / mb:.0f} MB on disk")
        print(f"  heap baseline: RSS growth {heap['growth'] / mb:8.1f} MB ({how}), {heap['seconds']:.1f} s to add")
        verdict = (("met" if bucket['growth'] <= 16 * mb else "NOT met") if n >= 10_000_000
                   else "applies at 10M, not this size")
        print(f"  ratio heap/bucket: {heap['growth'] / max(bucket['growth'], 1):.1f}x"
              f"   target bucket <= 16 MB at 10M: {verdict}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
