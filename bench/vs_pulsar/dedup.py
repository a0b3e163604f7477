"""Part 5: de-duplication across a producer's SIGKILL and resume."""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pulsar

import _java_dedup as java_dedup
import _writer_common as wc
from pulsar_lifecycle.runtime.client import quiet_client
from vs_pulsar.common import (
    BenchFailure,
    Ctx,
    fresh_dir,
    fresh_topic,
    ratio,
)

# the command whose `dedup-child` subcommand runs dedup_child in a process of its own
SCRIPT = Path(__file__).resolve().parent.parent / "bench_vs_pulsar.py"
DEDUP_PRODUCER = "bench-dedup"
DEDUP_BURST = 1000
DEDUP_CHECKPOINT_EVERY = 5000


# -- 5. de-duplication -------------------------------------------------------------------------------------
# The contenders of part 5: (child kind, batched, resume point) per label.
DEDUP_CONTENDERS = {
    "DedupPublisher": ("ours", True, "checkpoint"),
    # Pulsar's own pattern: the new producer asks the broker for the last id it has
    # (Producer.last_sequence_id) and skips ids up to it; batched like ours.
    "broker dedup": ("broker", True, "last-sequence-id"),
    # The broker drops every id it already has: unbatched, the application resends from its checkpoint.
    "broker dedup, unbatched": ("broker", False, "checkpoint"),
    # Batched and resent from the checkpoint: a batch whose first id the broker has is dropped whole,
    # ids above the broker's last in that batch too (a finding, not a failure of the benchmark).
    "broker dedup, batched, from checkpoint": ("broker", True, "checkpoint"),
    # The Java client's batches (bench/java/BatchedDedupProducer.java): Pulsar's pattern as above, but
    # its batch container sends the batch's highest id too (highest_sequence_id), which the broker
    # records as the producer's last: resuming past getLastSequenceId() skips what the topic has.
    "broker dedup, Java client": ("java", True, "last-sequence-id"),
}


def dedup_child(args: argparse.Namespace) -> None:
    """Child: send ids resume..n to the topic (bursts of DEDUP_BURST), checkpoint the highest
    confirmed id every DEDUP_CHECKPOINT_EVERY (as a source commits its offsets); `ours` through
    DedupPublisher, else a named producer with explicit sequence ids (the broker de-duplicates).
    resume: the checkpoint + 1, or with `last-sequence-id` past the broker's last id too."""
    ckpt = Path(args.checkpoint)
    start = (int(ckpt.read_text()) if ckpt.is_file() else 0) + 1
    client = quiet_client(args.service_url)
    payload_bytes = args.payload_bytes
    confirmed = [start - 1]
    written = [start - 1]

    def checkpoint(value: int, force: bool = False) -> None:
        if force or value - written[0] >= DEDUP_CHECKPOINT_EVERY:
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(str(value))
            os.replace(tmp, ckpt)
            written[0] = value

    t0 = time.monotonic()
    if args.kind == "ours":
        from pulsar_lifecycle.dedup import DedupPublisher, Outcome, OutMessage
        from pulsar_lifecycle.state.directory import DirectoryStateStore

        pub = DedupPublisher(client, DEDUP_PRODUCER, DirectoryStateStore(Path(args.state_dir), "public", "default",
                                                                         "bench"))
        highest = pub.open(args.topic)
        dropped = 0
        for s in range(start, args.n + 1, DEDUP_BURST):
            ids = range(s, min(args.n, s + DEDUP_BURST - 1) + 1)
            outcomes = pub.publish_many(args.topic, [OutMessage(wc.payload_of(i, payload_bytes), i) for i in ids])
            dropped += sum(1 for o in outcomes if o is Outcome.DUPLICATE)
            checkpoint(pub.persisted_seq(args.topic))
        pub.flush(300)
        checkpoint(pub.persisted_seq(args.topic), force=True)
        pub.close()
        note = f"recovered highest={highest} dropped_by_publisher={dropped}"
    else:
        producer = None
        for _ in range(60):  # the killed predecessor's connection may still hold the name for a moment
            try:
                producer = client.create_producer(
                    args.topic, producer_name=DEDUP_PRODUCER, block_if_queue_full=True,
                    batching_enabled=not args.unbatched, batching_max_publish_delay_ms=10, send_timeout_millis=0,
                    compression_type=pulsar.CompressionType.LZ4, max_pending_messages=1000)
                break
            except pulsar.ProducerBusy:
                time.sleep(0.5)
        if producer is None:
            raise SystemExit("broker dedup: producer name still busy after 30 s")
        highest = producer.last_sequence_id()
        if args.resume == "last-sequence-id":
            start = max(start, highest + 1)
            confirmed[0] = start - 1
        lock = threading.Lock()

        def done_up_to(last: int) -> Callable[[pulsar.Result, object], None]:
            def done(res: pulsar.Result, _mid: object) -> None:
                if res == pulsar.Result.Ok:
                    with lock:
                        confirmed[0] = max(confirmed[0], last)
            return done

        for s in range(start, args.n + 1, DEDUP_BURST):
            last = min(args.n, s + DEDUP_BURST - 1)
            for i in range(s, last + 1):
                producer.send_async(wc.payload_of(i, payload_bytes), done_up_to(last) if i == last else None,
                                    sequence_id=i)
            checkpoint(confirmed[0])
        producer.flush()
        checkpoint(confirmed[0], force=True)
        producer.close()
        note = f"broker last_sequence_id={highest}"
    client.close()
    print(f"dedup-child {args.kind}: resumed from {start}, sent up to {args.n} in {time.monotonic() - t0:.1f} s; "
          f"{note}; finished_ms={time.time() * 1000:.0f}", flush=True)


def id_ranges(ids: Sequence[int], most: int = 5) -> str:
    """`a-b, c, ...`: the first `most` runs of consecutive ids."""
    runs: List[Tuple[int, int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs[:most])
    return text + (f" (+{len(runs) - most} more runs)" if len(runs) > most else "")


def dedup(ctx: Ctx, label: str) -> Dict[str, Any]:
    k, a = ctx.args.dedup_messages, ctx.args
    kind, batched, resume = DEDUP_CONTENDERS[label]
    tag = re.sub(r"[^a-z0-9]+", "-", label.lower())
    wd = fresh_dir(ctx.workdir, f"dedup-{tag}")  # its own checkpoint and state in every run
    topic = fresh_topic(f"dedup-{kind}")
    consumer = wc.output_consumer(ctx.client, topic)
    ck = wd / "checkpoint"
    if kind == "java":
        cmd = java_dedup.command(ctx.url, topic, ck, k, a.payload_bytes, resume, batched, DEDUP_PRODUCER)
    else:
        cmd = [sys.executable, str(SCRIPT), "dedup-child", "--kind", kind, "--service-url", ctx.url,
               "--topic", topic, "--state-dir", str(wd / "state"), "--checkpoint", str(ck), "--n", str(k),
               "--payload-bytes", str(a.payload_bytes), "--resume", resume, *([] if batched else ["--unbatched"])]

    def launch() -> subprocess.Popen:
        with open(wd / "child.log", "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def checkpointed() -> int:
        try:
            return int(ck.read_text())
        except (OSError, ValueError):
            return 0

    seen: Dict[int, int] = {}
    first = last = None
    t0 = time.time() * 1000.0
    proc = launch()
    killed_at: Optional[Dict[str, Any]] = None
    deadline = time.monotonic() + a.timeout + k / 500
    quiet_until: Optional[float] = None
    try:
        while time.monotonic() < deadline:
            # SIGKILL mid-run: once half has arrived or the child has confirmed half
            if killed_at is None and (len(seen) >= k // 2 or checkpointed() >= k // 2):
                running = proc.poll() is None
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                killed_at = {"unique": len(seen), "highest": max(seen, default=0), "t_ms": time.time() * 1000.0,
                             "checkpoint": checkpointed(), "child_was_running": running}
                proc = launch()
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                rc_now = proc.poll()
                if killed_at is not None and rc_now == 0:
                    # the resumed child confirmed everything: what is still missing is not coming
                    if len(seen) >= k:
                        break
                    quiet_until = quiet_until or time.monotonic() + 5.0
                    if time.monotonic() >= quiet_until:
                        break
                elif rc_now not in (None, 0):
                    raise BenchFailure(
                        f"dedup {label}: child rc={rc_now}: {wc.log_tail(wd / 'child.log')}") from None
                continue
            quiet_until = None
            now = time.time() * 1000.0
            i = wc.index_of(msg.data())
            consumer.acknowledge(msg)
            seen[i] = seen.get(i, 0) + 1
            first = now if first is None else first
            last = now
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        consumer.close()
    dups = sum(c - 1 for c in seen.values())
    missing = [i for i in range(1, k + 1) if i not in seen]
    children = [ln for ln in wc.log_tail(wd / "child.log", 4000).splitlines() if ln.startswith("dedup-child")]
    # when the resumed child had every send confirmed (it prints that instant as it ends)
    ends = re.findall(r"finished_ms=(\d+)", children[-1]) if children else []
    done_ms = float(ends[0]) if ends else None
    naive = resume == "checkpoint" and kind != "ours" and batched
    if killed_at is None or first is None or last is None or rc != 0 or done_ms is None or (missing and not naive):
        raise BenchFailure(f"dedup {label}: {len(seen):,} of {k:,} arrived (missing {id_ranges(missing)}), "
                           f"killed_at={killed_at}, rc={rc}: {wc.log_tail(wd / 'child.log')}")
    offered_again = max(0, killed_at["highest"] - killed_at["checkpoint"])
    res = {"n": k, "rate": k / max(1e-3, (done_ms - t0) / 1000.0),
           "arrival_rate": len(seen) / max(1e-3, (last - t0) / 1000.0), "duplicates": dups,
           "missing": len(missing), "missing_ids": id_ranges(missing),
           "first_phase_rate": killed_at["unique"] / max(1e-3, (killed_at["t_ms"] - first) / 1000.0),
           "killed_after": killed_at["unique"], "child_was_running": killed_at["child_was_running"],
           "checkpoint": killed_at["checkpoint"], "offered_again_at_least": offered_again, "children": children}
    print(f"  dedup {label:38s}: {res['rate']:8,.0f} msg/s over {k:,} ids incl. the SIGKILL and restart (first "
          f"launch -> the resumed producer has all confirmed; at the consumer {res['arrival_rate']:,.0f} msg/s, "
          f"{res['first_phase_rate']:,.0f} msg/s before the kill); killed after {killed_at['unique']:,} arrived "
          f"(child {'running' if killed_at['child_was_running'] else 'already done'}), checkpoint "
          f"{killed_at['checkpoint']:,} (>= {offered_again:,} ids offered again); duplicates {dups}, missing "
          f"{len(missing)}; " + " / ".join(c.split(": ", 1)[1] for c in children), flush=True)
    if dups:
        if kind == "ours":
            raise BenchFailure(f"dedup {label}: {dups} duplicates")
        print(f"    FINDING dedup {label}: {dups} duplicates", flush=True)
    if missing:
        print(f"    FINDING dedup {label}: {len(missing):,} ids never arrived: {id_ranges(missing)}", flush=True)
    return res


def summary_dedup(results: Dict[str, Dict[str, Any]]) -> None:
    """The summary's de-duplication lines: DedupPublisher against each broker variant and the best exact one."""
    dd = results.get("dedup", {})
    ours = dd.get("DedupPublisher")
    for who, r in dd.items():
        if ours and who != "DedupPublisher":
            print(f"  dedup msg/s DedupPublisher/{who}: {ratio(ours['rate'], r['rate'])} ({ours['rate']:,.0f} vs "
                  f"{r['rate']:,.0f}); duplicates {ours['duplicates']} / {r['duplicates']}, missing "
                  f"{ours['missing']} / {r['missing']}")
    exact = {who: r for who, r in dd.items() if who != "DedupPublisher" and not r["duplicates"] and not r["missing"]}
    if ours and exact:
        best = max(exact, key=lambda who: exact[who]["rate"])
        print(f"  dedup msg/s DedupPublisher / the best exact broker variant ({best}): "
              f"{ratio(ours['rate'], exact[best]['rate'])}")
