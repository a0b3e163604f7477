"""The runs: one standalone per BrokerConf of the plan, started, its tasks run in order, stopped."""
from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import pulsar

import _writer_common as wc
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from vs_pulsar.common import Ctx
from vs_pulsar.dedup import dedup
from vs_pulsar.lateness import lateness
from vs_pulsar.memory import memory_native, memory_writer
from vs_pulsar.plans import BROKER_CONFIG, plan
from vs_pulsar.recovery import recovery_native, recovery_writer
from vs_pulsar.saturated import saturated_native, saturated_pipe, saturated_writer


# -- driver -----------------------------------------------------------------------------------------------
def run_task(ctx: Ctx, part: str, who: str) -> Dict[str, Any]:
    if part == "saturated":
        return saturated_pipe(ctx) if who == "batched-pipe" else (
            saturated_writer(ctx) if who == "writer" else saturated_native(ctx, who))
    if part == "lateness":
        return lateness(ctx, who)
    if part == "dedup":
        return dedup(ctx, who)
    if part == "memory":
        return memory_writer(ctx) if who == "writer" else memory_native(ctx, who)
    return recovery_writer(ctx) if who == "writer" else recovery_native(ctx, who)


def run_all(args: argparse.Namespace, parts: List[str]) -> Dict[str, Dict[str, Any]]:
    """Every task of the plan that `parts`, --brokers and --skip select; results[part][contender]."""
    results: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vs-pulsar-") as tmp:
        for conf in plan(args.smoke):
            skip = {tuple(x.split(":", 1)) for x in args.skip.split(";") if ":" in x}
            tasks = [(p, w) for p, w in conf.tasks if p in parts and (p, w) not in skip]
            wanted = [b.strip() for b in args.brokers.split(",") if b.strip()]
            if not tasks or (wanted and not any(b in conf.label for b in wanted)):
                continue
            broker = PulsarStandalone(tracker=conf.tracker, tick_millis=conf.tick_ms, deduplication=conf.dedup,
                                      config=dict(BROKER_CONFIG))
            t0 = time.monotonic()
            broker.start()
            print(f"broker {conf.label}: Apache Pulsar {broker.release.version if broker.release else '?'} started in "
                  f"{time.monotonic() - t0:.1f} s ({broker.service_url}); load average {os.getloadavg()[0]:.2f}",
                  flush=True)
            ctx = Ctx(args, broker, quiet_client(broker.service_url), Path(tmp) / re.sub(r"[^a-z0-9]+", "-", conf.label))
            try:
                for part, who in tasks:
                    results.setdefault(part, {})[who] = run_task(ctx, part, who)
            finally:
                for handle in ctx.handles.values():
                    if isinstance(handle[-1], pulsar.Consumer):
                        handle[-1].close()
                    if len(handle) == 4:
                        wc.stop_process(handle[2])
                ctx.client.close()
                broker.stop()
    return results
