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
    fresh_topic,
    require,
    start_writer,
    stats_of,
)


# -- 2. lateness -----------------------------------------------------------------------------------------
def lateness(ctx: Ctx, label: str) -> Dict[str, Any]:
    a = ctx.args
    n = int(a.rate * a.seconds)
    wd = ctx.workdir / ("late-" + re.sub(r"[^a-z0-9]+", "-", label))
    wd.mkdir(parents=True, exist_ok=True)
    proc: Optional[subprocess.Popen] = None
    if label == "writer":
        topics, wd, _port, proc, consumer = start_writer(ctx, "late-writer")
        topic = topics.sched
    else:
        topic = fresh_topic("late-" + ctx.broker.tracker)
        consumer = wc.output_consumer(ctx.client, topic)
    paced = None
    try:
        start_ms = wc.now_ms() + PRODUCER_START_MS + a.lead_ms
        paced = wc.start_paced(ctx.url, topic, a.rate, a.seconds, start_ms, a.lead_ms, a.payload_bytes, wd,
                               native=proc is None)
        got = wc.collect(consumer, n, (start_ms - wc.now_ms()) / 1000.0 + a.seconds + a.timeout, quiet_s=2.0,
                         alive=proc)
        paced_rc = paced.wait(timeout=60)
    finally:
        if paced is not None and paced.poll() is None:
            paced.kill()
            paced.wait(timeout=10)
        rc = wc.stop_process(proc) if proc is not None else 0
        consumer.close()
    if paced_rc != 0:
        raise BenchFailure(f"lateness {label}: paced producer rc={paced_rc}: {wc.log_tail(wd / 'paced.log')}")
    late = [t - d for t, d in zip(got.arrival_ms, got.deliver_at)]
    st = stats_of(late)
    require(f"lateness {label}", got, n, ours=proc is not None, early=int(st["early"]))
    paced_line = wc.log_tail(wd / "paced.log", 200).strip().splitlines()[-1:]
    res = {"n": n, **st, "duplicates": got.duplicates, "exit_code": rc, "paced": paced_line[0] if paced_line else ""}
    print(f"  lateness {label:20s}: arrival - deliver-at ms p50 {st['p50']:8.1f}  p99 {st['p99']:8.1f}  max "
          f"{st['max']:8.1f}  min {st['min']:8.1f}; early {int(st['early']):,} of {n:,}; duplicates {got.duplicates} "
          f"({res['paced']})", flush=True)
    return res


