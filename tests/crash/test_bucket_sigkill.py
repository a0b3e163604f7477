"""The bucket engine under SIGKILL: a child process runs it like the scheduler function does
(an intake thread adding batches with redeliveries and sealing, a release thread popping,
"publishing" to an fsynced log and committing) and is killed at random moments. After the last
run every item has been released, each seq always names the same item and key, and the
deduplicated stream is in release-key order."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

WORKER = textwrap.dedent('''
    import os, sys, threading, time, random
    from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, DirectorySnapshotStorage
    root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg = BucketConfig(max_unacked_per_bucket=200, delayed_delivery_max_indexes_per_bucket_snapshot_segment=30,
                       delayed_delivery_max_num_buckets=5, max_seal_delay_millis=300,
                       delayed_delivery_max_time_step_per_bucket_snapshot_segment_seconds=1)
    ix = BucketIndex(DirectorySnapshotStorage(root + "/snap"), cfg)
    ix.recover()
    base = int(open(root + "/base").read())
    acked_path = root + "/acked"
    acked = int(open(acked_path).read()) if os.path.exists(acked_path) else 0
    out = open(root + "/released.log", "a")
    stop = threading.Event()

    def intake():
        rnd = random.Random(seed)
        i = acked
        while i < n:
            k = rnd.randint(1, 40)
            # from i - 3: redelivered source messages must be ignored
            ix.add([DelayedMessage(1 + j // 500, j % 500, 0, base + (j * 7919) % 5000, b"%d" % j)
                    for j in range(max(0, i - 3), min(n, i + k))])
            i = min(n, i + k)
            with open(acked_path + ".tmp", "w") as f:  # the source acks, durable
                f.write(str(i)); f.flush(); os.fsync(f.fileno())
            os.replace(acked_path + ".tmp", acked_path)
            ix.maybe_seal(int(time.time() * 1000))
            time.sleep(0.001)

    def release():
        rnd = random.Random(seed + 1000)
        while not stop.is_set():
            rs = ix.pop_due(int(time.time() * 1000), 100)
            if rs:
                out.write("".join("%d %d %d %d\\n" % (r.seq, r.message.ledger_id, r.message.entry_id, r.release_ts)
                                  for r in rs))
                out.flush(); os.fsync(out.fileno())  # "published" before the commit
                if rnd.random() < 0.5:
                    ix.commit(rs[-1].seq)
            else:
                time.sleep(0.005)

    t1 = threading.Thread(target=intake); t2 = threading.Thread(target=release)
    t1.start(); t2.start(); t1.join()
    deadline = time.monotonic() + 30
    while ix.pending_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set(); t2.join()
    print("DONE", ix.pending_count())
''')


def test_engine_survives_sigkills(tmp_path: Path):
    n, kills = 3000, 5
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "base").write_text(str(int(time.time() * 1000) + 300))
    rnd = random.Random(42)
    for k in range(kills + 1):
        proc = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(tmp_path), str(n), str(k)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if k < kills:
            time.sleep(rnd.uniform(0.3, 1.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        else:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()[-3000:]
            assert out.decode().strip() == "DONE 0"
    by_seq = {}
    for line in (tmp_path / "released.log").read_text().splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue  # a line torn by the kill
        seq, ledger, entry, ts = map(int, parts)
        assert by_seq.setdefault(seq, (ts, ledger, entry)) == (ts, ledger, entry), f"seq {seq} changed its item"
    assert sorted(by_seq) == list(range(1, len(by_seq) + 1))
    keys = [by_seq[s] for s in sorted(by_seq)]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    items = {(ledger, entry) for _, ledger, entry in keys}
    assert len(items) == len(keys), "an item was released under two seqs"
    assert items == {(1 + j // 500, j % 500) for j in range(n)}
    base = int((tmp_path / "base").read_text())
    assert all(ts >= base + (((ledger - 1) * 500 + entry) * 7919) % 5000 for ts, ledger, entry in keys)
