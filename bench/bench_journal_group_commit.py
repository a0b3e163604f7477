"""Journal appends of the directory store: appends per second and fdatasyncs per append, with
one appending thread (the writer's intake: the index serialises add and cancel) and with several
(group commit: appends that arrive while an fdatasync runs share the next one).

    python bench/bench_journal_group_commit.py [--appends 400] [--threads 1,4] [--record-bytes 6000] [--dir DIR]

--dir should be on the disk the writer's store uses (the default is a temporary directory).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from typing import List

from pulsar_lifecycle.bucket.storage.directory import DirectorySnapshotStorage


def run(root: str, threads: int, appends: int, record: bytes) -> dict:
    store = DirectorySnapshotStorage(root)
    syncs = [0]
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs[0] += 1
        real(fd)

    os.fdatasync = counting  # type: ignore[assignment]
    per = appends // threads
    lat: List[float] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = []
        for _ in range(per):
            t = time.perf_counter()
            store.journal_append(record)
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    try:
        store.journal_read()  # open the journal outside the timing
        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        os.fdatasync = real  # type: ignore[assignment]
        store.close()
    lat.sort()
    n = per * threads
    return {"threads": threads, "appends": n, "per_s": n / wall, "syncs_per_append": syncs[0] / n,
            "p50_ms": lat[len(lat) // 2] * 1000, "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--appends", type=int, default=400)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--record-bytes", type=int, default=6000, help="a 200-message batch journals ~6 KB")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    record = os.urandom(args.record_bytes)
    for threads in (int(t) for t in args.threads.split(",")):
        with tempfile.TemporaryDirectory(dir=args.dir) as root:
            r = run(root, threads, args.appends, record)
        print(f"threads={r['threads']} appends={r['appends']} appends_per_s={r['per_s']:.0f} "
              f"fdatasyncs_per_append={r['syncs_per_append']:.2f} p50_ms={r['p50_ms']:.2f} p99_ms={r['p99_ms']:.2f}")


if __name__ == "__main__":
    main()
