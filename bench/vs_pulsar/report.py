"""The summary: ratios writer / the other per part and the targets."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from vs_pulsar.common import ratio
from vs_pulsar.dedup import summary_dedup
from vs_pulsar.memory import summary_memory
from vs_pulsar.plans import PUBLISH, payload_of_label, tick_of_label
from vs_pulsar.recovery import summary_recovery


def get(results: Dict[str, Dict[str, Any]], part: str, who: str, key: str) -> Optional[float]:
    v = results.get(part, {}).get(who, {}).get(key)
    return float(v) if v is not None else None


def spread_of(r: Dict[str, Any], key: str) -> str:
    """"median (min–max, n runs)" of a field of an aggregated result."""
    lo, hi = r.get("spread", {}).get(key, [r.get(key), r.get(key)])
    return f"{r.get(key, float('nan')):,.1f} ({lo:,.1f}–{hi:,.1f}, {r.get('ok_runs', 1)} runs)"


def run_ratios(a: Dict[str, Any], b: Dict[str, Any], key: str) -> List[float]:
    """a / b run by run (the i-th run of each on the same standalone)."""
    ra, rb = a.get("run_results", [a]), b.get("run_results", [b])
    return [x[key] / y[key] for x, y in zip(ra, rb) if x.get(key) is not None and y.get(key)]


def ratio_line(a: Dict[str, Any], b: Dict[str, Any], key: str) -> str:
    """The ratio of the medians with the run-by-run ratios' min–max."""
    med = ratio(a.get(key), b.get(key))
    per = run_ratios(a, b, key)
    return med + (f" (runs {min(per):.2f}–{max(per):.2f})" if len(per) > 1 else "")


def attempts_line(results: Dict[str, Dict[str, Any]]) -> str:
    att = sum(int(r.get("attempts", 0)) for part in results.values() for r in part.values())
    abort = sum(int(r.get("aborted", 0)) for part in results.values() for r in part.values())
    return f"{att} runs attempted, {abort} aborted"


def summary_saturated(results: Dict[str, Dict[str, Any]]) -> None:
    sat = results.get("saturated", {})
    if not sat:
        return
    print("  saturated (median msg/s sustained, first -> last arrival; min–max over the runs):")
    print("  | contender | standalone | payload | sustained msg/s | from due msg/s | first after due (ms) | "
          "early | runs (aborted) |")
    for key, r in sat.items():
        label, _, where = key.partition(" [")
        base, payload = payload_of_label(label)
        print(f"  | {base} | {where.rstrip(']') or base} | {payload} B | {spread_of(r, 'sustained')} | "
              f"{spread_of(r, 'from_due')} | {r.get('first_after_due_ms', float('nan')):,.0f} | "
              f"{r.get('early', 0):,.0f} | {r.get('ok_runs', 0)} of {r.get('attempts', 0)} ({r.get('aborted', 0)}) |")
    for key, r in sat.items():
        base, payload = payload_of_label(key)
        if base in ("writer", "batched-pipe") or "[" in key:
            continue
        w = sat.get(f"writer, {payload} B [{base}]")
        if w and w.get("ok_runs"):
            print(f"  saturated writer/{key} (same standalone): sustained {ratio_line(w, r, 'sustained')}, from due "
                  f"{ratio_line(w, r, 'from_due')}")
    for key, w in sat.items():
        if key.startswith("writer, ") and key.endswith("[inmemory]"):
            pipe = sat.get(key.replace("writer", "batched-pipe", 1))
            if pipe and pipe.get("ok_runs") and w.get("ok_runs"):
                print(f"  saturated {key} / batched pipe: sustained {ratio_line(w, pipe, 'sustained')}")
    w, b = sat.get("writer, 100 B [bucket]"), sat.get("bucket, 100 B")
    if w and b and w.get("ok_runs") and b.get("ok_runs"):
        ok = w["sustained"] >= 0.8 * b["sustained"]
        print(f"  target writer >= 0.8x bucket (sustained, 100 B, defaults): {w['sustained'] / b['sustained']:.2f} -> "
              f"{'met' if ok else 'NOT met'}")


def summary_lateness(results: Dict[str, Dict[str, Any]], smoke: bool) -> None:
    late = results.get("lateness", {})
    if not late:
        return
    print("  lateness (arrival - deliver-at, ms; medians over the runs, min–max of p99; first seconds left out):")
    print("  | contender | semantics | tick | p50 | p99 | max | early (counted / all) | runs (aborted) |")
    for key, r in late.items():
        sem = "strict" if "strict" in key else "non-strict"
        if key.startswith("writer"):
            sem = "never early"
        elif key.startswith(PUBLISH):
            sem = "floor: published at the due instant"
        tick = tick_of_label(key)
        print(f"  | {key} | {sem} | {tick or '-'} | {r.get('p50', float('nan')):,.1f} | {spread_of(r, 'p99')} | "
              f"{r.get('max', float('nan')):,.1f} | {r.get('early', 0):,.0f} / {r.get('early_all', 0):,.0f} of "
              f"{r.get('n', 0):,.0f} | {r.get('ok_runs', 0)} of {r.get('attempts', 0)} ({r.get('aborted', 0)}) |")
    for key, r in late.items():
        if key.startswith(PUBLISH) and r.get("ok_runs"):
            w = late.get("writer" + key[len(PUBLISH):])  # the writer on the same standalone
            if w and w.get("ok_runs"):
                print(f"  lateness p99 writer / its floor ({key}): {ratio_line(w, r, 'p99')} "
                      f"({w['p99']:.1f} vs {r['p99']:.1f} ms; p50 {w['p50']:.1f} vs {r['p50']:.1f} ms)")
            continue
        if key.startswith("writer") or not r.get("ok_runs"):
            continue
        short = key.split(",")[0]
        w = late.get(f"writer [{short}]") or late.get("writer")
        if w and w.get("ok_runs"):
            print(f"  lateness p99 writer/{key}: {ratio_line(w, r, 'p99')} ({w['p99']:.1f} vs {r['p99']:.1f} ms); "
                  f"early writer {int(w.get('early_all', 0))}, {key} {int(r.get('early_all', 0))}")
    writers = [r for k, r in late.items() if k.startswith("writer") and r.get("ok_runs")]
    for sem in ("non-strict", "strict"):
        default_tick = [r for k, r in late.items() if not k.startswith(("writer", PUBLISH)) and r.get("ok_runs")
                        and ("strict" in k) == (sem == "strict") and (tick_of_label(k) == 1000 or smoke)]
        if writers and default_tick:
            best = min(r["p99"] for r in default_tick)
            wp99 = statistics.median(r["p99"] for r in writers)
            early = sum(int(r.get("early_all", 0)) for r in writers)
            ok = wp99 <= best and early == 0
            print(f"  target writer p99 <= best {sem} tracker's at the default tick ({best:.1f} ms), 0 early: "
                  f"{wp99:.1f} ms, {early} early -> {'met' if ok else 'NOT met'}")


def summary(results: Dict[str, Dict[str, Any]], smoke: bool) -> None:
    print(f"\nsummary (ratios: writer / the other; {attempts_line(results)}):")
    summary_saturated(results)
    summary_lateness(results, smoke)
    summary_memory(results)
    summary_recovery(results)
    summary_dedup(results)
