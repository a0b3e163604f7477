"""Part 2: a paced producer, arrival - deliver-at per message."""
from __future__ import annotations

import re
import subprocess
from typing import Any, Dict, Optional

import _writer_common as wc
from vs_pulsar.common import (
    PRODUCER_START_MS,
    BenchFailure,
    Ctx,
    fresh_dir,
    fresh_topic,
    require,
    start_profile,
    start_writer,
    stats_of,
    stop_profile,
)
from vs_pulsar.plans import PUBLISH, tick_of_label


# -- 2. lateness -----------------------------------------------------------------------------------------
def lateness(ctx: Ctx, label: str) -> Dict[str, Any]:
    a = ctx.args
    n = int(a.rate * a.seconds)
    proc: Optional[subprocess.Popen] = None
    lead_ms, batching_delay_ms = a.lead_ms, wc.PACED_BATCHING_DELAY_MS
    if label == "writer":
        topics, wd, _port, proc, consumer = start_writer(ctx, "late-writer")
        topic = topics.sched
    elif label == PUBLISH:
        # The floor of a release that publishes at the due instant: each message sent at its
        # deliver-at (stamped with its send time) by a producer batching like the writer's release
        # producer (releaseBatchingDelayMillis, 1 ms), read by the same checking consumer.
        wd = fresh_dir(ctx.workdir, "late-publish")
        topic = fresh_topic("late-publish")
        consumer = wc.output_consumer(ctx.client, topic)
        lead_ms, batching_delay_ms = 0, 1
    else:
        wd = fresh_dir(ctx.workdir, "late-" + re.sub(r"[^a-z0-9]+", "-", label))
        if tick_of_label(label) != ctx.broker.tick_millis:
            raise BenchFailure(f"lateness {label}: the standalone's tick is {ctx.broker.tick_millis} ms")
        topic = fresh_topic("late-" + ctx.broker.tracker)
        consumer = wc.output_consumer(ctx.client, topic)
    paced = None
    try:
        start_ms = wc.now_ms() + PRODUCER_START_MS + a.lead_ms
        paced = wc.start_paced(ctx.url, topic, a.rate, a.seconds, start_ms, lead_ms, a.payload_bytes, wd,
                               native=proc is None and label != PUBLISH, batching_delay_ms=batching_delay_ms)
        spy = start_profile(a, proc.pid, "lateness-writer") if proc is not None else None
        try:
            got = wc.collect(consumer, n, (start_ms - wc.now_ms()) / 1000.0 + a.seconds + a.timeout, quiet_s=2.0,
                             alive=proc)
        finally:
            stop_profile(spy)
        paced_rc = paced.wait(timeout=60)
    finally:
        if paced is not None and paced.poll() is None:
            paced.kill()
            paced.wait(timeout=10)
        rc = wc.stop_process(proc) if proc is not None else 0
        consumer.close()
    if paced_rc != 0:
        raise BenchFailure(f"lateness {label}: paced producer rc={paced_rc}: {wc.log_tail(wd / 'paced.log')}")
    late_all = [t - d for t, d in zip(got.arrival_ms, got.deliver_at)]
    early_all = sum(1 for v in late_all if v < 0)
    require(f"lateness {label}", got, n, ours=proc is not None, early=early_all)
    # The first --lateness-skip-s seconds of the schedule are left out of the figures for every
    # contender (a tracker's, the writer's and the consumer's start-up); early ones are counted in all.
    cut = start_ms + a.lateness_skip_s * 1000.0
    late = [v for v, d in zip(late_all, got.deliver_at) if d >= cut] or late_all
    st = stats_of(late)
    paced_line = wc.log_tail(wd / "paced.log", 200).strip().splitlines()[-1:]
    res = {"n": n, "counted": len(late), **st, "early_all": early_all, "duplicates": got.duplicates,
           "exit_code": rc, "paced": paced_line[0] if paced_line else ""}
    if proc is not None:
        # The writer stamps when it handed each release to the client: how late its release thread
        # was, apart from the publish and the dispatch that follow.
        released = stats_of([r - d for r, d in zip(got.released_at, got.deliver_at) if d >= cut])
        res.update(released_p50=released["p50"], released_p99=released["p99"])
    print(f"  lateness {label:28s}: arrival - deliver-at ms p50 {st['p50']:8.1f}  p99 {st['p99']:8.1f}  max "
          f"{st['max']:8.1f}  min {st['min']:8.1f} (the {len(late):,} due after the first {a.lateness_skip_s:g} s); "
          f"early {int(st['early']):,} of those, {early_all:,} of all {n:,}; duplicates {got.duplicates} "
          + (f"; released-at - deliver-at p50 {res['released_p50']:.1f} p99 {res['released_p99']:.1f} "
             if "released_p99" in res else "") + f"({res['paced']})", flush=True)
    return res


