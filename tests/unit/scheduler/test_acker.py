"""BackgroundAcker: acks handed-over batches in order, drains on close, surfaces a failed ack."""
from __future__ import annotations

import threading
from typing import Any, List

import pytest

from pulsar_lifecycle.scheduler.acker import BackgroundAcker


class RecordingConsumer:
    """Records acknowledge() calls; optionally waits for `gate` first or fails on one message."""

    def __init__(self, gate: "threading.Event | None" = None, fail_on: Any = None) -> None:
        self.acked: List[Any] = []
        self.gate = gate
        self.fail_on = fail_on

    def acknowledge(self, m: Any) -> None:
        if self.gate is not None:
            assert self.gate.wait(5), "test gate never opened"
        if m == self.fail_on:
            raise RuntimeError("AlreadyClosed")
        self.acked.append(m)


def test_batches_are_acked_in_order_and_drain_waits_for_them():
    gate = threading.Event()
    consumer = RecordingConsumer(gate)
    acker = BackgroundAcker(max_queued=8)
    acker.submit(consumer, [1, 2, 3])
    acker.submit(consumer, [4, 5])
    assert not acker.idle and not acker.drain(timeout_s=0.05)  # held by the gate
    gate.set()
    assert acker.drain(timeout_s=5) and acker.idle
    assert consumer.acked == [1, 2, 3, 4, 5]
    acker.close()


def test_close_acks_everything_submitted_before_it_returns():
    gate = threading.Event()
    consumer = RecordingConsumer(gate)
    acker = BackgroundAcker(max_queued=2)
    acker.submit(consumer, list(range(10)))
    threading.Timer(0.05, gate.set).start()
    acker.close(timeout_s=5)
    assert consumer.acked == list(range(10))
    with pytest.raises(RuntimeError, match="closed"):
        acker.submit(consumer, [99])


def test_a_failed_ack_is_raised_to_the_intake_thread_and_later_batches_are_not_acked():
    consumer = RecordingConsumer(fail_on=2)
    acker = BackgroundAcker()
    acker.submit(consumer, [1, 2, 3])
    assert acker.drain(timeout_s=5)
    with pytest.raises(RuntimeError, match="AlreadyClosed"):
        acker.raise_if_failed()
    with pytest.raises(RuntimeError, match="acknowledging durable scheduling messages failed"):
        acker.submit(consumer, [4])
    assert consumer.acked == [1]
    acker.close()
