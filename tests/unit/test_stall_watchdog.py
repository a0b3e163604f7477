"""StallWatchdog's decisions (pulsar_lifecycle.pulsar_io.stall_watchdog), on a stand-in consumer: it
re-subscribes only an idle consumer whose topic holds messages beyond the last one received,
doubles the queue each time, backs off, and stops guessing blind after BLIND_RESUBSCRIBES."""
from __future__ import annotations

from typing import List, Optional, Tuple

import pulsar
import pytest

from pulsar_lifecycle.pulsar_io import stall_watchdog as sw


class _Id:
    def __init__(self, ledger: int, entry: int) -> None:
        self._pos = (ledger, entry)

    def ledger_id(self) -> int:
        return self._pos[0]

    def entry_id(self) -> int:
        return self._pos[1]


class _Consumer:
    """The two calls the watchdog makes on a consumer."""

    def __init__(self, end: Optional[Tuple[int, int]]) -> None:
        self.end = end
        self.closed = False

    def get_last_message_id(self) -> _Id:
        if self.end is None:
            raise pulsar.PulsarException("empty topic")  # what pulsar-lite answers
        return _Id(*self.end)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: now[0])
    return now


def test_resubscribes_only_when_the_topic_holds_more_than_was_received(clock):
    opened: List[int] = []
    handed_back: List[bool] = []
    dog = sw.StallWatchdog("t", lambda q: opened.append(q) or _Consumer((1, 9)), 1000, lambda: handed_back.append(True))
    dog.seen(1, 9)
    dog.seen(1, 3)  # a redelivered older message does not move the mark back
    dog.flowing()
    drained = _Consumer((1, 9))
    assert dog.check(drained) is None and not opened  # the last message is one we received
    clock[0] += sw.STALL_CHECK_MAX_S
    stalled = _Consumer((1, 12))
    new = dog.check(stalled)
    assert new is not None and stalled.closed and opened == [2000] and handed_back == [True]
    dog.flowing()
    assert dog.check(_Consumer((1, 20))) is not None and opened == [2000, 4000]  # doubled again
    assert dog.resubscribed == 2


def test_backs_off_between_checks_and_ignores_an_empty_topic(clock):
    opened: List[int] = []
    dog = sw.StallWatchdog("t", lambda q: opened.append(q) or _Consumer(None), 200)
    dog.seen(1, 1)
    dog.flowing()
    assert dog.check(_Consumer(None)) is None  # empty topic: nothing to do
    assert dog.check(_Consumer((1, 5))) is None and not opened  # too soon after the last check
    clock[0] += 2 * sw.STALL_CHECK_S
    assert dog.check(_Consumer((1, 5))) is not None and opened == [400]


def test_blind_resubscriptions_are_bounded(clock):
    opened: List[int] = []
    dog = sw.StallWatchdog("t", lambda q: opened.append(q) or _Consumer((1, 5)), 10_000)
    assert dog.check(_Consumer((1, 5))) is None  # the first blind check waits BLIND_WAIT_S
    for _ in range(sw.BLIND_RESUBSCRIBES + 2):
        clock[0] += sw.STALL_CHECK_MAX_S
        dog.check(_Consumer((1, 5)))
    assert len(opened) == sw.BLIND_RESUBSCRIBES and set(opened) == {sw.MAX_RESUBSCRIBE_QUEUE}


class _AskCounting(_Consumer):
    def __init__(self, end: Optional[Tuple[int, int]]) -> None:
        super().__init__(end)
        self.asked = 0

    def get_last_message_id(self) -> _Id:
        self.asked += 1
        return super().get_last_message_id()


def test_a_topic_never_seen_holding_a_message_is_not_asked_its_end(clock):
    # pulsar-lite answers an empty topic's last-message-id request with an error the client logs
    holds = [False]
    looks: List[bool] = []

    def holds_messages() -> bool:
        looks.append(holds[0])
        return holds[0]
    opened: List[int] = []
    dog = sw.StallWatchdog("t", lambda q: opened.append(q) or _Consumer((1, 5)), 200, holds_messages=holds_messages)
    empty = _AskCounting(None)
    clock[0] += sw.BLIND_WAIT_S
    assert dog.check(empty) is None and empty.asked == 0 and looks == [False]
    # a restarted consumer: what a dead predecessor holds is on the topic, found by the look
    holds[0] = True
    clock[0] += sw.STALL_CHECK_MAX_S
    held = _AskCounting((1, 5))
    assert dog.check(held) is not None and held.asked == 1 and opened == [400]
    # once a message was received, the end is asked without a look
    dog.seen(1, 5)
    dog.flowing()
    more = _AskCounting((1, 9))
    assert dog.check(more) is not None and more.asked == 1 and looks == [False, True]
