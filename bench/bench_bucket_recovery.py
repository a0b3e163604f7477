"""Restart to first release: snapshot recovery vs rebuilding the index by replaying the backlog.

    /tmp/venv/bin/python bench/bench_bucket_recovery.py            # 1M pending
    /tmp/venv/bin/python bench/bench_bucket_recovery.py --n 200000

Setup: N pending 100-byte messages (deliver-at spread over 24 h, the earliest already due at the
restart) are added to a BucketIndex on DirectorySnapshotStorage in a temp dir, and the process
ends. Then, each in a fresh child process:
* recovery: BucketIndex(storage).recover() + pop_due(now, 1) until the first item is released;
* baseline (replay): what a tracker without snapshots must do after a restart (Pulsar's
  InMemoryDelayedDeliveryTracker, or PIP-195's mutable bucket): re-add every pending message
  into a fresh index, then pop the first release. The backlog read itself is not counted (it is
  handed over in memory), which favours the baseline.
Prints both times (from creating the index to the first release; interpreter start-up and
imports excluded) and the ratio replay / recovery. Targets: >= 100x, first release <= 2 s.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time

LEDGER_SIZE = 50_000
HOUR_MS = 3_600_000
BASE_MS = 1_900_000_000_000
RESTART_MS = BASE_MS + 60_000  # one minute after the earliest deliver-at


def deliver_at(i: int) -> int:
    return BASE_MS + (i * 2_654_435_761) % (24 * HOUR_MS)


def messages(start: int, stop: int):
    from pulsar_lifecycle.bucket import DelayedMessage

    return [DelayedMessage(1 + i // LEDGER_SIZE, i % LEDGER_SIZE, 0, deliver_at(i),
                           b"p" * 92 + i.to_bytes(8, "little")) for i in range(start, stop)]


def child_build(path: str, n: int, batch: int) -> dict:
    from pulsar_lifecycle.bucket import BucketIndex, DirectorySnapshotStorage

    t0 = time.monotonic()
    ix = BucketIndex(DirectorySnapshotStorage(path), clock=lambda: BASE_MS)
    ix.recover()
    for start in range(0, n, batch):
        ix.add(messages(start, min(n, start + batch)))
    return {"seconds": time.monotonic() - t0, "buckets": ix.stats().immutable_buckets,
            "mutable": ix.stats().mutable_items}


def child_recover(path: str) -> dict:
    from pulsar_lifecycle.bucket import BucketIndex, DirectorySnapshotStorage

    t0 = time.monotonic()
    ix = BucketIndex(DirectorySnapshotStorage(path), clock=lambda: RESTART_MS)
    report = ix.recover()
    t1 = time.monotonic()
    first = ix.pop_due(RESTART_MS, 1)  # includes the durable horizon write (fsync)
    elapsed = time.monotonic() - t0
    assert first, "nothing released after recovery"
    return {"seconds": elapsed, "recover_seconds": t1 - t0, "first_seq": first[0].seq, "pending": report.pending,
            "metadata_reads": report.metadata_reads, "segment_reads": report.segment_reads,
            "bytes_read": report.bytes_read, "buckets": report.buckets, "journal_items": report.mutable_items}


def child_replay(n: int, batch: int) -> dict:
    from pulsar_lifecycle.bucket import BucketIndex, DirectorySnapshotStorage

    backlog = [messages(start, min(n, start + batch)) for start in range(0, n, batch)]  # not timed
    tmp = tempfile.mkdtemp(prefix="bench-bucket-replay-")
    try:
        t0 = time.monotonic()
        ix = BucketIndex(DirectorySnapshotStorage(tmp), clock=lambda: RESTART_MS)
        ix.recover()
        for msgs in backlog:
            ix.add(msgs)
        first = ix.pop_due(RESTART_MS, 1)
        elapsed = time.monotonic() - t0
        assert first, "nothing released after replay"
        return {"seconds": elapsed}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True,
                         text=True, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="pending messages")
    ap.add_argument("--batch", type=int, default=10_000, help="messages per add() call")
    ap.add_argument("--runs", type=int, default=3, help="recovery runs (the median is reported)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        if kind == "build":
            res = child_build(rest[0], int(rest[1]), int(rest[2]))
        elif kind == "recover":
            res = child_recover(rest[0])
        else:
            res = child_replay(int(rest[0]), int(rest[1]))
        print(json.dumps(res))
        return
    tmp = tempfile.mkdtemp(prefix="bench-bucket-recovery-")
    try:
        built = run_child("build", tmp, str(args.n), str(args.batch))
        print(f"built {args.n:,} pending messages in {built['seconds']:.1f} s: {built['buckets']} buckets "
              f"+ {built['mutable']} in the journal")
        recs = sorted((run_child("recover", tmp) for _ in range(args.runs)), key=lambda r: r["seconds"])
        rec = recs[len(recs) // 2]
        if any(r["pending"] != args.n for r in recs):
            raise SystemExit(f"recovery found {[r['pending'] for r in recs]} pending, not {args.n:,}")
        replay = run_child("replay", str(args.n), str(args.batch))
        print(f"  recovery : first release after {rec['seconds'] * 1000:8.1f} ms (median of {args.runs}; recover() "
              f"{rec['recover_seconds'] * 1000:.1f} ms, the rest is pop_due's durable horizon write); read "
              f"{rec['metadata_reads']} metadata + {rec['segment_reads']} segments = {rec['bytes_read'] / 1e6:.1f} MB "
              f"for {rec['buckets']} buckets, {rec['journal_items']} journal items, {rec['pending']:,} pending")
        print(f"  replay   : first release after {replay['seconds'] * 1000:8.1f} ms (re-adding {args.n:,} messages)")
        ratio = replay["seconds"] / rec["seconds"]
        ok = ratio >= 100 and rec["seconds"] <= 2.0
        print(f"  ratio replay/recovery: {ratio:.0f}x   targets >= 100x and <= 2 s: {'met' if ok else 'NOT met'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
