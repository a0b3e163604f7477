"""Ledger deletion throughput and internalStats load.

1. Deletions/s against one local bookie HTTP server: raw DELETE calls (the baseline), the
   DeletionEngine in-process (in-use check through the ledgersCache + ownership fetch + delete),
   and the LedgerDeletionWorker function end to end (embedded broker, localrun instance).
   Each is printed with its ratio to the raw baseline of the same run.
2. internalStats calls per topic per TTL window under concurrent load (must stay at most 1),
   with a simulated clock spanning several TTLs.

    python bench/bench_deletion.py [--ledgers 2000] [--topics 20] [--runs 3] [--concurrency 1,8]

`--concurrency` runs the worker once per listed maxDeletionsInFlight (default: the worker's default).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "functions"))

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


def run_worker(n: int, topics: int, in_flight: Optional[int] = None) -> Tuple[float, int]:
    """The function end to end: phase one sends, one localrun instance deletes (`in_flight` at once)."""
    from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
    from pulsar_lifecycle.deletion.service import LedgerDeletionService
    from pulsar_lifecycle.runtime.broker import EmbeddedBroker
    from pulsar_lifecycle.runtime.client import quiet_client
    from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions

    with tempfile.TemporaryDirectory() as tmp, InternalStatsServer() as admin, BookieHttpServer() as bookie:
        broker = EmbeddedBroker(data_dir=Path(tmp) / "broker")
        broker.start()
        try:
            work = populate(admin, bookie, n, topics, 3_000_000_000)
            dtopics = DeletionTopics(topic_name="__ledger_deletion_bench")
            client = quiet_client(broker.service_url)
            service = LedgerDeletionService(client, dtopics, None, send_delay_seconds=0)
            for t, l in work:
                service.append(PendingDeleteLedgerInfo(t, LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, l))
            service.close()
            spec = spec_from_config(load_function_config(ROOT / "function-configs" / "ledger-deletion-worker.yaml"), {
                "inputs": dtopics.input_topics(), "parallelism": 1, "userConfig": {
                    "deletionTopicName": dtopics.topic_name, "delayBackend": "broker",
                    "pulsarAdminUrl": admin.url, "bookieHttpUrls": [bookie.url],
                    **({"maxDeletionsInFlight": in_flight} if in_flight else {})}})
            t0 = time.perf_counter()
            runner = LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=Path(tmp) / "run")).start()
            deadline = time.monotonic() + 300
            while len(bookie.deleted) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            dt = time.perf_counter() - t0
            runner.stop()
            client.close()
            assert len(bookie.deleted) == n, f"{len(bookie.deleted)} of {n} deleted"
            calls = max(admin.calls_for(t) for t, _ in work)
        finally:
            broker.stop(remove_data=True)
    return n / dt, calls


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
    args = ap.parse_args()
    levels: List[Optional[int]] = [int(c) for c in args.concurrency.split(",") if c.strip()] or [None]
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
