"""SchedulerService's release pipeline without a broker: the next rounds are popped and sent while
earlier ones are unconfirmed, up to releaseRoundsInFlight; the watermark only passes confirmed
rounds; a failed destination stops counting against the window."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from pulsar_lifecycle.bucket import positions
from pulsar_lifecycle.bucket.records import DelayedMessage, Release
from pulsar_lifecycle.clock import FakeClock
from pulsar_lifecycle.scheduler.config import WriterConfig
from pulsar_lifecycle.scheduler.service import SchedulerService
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP

OUT = "persistent://public/default/out"


class _Publisher:
    """Sends are stored at once; confirmations come only when the test calls `confirm`."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.sent: List[Tuple[str, int]] = []
        self.persisted: Dict[str, int] = {}
        self.failed: Dict[str, str] = {}

    def topics(self) -> List[str]:
        return [OUT]

    def partitions(self, topic: str) -> int:
        return 0

    def publish_many(self, dest: str, messages: List[Any], **_: Any) -> None:
        with self.cond:
            self.sent.extend((dest, m.sequence_id) for m in messages)

    def persisted_seq(self, dest: str) -> int:
        with self.cond:
            return self.persisted.get(dest, -1)

    def failed_topics(self) -> Dict[str, str]:
        with self.cond:
            return dict(self.failed)

    def wait_persisted(self, dest: str, seq: int, timeout_s: Optional[float] = 30.0) -> None:
        deadline = time.monotonic() + (timeout_s or 30.0)
        with self.cond:
            while self.persisted.get(dest, -1) < seq:
                if dest in self.failed:
                    raise RuntimeError("send failed")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{seq} not persisted")
                self.cond.wait(left)

    def confirm(self, dest: str, seq: int) -> None:
        with self.cond:
            self.persisted[dest] = max(self.persisted.get(dest, -1), seq)
            self.cond.notify_all()

    def fail(self, dest: str) -> None:
        with self.cond:
            self.failed[dest] = "TopicTerminated"
            self.cond.notify_all()


class _Stats:
    pending = 0


class _Engine:
    """Hands out `rounds` (lists of sequence ids), one per pop_due, all due now."""

    def __init__(self, rounds: List[List[int]]) -> None:
        self.rounds = list(rounds)
        self.popped = 0
        self.committed = 0

    def pop_due(self, now: int, limit: int) -> List[Release]:
        if not self.rounds:
            return []
        self.popped += 1
        out = []
        for seq in self.rounds.pop(0):
            m = DelayedMessage(7, positions.encode(seq, -1), -1, 5, f"m{seq}".encode(), None, {DELIVER_AT_PROP: "5"})
            out.append(Release(seq, m, False, 5))
        return out

    def next_release_time(self) -> Optional[int]:
        return 5 if self.rounds else None

    def commit(self, upto: int) -> None:
        self.committed = upto

    def stats(self) -> _Stats:
        return _Stats()


def _until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _run(rounds: List[List[int]], in_flight: int) -> Tuple[SchedulerService, _Publisher, _Engine, threading.Thread]:
    pub, engine = _Publisher(), _Engine(rounds)
    cfg = WriterConfig(release_rounds_in_flight=in_flight, commit_interval_millis=20, tick_time_millis=20)
    service = SchedulerService(engine, pub, cfg, OUT, OUT + "-INVALID", None, lambda n, v: None,
                               clock=FakeClock(1_700_000_000_000))
    t = threading.Thread(target=service._release_loop, daemon=True)
    t.start()
    return service, pub, engine, t


def _stop(service: SchedulerService, t: threading.Thread) -> None:
    service._stop.set()
    t.join(5)
    assert not t.is_alive()


def test_rounds_go_out_unconfirmed_up_to_the_window_and_the_watermark_waits_for_confirmations():
    rounds = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    service, pub, engine, t = _run(rounds, in_flight=3)
    try:
        _until(lambda: engine.popped == 3)
        time.sleep(0.15)  # several commit intervals and window waits
        # Three rounds sent, none confirmed: no fourth pop, nothing committed.
        assert engine.popped == 3
        assert [s for _, s in pub.sent] == [1, 2, 3, 4, 5, 6]
        assert engine.committed == 0
        assert service.window_waits > 0
        pub.confirm(OUT, 2)  # the oldest round: room for one more
        _until(lambda: engine.popped == 4)
        _until(lambda: engine.committed == 2)
        time.sleep(0.1)
        assert engine.popped == 4 and engine.committed == 2
        pub.confirm(OUT, 10)
        _until(lambda: engine.popped == 5 and engine.committed == 10)
    finally:
        _stop(service, t)
    assert [s for _, s in pub.sent] == list(range(1, 11))  # release order kept across the pipeline


def test_one_round_in_flight_sends_the_next_only_after_the_previous_is_confirmed():
    service, pub, engine, t = _run([[1], [2], [3]], in_flight=1)
    try:
        _until(lambda: engine.popped == 1)
        time.sleep(0.1)
        assert engine.popped == 1
        pub.confirm(OUT, 1)
        _until(lambda: engine.popped == 2)
        pub.confirm(OUT, 3)
        _until(lambda: engine.popped == 3 and engine.committed == 3)
    finally:
        _stop(service, t)


def test_a_failed_destination_stops_counting_and_its_releases_hold_the_watermark():
    service, pub, engine, t = _run([[1], [2], [3], [4]], in_flight=2)
    try:
        _until(lambda: engine.popped == 2)
        pub.fail(OUT)  # rounds 1 and 2 will never be confirmed on this channel
        # The window no longer waits on them (they are held and sent again, a round of their
        # own), and the watermark does not pass them.
        _until(lambda: engine.popped == 4)
        time.sleep(0.1)
        assert engine.committed == 0
    finally:
        _stop(service, t)
