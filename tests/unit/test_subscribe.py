"""subscribe_promptly: another attempt beside one that does not answer, late ones closed (the
attempts are plain callables; skip_consumer_ids is tested on real brokers in
tests/integration/test_broker_quirks.py)."""
from __future__ import annotations

import threading
import time
from typing import Any, List

import pulsar
import pytest

from pulsar_lifecycle.pulsar_io.subscribe import subscribe_promptly


class FakeConsumer:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Attempts:
    """subscribe() calls in turn: attempt i blocks until `release[i]` is set (if given), then
    returns a FakeConsumer or raises."""

    def __init__(self, outcomes: List[Any], hold: "dict[int, threading.Event] | None" = None) -> None:
        self.outcomes = outcomes
        self.hold = hold or {}
        self.made: List[FakeConsumer] = []
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> FakeConsumer:
        with self._lock:
            i = self.calls
            self.calls += 1
        gate = self.hold.get(i)
        if gate is not None:
            assert gate.wait(10), "test gate never opened"
        outcome = self.outcomes[i]
        if isinstance(outcome, BaseException):
            raise outcome
        c = FakeConsumer(i)
        with self._lock:
            self.made.append(c)
        return c


def test_an_unanswered_subscribe_gets_a_second_attempt_and_a_late_success_is_closed():
    gate = threading.Event()
    attempts = Attempts([None, None], hold={0: gate})
    t0 = time.monotonic()
    winner = subscribe_promptly(attempts, what="t", answer_s=0.1)
    assert winner.n == 1 and attempts.calls == 2 and time.monotonic() - t0 < 5
    gate.set()  # the first attempt answers after all
    deadline = time.monotonic() + 5
    while not (len(attempts.made) == 2 and attempts.made[-1].closed) and time.monotonic() < deadline:
        time.sleep(0.01)
    late = [c for c in attempts.made if c.n == 0]
    assert late and late[0].closed and not winner.closed


def test_a_prompt_answer_makes_no_second_attempt():
    attempts = Attempts([None])
    assert subscribe_promptly(attempts, what="t", answer_s=5).n == 0 and attempts.calls == 1


def test_a_failed_attempt_is_retried_and_every_failure_raises_the_last_error():
    attempts = Attempts([pulsar.Timeout(), None])
    assert subscribe_promptly(attempts, what="t", answer_s=5).n == 1
    failing = Attempts([pulsar.ConnectError()] * 3)
    with pytest.raises(pulsar.ConnectError):
        subscribe_promptly(failing, what="t", answer_s=5, max_attempts=3)
    assert failing.calls == 3


def test_a_slow_answer_logs_info_and_a_refusal_or_a_long_wait_warns(caplog, monkeypatch):
    import logging

    from pulsar_lifecycle.pulsar_io import subscribe as subscribe_mod

    def levels() -> List[str]:
        return [r.levelname for r in caplog.records
                if "event=subscribe_retry" in r.getMessage() or "event=subscribe_answered" in r.getMessage()]

    caplog.set_level(logging.INFO, logger=subscribe_mod.__name__)
    gate = threading.Event()
    subscribe_promptly(Attempts([None, None], hold={0: gate}), what="slow", answer_s=0.05)
    gate.set()
    assert levels() == ["INFO", "INFO"]  # the retry, the answer: a slow broker is not a fault

    caplog.clear()
    subscribe_promptly(Attempts([pulsar.ConsumerBusy(), None]), what="refused", answer_s=5)
    assert levels() == ["WARNING", "WARNING"]

    caplog.clear()
    monkeypatch.setattr(subscribe_mod, "SLOW_WARN_S", 0.0)  # every wait counts as long
    gate = threading.Event()
    subscribe_promptly(Attempts([None, None], hold={0: gate}), what="long", answer_s=0.05)
    gate.set()
    assert levels() == ["INFO", "WARNING"]
