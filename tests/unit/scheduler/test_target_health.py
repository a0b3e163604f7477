"""The held-target engine (scheduler/target_health.py): backoff, the time limit, order per target."""
from __future__ import annotations

from pulsar_lifecycle.scheduler.target_health import DEAD_LETTER, RETRY, WAIT, TargetHealth, backoff_ms


def test_backoff_doubles_from_half_a_second_to_ten_seconds():
    assert [backoff_ms(n) for n in range(1, 8)] == [500, 1000, 2000, 4000, 8000, 10_000, 10_000]
    assert backoff_ms(100) == 10_000


def test_a_failing_target_is_retried_after_its_backoff_and_dead_lettered_after_the_limit():
    h = TargetHealth(60_000)
    h.hold("t", [(1,), (2,)])
    assert h.next_action("t", 0) == RETRY  # never failed: waiting for its first open
    t = 1_000
    h.failed("t", "refused", t)
    assert h.next_action("t", t + 499) == WAIT and h.next_action("t", t + 500) == RETRY
    times = []
    now = t
    while h.next_action("t", now) != DEAD_LETTER:
        now = h.held("t").next_try_ms
        if h.next_action("t", now) == RETRY:
            h.attempt("t")
            assert h.next_action("t", now) == WAIT  # an attempt under way
            h.failed("t", "refused", now)
            times.append(now - t)
    # 0.5, 1.5, 3.5, 7.5, 15.5, 25.5, 35.5, 45.5, 55.5 s, then dead-lettered at the limit, 60 s.
    assert times == [500, 1500, 3500, 7500, 15_500, 25_500, 35_500, 45_500, 55_500]
    assert now - t == 60_000
    assert [i[0] for i in h.take("t")] == [1, 2] and h.held("t") is None and not h


def test_new_releases_queue_behind_held_ones_and_failed_sends_merge_in_order():
    h = TargetHealth(60_000)
    h.hold("a", [(5,), (6,)])
    h.failed("a", "send failed", 0)
    h.hold("a", [(9,)])
    h.requeue("a", [(3,), (7,)])  # sent before, not stored: they go first, in id order
    h.hold("b", [(4,)])
    assert [i[0] for i in h.held("a").items] == [3, 5, 6, 7, 9]
    assert h.held_count() == 6
    assert [s["target"] for s in h.status()] == ["a", "b"]
    assert h.status()[0]["reason"] == "send failed" and h.status()[1]["reason"] == "opening"


def test_a_recovered_target_keeps_its_hold_time_until_the_resent_releases_are_confirmed():
    h = TargetHealth(10_000)
    h.hold("t", [(1,), (2,)])
    h.failed("t", "refused", 0)
    h.failed("t", "refused", 600)
    assert [i[0] for i in h.release("t")] == [1, 2]
    # The re-sent ones fail again: the same hold goes on (first failure at 0, 2 attempts so far).
    h.requeue("t", [(1,), (2,)])
    held = h.failed("t", "send failed", 2_000)
    assert (held.since_ms, held.attempts) == (0, 3)
    assert h.next_action("t", 10_000) == DEAD_LETTER
    # Confirmed past the last re-sent release: a later failure starts a new hold.
    h.release("t")
    h.confirmed(2)
    h.hold("t", [(3,)])
    assert h.failed("t", "x", 20_000).since_ms == 20_000


def test_a_zero_limit_dead_letters_at_the_first_failure():
    h = TargetHealth(0)
    h.hold("t", [(1,)])
    h.failed("t", "refused", 5)
    assert h.next_action("t", 5) == WAIT and h.next_action("t", 505) == DEAD_LETTER
    assert h.next_due_ms() == 505
