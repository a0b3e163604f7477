"""bench/bench_vs_pulsar.py in parts: plans (the standalones), common (Ctx, helpers), one module per
measurement (saturated, lateness, memory, recovery, dedup), report (summary and ratios), driver (the runs)."""
