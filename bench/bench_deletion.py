"""Ledger deletion throughput and internalStats load.

1. Deletions/s against one local bookie HTTP server: raw DELETE calls (the baseline), the
   DeletionEngine in-process (in-use check through the ledgersCache + ownership fetch + delete),
   and the LedgerDeletionWorker function end to end (embedded broker, localrun instance).
   Each is printed with its ratio to the raw baseline of the same run.
2. internalStats calls per topic per TTL window under concurrent load (must stay at most 1),
   with a simulated clock spanning several TTLs.

    python bench/bench_deletion.py [--ledgers 2000] [--topics 20] [--runs 3] [--concurrency 1,8]
    python bench/bench_deletion.py --storage pulsar [--ledgers 300] [--topics 10] [--concurrency 1,8]

`--concurrency` runs the worker once per listed maxDeletionsInFlight (default: the worker's default).
`--storage pulsar` runs 1. against real storage: an Apache Pulsar standalone (a fresh one per
contender once the script deletes 500 ledgers or more), orphan ledgers made there as PIP-186
describes (bench/_real_orphans.py), its bookie HTTP API and admin REST.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, Tuple

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "functions"))
sys.path.insert(0, str(ROOT / "bench"))

from pulsar_lifecycle.deletion.admin import PulsarAdminClient  # noqa: E402
from pulsar_lifecycle.deletion.codec import encode  # noqa: E402
from pulsar_lifecycle.deletion.engine import DeletionEngine  # noqa: E402
from pulsar_lifecycle.deletion.engine import DeletionOutcome as Outcome  # noqa: E402
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType, PendingDeleteLedgerInfo  # noqa: E402
from pulsar_lifecycle.deletion.oracle import ComponentOracle, InternalStatsOracle  # noqa: E402
from pulsar_lifecycle.deletion.routing import StorageRouter  # noqa: E402
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient, BookieLedgerStorage  # noqa: E402
from pulsar_lifecycle.deletion.topics import DeletionTopics  # noqa: E402
from servers.bookie_http_server import BookieHttpServer, pulsar_metadata  # noqa: E402
from servers.internal_stats_server import InternalStatsServer  # noqa: E402


def populate(admin: InternalStatsServer, bookie: BookieHttpServer, n: int, topics: int, base: int) -> List[Tuple[str, int]]:
    """`n` removable ledgers spread over `topics` topics, each with a newer current ledger."""
    work: List[Tuple[str, int]] = []
    for t in range(topics):
        topic = f"public/default/bench-{base}-{t}-partition-0"
        current = base + 10_000_000 + t
        admin.set_topic(topic, ledgers=[current])
        bookie.add_ledger(current, pulsar_metadata(topic))
        for i in range(t, n, topics):
            lid = base + i
            bookie.add_ledger(lid, pulsar_metadata(topic))
            work.append((topic, lid))
    return work


def make_engine(admin_url: str, bookie_url: str, ttl: float = 600, clock=time.monotonic) -> Tuple[DeletionEngine, InternalStatsOracle]:
    oracle = InternalStatsOracle(PulsarAdminClient.connect([admin_url]), ttl_seconds=ttl, clock=clock)
    router = StorageRouter(bookkeeper=BookieLedgerStorage(BookieHttpClient.connect([bookie_url])))
    return DeletionEngine(ComponentOracle(default=oracle), router, DeletionTopics()), oracle


def run_raw(n: int, topics: int) -> float:
    with InternalStatsServer() as admin, BookieHttpServer() as bookie:
        work = populate(admin, bookie, n, topics, 1_000_000_000)
        client = BookieHttpClient.connect([bookie.url])
        t0 = time.perf_counter()
        for _topic, lid in work:
            client.delete(lid)
        dt = time.perf_counter() - t0
        assert len(bookie.deleted) == n
    return n / dt


def run_engine(n: int, topics: int) -> Tuple[float, int]:
    with InternalStatsServer() as admin, BookieHttpServer() as bookie:
        work = populate(admin, bookie, n, topics, 2_000_000_000)
        engine, _ = make_engine(admin.url, bookie.url)
        payloads = [encode(PendingDeleteLedgerInfo(t, LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, l)) for t, l in work]
        t0 = time.perf_counter()
        for p in payloads:
            d = engine.handle(p, 0, None)
            assert d.outcome is Outcome.DELETED, d
        dt = time.perf_counter() - t0
        calls = max(admin.calls_for(t) for t, _ in work)
    return n / dt, calls


def _worker_pass(service_url: str, admin_url: str, bookie_url: str, work: List[Tuple[str, int]], tmp: Path,
                 deleted: Callable[[], int], in_flight: Optional[int], name: str,
                 subscribe: Optional[Callable[[List[str], str], None]] = None) -> float:
    """Phase one sends a request per ledger in `work`; one localrun instance of the shipped worker
    config (`in_flight` deletions at once) deletes them; deletions/s from its start until
    `deleted()` reaches len(work). `subscribe(topics, subscription)` creates the worker's
    subscription before phase one where the broker would otherwise trim unsubscribed entries."""
    from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
    from pulsar_lifecycle.deletion.service import LedgerDeletionService
    from pulsar_lifecycle.runtime.client import quiet_client
    from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions

    n = len(work)
    dtopics = DeletionTopics(namespace="public/default", topic_name=name)
    if subscribe is not None:
        subscribe(dtopics.input_topics(), f"{name}-worker")
    client = quiet_client(service_url)
    try:
        service = LedgerDeletionService(client, dtopics, None, send_delay_seconds=0)
        for t, lid in work:
            service.append(PendingDeleteLedgerInfo(t, LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, lid))
        service.close()
    finally:
        client.close()
    spec = spec_from_config(load_function_config(ROOT / "function-configs" / "ledger-deletion-worker.yaml"), {
        "inputs": dtopics.input_topics(), "parallelism": 1, "subName": f"{name}-worker", "userConfig": {
            "deletionNamespace": dtopics.namespace, "deletionTopicName": dtopics.topic_name, "delayBackend": "broker",
            "pulsarAdminUrl": admin_url, "bookieHttpUrls": [bookie_url],
            **({"maxDeletionsInFlight": in_flight} if in_flight else {})}})
    t0 = time.perf_counter()
    runner = LocalRunner(spec, LocalRunOptions(broker_service_url=service_url, data_dir=tmp / name)).start()
    try:
        deadline = time.monotonic() + 600
        while (done := deleted()) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        dt = time.perf_counter() - t0
    finally:
        runner.stop()
    assert done == n, f"{done} of {n} deleted"
    return n / dt


def run_worker(n: int, topics: int, in_flight: Optional[int] = None) -> Tuple[float, int]:
    """The function end to end on the embedded broker against the stand-ins."""
    from pulsar_lifecycle.runtime.broker import EmbeddedBroker

    with tempfile.TemporaryDirectory() as tmp, InternalStatsServer() as admin, BookieHttpServer() as bookie:
        broker = EmbeddedBroker(data_dir=Path(tmp) / "broker")
        broker.start()
        try:
            work = populate(admin, bookie, n, topics, 3_000_000_000)
            rate = _worker_pass(broker.service_url, admin.url, bookie.url, work, Path(tmp),
                                lambda: len(bookie.deleted), in_flight, "__ledger_deletion_bench")
            calls = max(admin.calls_for(t) for t, _ in work)
        finally:
            broker.stop(remove_data=True)
    return rate, calls


# -- real storage: a Pulsar standalone's bookie and admin API ------------------------------------

class _Settled(logging.Handler):
    """The ledger ids the deletion engine logged as deleted or already gone."""

    def __init__(self, wanted: List[int]) -> None:
        super().__init__(logging.INFO)
        self.wanted = set(wanted)
        self.ids: Set[int] = set()

    def count(self) -> int:
        """How many of the wanted ledgers are settled."""
        return len(self.ids & self.wanted)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(("deleted ", "already gone ")):
            m = re.search(r"ledger=(\d+)", text)
            if m:
                self.ids.add(int(m.group(1)))


def _subscriber(admin_url: str) -> Callable[[List[str], str], None]:
    def subscribe(topics: List[str], subscription: str) -> None:
        # The standalone rolls and trims every 5 entries: without a subscription the requests would go.
        for topic in topics:
            short = topic.split("://", 1)[1]
            r = requests.put(f"{admin_url}/admin/v2/persistent/{short}/subscription/{subscription}", timeout=30)
            assert r.status_code in (204, 409), (topic, r.status_code, r.text)
    return subscribe


def _real_pass(p, name: str, level: Optional[int], n: int, topics: int, tmp: Path, tag: str) -> Tuple[float, int]:
    """One contender on fresh orphans of `p`: (deletions/s, how many the broker deleted first)."""
    from _real_orphans import make_orphans

    orphans = make_orphans(p, n, topics, tag)
    bookie = BookieHttpClient.connect([p.bookie_http_url])
    try:
        gone = len(set(orphans.ids()) - bookie.list_ledger_ids())  # the broker's own retry came first
        if name == "raw":
            t0 = time.perf_counter()
            for lid in orphans.ids():
                bookie.delete(lid)
            rate = n / (time.perf_counter() - t0)
        elif name == "engine":
            engine, _ = make_engine(p.admin_url, p.bookie_http_url, ttl=1)
            payloads = [encode(PendingDeleteLedgerInfo(t, LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, lid))
                        for t, lid in orphans.work]
            t0 = time.perf_counter()
            for payload in payloads:
                d = engine.handle(payload, 0, None)
                assert d.outcome in (Outcome.DELETED, Outcome.ALREADY_GONE), d
            rate = n / (time.perf_counter() - t0)
        else:
            # Settled ledgers counted from the worker's own log lines, not by polling the bookie.
            settled = _Settled(orphans.ids())
            engine_log = logging.getLogger("pulsar_lifecycle.deletion.engine")
            engine_log.addHandler(settled)
            engine_log.setLevel(logging.INFO)
            try:
                rate = _worker_pass(p.service_url, p.admin_url, p.bookie_http_url, orphans.work, tmp, settled.count,
                                    level, f"__ledger_deletion_{tag}", _subscriber(p.admin_url))
            finally:
                engine_log.removeHandler(settled)
        still = set(orphans.ids()) & bookie.list_ledger_ids()
        assert not still, f"{name}: {len(still)} of the {n} orphan ledgers are still on the bookie"
    finally:
        bookie.endpoints.close()
    age = time.monotonic() - orphans.made_at
    if age > 55:  # the broker retries its own failed deletes a minute after the trim
        print(f"  {name}: finished {age:.0f}s after its orphans were made; the broker may have deleted some itself",
              flush=True)
    return rate, gone


# Deletes one standalone takes before its bookie nears ZooKeeper's connection limit (1,000).
DELETES_PER_STANDALONE = 500


def run_real(n: int, topics: int, runs: int, levels: List[Optional[int]]) -> None:
    """Raw DELETE, the engine one at a time and the worker at each level, each on orphans of its own
    (bench/_real_orphans.py) on a real standalone: its bookie HTTP API and admin REST.

    The bookie's HTTP DELETE opens a BookKeeper client (and a ZooKeeper session) per call and never
    closes it; near ZooKeeper's per-host connection limit (1,000 on the standalone) the bookie's HTTP
    API stops answering. So each contender gets a fresh standalone unless the whole script deletes
    fewer than DELETES_PER_STANDALONE ledgers."""
    from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
    from support.rolling import ROLLING

    names = ["raw", "engine"] + [f"worker x{c or 'default'}" for c in levels]
    rates: Dict[str, List[float]] = {k: [] for k in names}
    fresh_each = n * len(names) * runs >= DELETES_PER_STANDALONE
    with contextlib.ExitStack() as whole:
        tmp = Path(whole.enter_context(tempfile.TemporaryDirectory()))
        shared = None if fresh_each else whole.enter_context(
            PulsarStandalone(data_dir=tmp / "pulsar", config=dict(ROLLING)))
        for r in range(runs):
            parts = []
            for i, name in enumerate(names):
                with contextlib.ExitStack() as one:
                    p = shared or one.enter_context(
                        PulsarStandalone(data_dir=tmp / f"pulsar-{r}-{i}", config=dict(ROLLING)))
                    if r == 0 and i == 0:
                        print(f"Apache Pulsar {p.release.version if p.release else '?'} standalone, up in "
                              f"{p.startup_seconds:.1f}s ({'one per contender' if fresh_each else 'one for all'})",
                              flush=True)
                    rate, gone = _real_pass(p, name, levels[i - 2] if i >= 2 else None, n, topics, tmp, f"r{r}_{i}")
                rates[name].append(rate)
                parts.append(f"{name} {rate:6.0f} del/s"
                             + (f" ({rate / rates['raw'][-1]:.2f}x raw)" if name != "raw" else "")
                             + (f" [{gone} deleted by the broker first]" if gone else ""))
                print(f"  run {r + 1}, {parts[-1]}", flush=True)
            print(f"run {r + 1}: " + " | ".join(parts), flush=True)
    raw = statistics.median(rates["raw"])
    print(f"median (real bookie, {n} orphan ledgers per contender): raw {raw:.0f} del/s"
          + "".join(f"; {k} {statistics.median(v):.0f} del/s (ratio {statistics.median(v) / raw:.2f})"
                    for k, v in rates.items() if k != "raw"), flush=True)


class SimClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, dt: float) -> None:
        with self.lock:
            self.t += dt


def run_ttl_load(requests: int, topics: int, threads: int, windows: int, ttl: float = 600.0) -> Dict[str, float]:
    """Concurrent in-use checks over `windows` TTLs of simulated time; calls per topic per window."""
    with InternalStatsServer() as admin, BookieHttpServer() as bookie:
        clock = SimClock()
        _, oracle = make_engine(admin.url, bookie.url, ttl=ttl, clock=clock)
        names = [f"public/default/ttl-{t}-partition-0" for t in range(topics)]
        for i, name in enumerate(names):
            admin.set_topic(name, ledgers=[i * 1000 + k for k in range(10)])
        load_times: Dict[str, List[float]] = {}
        inner = oracle.cache.loader
        lock = threading.Lock()

        def timed_loader(topic: str):  # records when each admin load happened, in simulated time
            with lock:
                load_times.setdefault(topic, []).append(clock())
            return inner(topic)

        oracle.cache.loader = timed_loader
        step = ttl * windows / requests

        def one(i: int) -> None:
            topic = names[i % topics]
            oracle.check(PendingDeleteLedgerInfo(topic, LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, (i % topics) * 1000 + 3))
            clock.advance(step)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(requests)))
        total = sum(admin.calls_for(n) for n in names)
        spanned = clock() / ttl
    # The invariant: two admin calls for one topic are never less than one TTL apart.
    gaps = [b - a for ts in load_times.values() for a, b in zip(sorted(ts), sorted(ts)[1:])]
    return {"total_calls": total, "loads": sum(len(v) for v in load_times.values()), "topics": topics,
            "ttls": spanned, "per_topic_per_ttl": total / (topics * spanned),
            "min_gap_ttl": (min(gaps) / ttl) if gaps else float("inf"),
            "hits": oracle.cache.stats.hits, "misses": oracle.cache.stats.misses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=2000)
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-worker", action="store_true", help="skip the end-to-end function run")
    ap.add_argument("--concurrency", default="", help="comma-separated maxDeletionsInFlight values for the worker")
    ap.add_argument("--storage", choices=("stand-in", "pulsar"), default="stand-in",
                    help="stand-in: tests/servers' bookie and admin API answering at once (default); pulsar: a real "
                         "Apache Pulsar standalone's bookie HTTP API and admin REST, on orphan ledgers made there")
    args = ap.parse_args()
    levels: List[Optional[int]] = [int(c) for c in args.concurrency.split(",") if c.strip()] or [None]
    if args.storage == "pulsar":
        run_real(args.ledgers, args.topics, args.runs, levels)
        return
    raw: List[float] = []
    eng: List[float] = []
    wrk: Dict[Optional[int], List[float]] = {c: [] for c in levels}
    for r in range(args.runs):
        raw.append(run_raw(args.ledgers, args.topics))
        e, ecalls = run_engine(args.ledgers, args.topics)
        eng.append(e)
        line = f"run {r + 1}: raw {raw[-1]:8.0f} del/s | engine {e:8.0f} del/s ({e / raw[-1]:.2f}x raw, internalStats/topic {ecalls})"
        for c in levels if not args.skip_worker else []:
            w, wcalls = run_worker(args.ledgers, args.topics, c)
            wrk[c].append(w)
            line += (f" | worker{'' if c is None else f' x{c}'} {w:8.0f} del/s ({w / raw[-1]:.2f}x raw, "
                     f"internalStats/topic {wcalls})")
        print(line, flush=True)
    print(f"median: raw {statistics.median(raw):.0f} del/s; engine {statistics.median(eng):.0f} del/s "
          f"(ratio {statistics.median(eng) / statistics.median(raw):.2f})"
          + "".join(f"; worker{'' if c is None else f' x{c}'} {statistics.median(w):.0f} del/s "
                    f"(ratio {statistics.median(w) / statistics.median(raw):.2f})" for c, w in wrk.items() if w))
    load = run_ttl_load(requests=20000, topics=50, threads=8, windows=5)
    print(f"internalStats under load (20000 checks, 8 threads): {load['total_calls']} calls for {load['topics']} topics over "
          f"{load['ttls']:.1f} TTLs = {load['per_topic_per_ttl']:.2f} per topic per TTL; smallest gap between two calls "
          f"for one topic = {load['min_gap_ttl']:.2f} TTL (cache hits {load['hits']}, misses {load['misses']})")
    assert load["total_calls"] == load["loads"], "admin calls outside the cache loader"
    assert load["min_gap_ttl"] >= 1.0, "two internalStats calls for one topic within one TTL"


if __name__ == "__main__":
    main()
