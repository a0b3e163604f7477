"""SchedulerService's answers to cancels (without a broker): what it publishes, with which
sequence id, on which topic, and what it does when the reply topic cannot be opened."""
from __future__ import annotations

import logging
from typing import Any, List, Tuple

import pytest

from pulsar_lifecycle.bucket.records import CancelResult
from pulsar_lifecycle.scheduler.config import WriterConfig
from pulsar_lifecycle.scheduler.intake import Cancel
from pulsar_lifecycle.scheduler.service import SchedulerService, cancel_outcome, reply_sequence
from pulsar_lifecycle.scheduling_protocol import CANCEL_KEPT_PROP, CANCEL_OUTCOME_PROP, cancel_reply_topic

SCHED = "persistent://public/default/sched"
REPLY = cancel_reply_topic(SCHED)


class _Publisher:
    def __init__(self, open_fails: bool = False) -> None:
        self.open_fails = open_fails
        self.sent: List[Tuple[str, List[Any]]] = []
        self.waited: List[Tuple[str, int]] = []

    def open(self, topic: str) -> int:
        if self.open_fails:
            raise ValueError(f"topic {topic} is partitioned (2 partitions)")
        return -1

    def publish_many(self, topic: str, messages: List[Any], **kwargs: Any) -> None:
        self.open(topic)  # as DedupPublisher: the first publish opens the topic's channel
        self.sent.append((topic, list(messages)))

    def wait_persisted(self, topic: str, seq: int) -> None:
        self.waited.append((topic, seq))


class _Engine:
    def __init__(self, result: CancelResult, seen: bool) -> None:
        self.result, self.seen = result, seen

    def cancel(self, ledger_id: int, entry_id: int) -> CancelResult:
        return self.result

    def was_added(self, ledger_id: int, entry_id: int) -> bool:
        return self.seen


def _service(pub: _Publisher, engine: _Engine) -> SchedulerService:
    return SchedulerService(engine, pub, WriterConfig(), "persistent://public/default/out", SCHED + "-INVALID", None,
                            lambda n, v: None, reply_topic=REPLY)


def test_an_answer_is_published_with_the_cancel_position_as_sequence_id_and_waited_for():
    pub = _Publisher()
    service = _service(pub, _Engine(CancelResult.CANCELLED_BEFORE_ADD, seen=False))
    replies: list = []
    service._cancel(Cancel(12, 5, "12:5", (30, 7, -1, -1), REPLY), replies)
    service._cancel(Cancel(12, 6, "12:6", (30, 8, -1, -1), "persistent://public/default/elsewhere"), replies)
    service._answer(replies)
    ((topic, messages),) = pub.sent
    assert topic == REPLY and len(messages) == 1  # the one naming another topic is applied, not answered
    assert messages[0].sequence_id == reply_sequence((30, 7, -1, -1)) and pub.waited == [(REPLY, messages[0].sequence_id)]
    assert messages[0].properties[CANCEL_OUTCOME_PROP] == "not_known_yet"
    assert messages[0].properties[CANCEL_KEPT_PROP] == "86400"
    assert reply_sequence((30, 8, -1, -1)) > reply_sequence((30, 7, -1, 5)) > reply_sequence((30, 7, -1, -1))


def test_a_reply_topic_that_cannot_be_opened_leaves_the_cancel_applied_and_unanswered(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING)
    pub = _Publisher(open_fails=True)
    service = _service(pub, _Engine(CancelResult.CANCELLED, seen=True))
    replies: list = []
    service._cancel(Cancel(12, 5, "12:5", (30, 7, -1, -1), REPLY), replies)
    service._answer(replies)  # no exception: the batch is acked
    assert pub.sent == [] and "event=cancel_reply_failed" in caplog.text


@pytest.mark.parametrize("result, seen, outcome", [
    (CancelResult.CANCELLED, True, "cancelled"),
    (CancelResult.CANCELLED_BEFORE_ADD, False, "not_known_yet"),
    (CancelResult.ALREADY_RELEASED, True, "already_released"),
    (CancelResult.ALREADY_CANCELLED, True, "cancelled"),  # asked again: as the first answer
    (CancelResult.ALREADY_CANCELLED, False, "not_known_yet"),
])
def test_a_repeated_cancel_answers_as_the_first(result: CancelResult, seen: bool, outcome: str):
    assert cancel_outcome(result, seen) == outcome
