"""The summary: ratios writer / the other per part and the targets."""
from __future__ import annotations

from typing import Any, Dict, Optional

from vs_pulsar.common import MB


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def get(results: Dict[str, Dict[str, Any]], part: str, who: str, key: str) -> Optional[float]:
    v = results.get(part, {}).get(who, {}).get(key)
    return float(v) if v is not None else None


def summary(results: Dict[str, Dict[str, Any]], smoke: bool) -> None:
    bucket = "bucket"
    print("\nsummary (ratios: writer / the other):")
    sat = results.get("saturated", {})
    if sat:
        for who in sat:
            if who != "writer":
                print(f"  saturated msg/s writer/{who}: sustained "
                      f"{ratio(get(results, 'saturated', 'writer', 'sustained'), get(results, 'saturated', who, 'sustained'))}"
                      f", from due {ratio(get(results, 'saturated', 'writer', 'from_due'), get(results, 'saturated', who, 'from_due'))}")
        w, b = get(results, "saturated", "writer", "sustained"), get(results, "saturated", bucket, "sustained")
        if w is not None and b:
            print(f"  target writer >= 0.8x bucket (sustained): {w / b:.2f} -> {'met' if w >= 0.8 * b else 'NOT met'}")
    late = results.get("lateness", {})
    if late:
        w = late.get("writer")
        for who, r in late.items():
            if who != "writer" and w:
                print(f"  lateness p99 writer/{who}: {ratio(w['p99'], r['p99'])} ({w['p99']:.1f} vs {r['p99']:.1f} ms); "
                      f"early writer {int(w['early'])}, {who} {int(r['early'])}")
        default_tick = [r for who, r in late.items() if who != "writer" and (who.endswith("1 s") or smoke)]
        if w and default_tick:
            best = min(r["p99"] for r in default_tick)
            ok = w["p99"] <= best and w["early"] == 0
            print(f"  target writer p99 <= best tracker's at its default tick ({best:.1f} ms), 0 early: "
                  f"{w['p99']:.1f} ms, {int(w['early'])} early -> {'met' if ok else 'NOT met'}")
    mem = results.get("memory", {})
    if mem.get("writer"):
        for who, r in mem.items():
            if who != "writer":
                print(f"  memory growth writer RSS / {who} (heap after GC + index): "
                      f"{ratio(mem['writer']['growth'], r['tracker_growth'])} ({mem['writer']['growth'] / MB:.1f} vs "
                      f"{r['tracker_growth'] / MB:.1f} MB)")
        if mem.get(bucket):
            ok = mem["writer"]["growth"] <= mem[bucket]["tracker_growth"]
            print(f"  target writer RSS growth <= bucket heap growth: {'met' if ok else 'NOT met'}")
    rec = results.get("recovery", {})
    if rec.get("writer"):
        for who, r in rec.items():
            if who != "writer":
                print(f"  recovery first due writer (from launch) / {who}: from launch "
                      f"{ratio(rec['writer']['first_s'], r['first_s'])}, from healthy "
                      f"{ratio(rec['writer']['first_s'], r['first_from_ready_s'])} ({rec['writer']['first_s']:.2f} s vs "
                      f"{r['first_s']:.2f} / {r['first_from_ready_s']:.2f} s)")
        if rec.get(bucket):
            ok = rec["writer"]["first_s"] <= rec[bucket]["first_from_ready_s"]
            print(f"  target writer first delivery <= bucket's (from healthy): {'met' if ok else 'NOT met'}")
    dd = results.get("dedup", {})
    ours = dd.get("DedupPublisher")
    for who, r in dd.items():
        if ours and who != "DedupPublisher":
            print(f"  dedup msg/s DedupPublisher/{who}: {ratio(ours['rate'], r['rate'])} ({ours['rate']:,.0f} vs "
                  f"{r['rate']:,.0f}); duplicates {ours['duplicates']} / {r['duplicates']}, missing "
                  f"{ours['missing']} / {r['missing']}")


