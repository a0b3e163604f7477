"""Console progress for long Spark jobs: stages and tasks done, rows per second (rich).

Spark's own console bar is switched off (it interleaves with our output); instead a thread polls
the driver's status tracker twice a second. Output goes to stderr so that stdout stays for the
command's summary.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


@dataclass
class StageTimes:
    """What a job spent per named phase (filled by JobProgress.phase)."""

    seconds: Dict[str, float] = field(default_factory=dict)


class JobProgress:
    """Context manager showing a job's progress; `phase(name)` names the current step,
    `rows(n)` adds processed rows (for rows/s). `summary()` gives the totals.

    Args:
        spark: the SparkSession whose status tracker is polled (None = phases only).
        title: shown in front of the bar.
        console: rich console (default: stderr); `enabled=False` shows nothing (tests).
    """

    def __init__(self, spark: Any, title: str, *, console: Optional[Console] = None, enabled: bool = True,
                 poll_seconds: float = 0.5) -> None:
        self._tracker = spark.sparkContext.statusTracker() if spark is not None else None
        self._title = title
        self._console = console or Console(stderr=True)
        self._enabled = enabled
        self._poll = poll_seconds
        self._rows = 0
        self._phase = "starting"
        self._phase_t0 = time.monotonic()
        self._t0 = time.monotonic()
        self.times = StageTimes()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._progress: Optional[Progress] = None
        self._task: Any = None
        self._lock = threading.Lock()
        self._expected = 0
        self._expected_t0 = 0.0

    def __enter__(self) -> "JobProgress":
        self._t0 = self._phase_t0 = time.monotonic()
        if self._enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(), console=self._console, transient=False)
            self._progress.start()
            self._task = self._progress.add_task(self._title, total=None, detail="")
            self._thread = threading.Thread(target=self._run, name="spark-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close_phase()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._progress is not None:
            self._refresh()
            self._progress.stop()

    def phase(self, name: str) -> None:
        """Start a named step (the previous one's time goes into `times`)."""
        with self._lock:
            self._close_phase()
            self._phase = name
            self._phase_t0 = time.monotonic()

    def expect_rows(self, n: int) -> None:
        """The rows the current phase processes: the display estimates rows/s from its tasks."""
        with self._lock:
            self._expected = int(n)
            self._expected_t0 = time.monotonic()

    def rows(self, n: int) -> None:
        """Count `n` more rows processed."""
        with self._lock:
            self._rows += int(n)

    def _close_phase(self) -> None:
        if self._phase != "starting":
            self.times.seconds[self._phase] = self.times.seconds.get(self._phase, 0.0) + (
                time.monotonic() - self._phase_t0)

    def summary(self) -> Dict[str, Any]:
        """elapsed seconds, rows, rows per second and the seconds per phase."""
        elapsed = time.monotonic() - self._t0
        return {"elapsed_s": round(elapsed, 3), "rows": self._rows,
                "rows_per_s": round(self._rows / elapsed) if elapsed > 0 else 0,
                "phases_s": {k: round(v, 3) for k, v in self.times.seconds.items()}}

    def _tasks(self) -> tuple:
        """(tasks done, tasks total, tasks running, stages active) of the active stages."""
        done = total = running = active = 0
        if self._tracker is None:
            return done, total, running, active
        for sid in self._tracker.getActiveStageIds():
            info = self._tracker.getStageInfo(sid)
            if info is None:
                continue
            active += 1
            done += info.numCompletedTasks
            total += info.numTasks
            running += info.numActiveTasks
        return done, total, running, active

    def _refresh(self) -> None:
        done, total, running, active = self._tasks()
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        detail = f"{self._phase}: {active} stage(s) active, tasks {done}/{total} ({running} running)"
        if self._rows:
            detail += f", {self._rows:,} rows, {self._rows / elapsed:,.0f} rows/s"
        elif self._expected and total:
            est = self._expected * done / total  # tasks of one stage hold about equal shares
            detail += f", ~{est:,.0f} of {self._expected:,} rows, ~{est / max(time.monotonic() - self._expected_t0, 1e-9):,.0f} rows/s"
        if self._progress is not None:
            self._progress.update(self._task, detail=detail,
                                  total=total or None, completed=done)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self._refresh()
            except Exception:  # the JVM may be shutting down; progress is cosmetic, never fail the job
                return
