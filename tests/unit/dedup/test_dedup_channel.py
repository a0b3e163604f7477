"""TopicChannel's completion bookkeeping, tested directly (no broker): the sends are registered as
publish_many registers them and completed with real pulsar-client message ids and results."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.dedup.channel import Outcome, PendingSend, PublishError, PublishResult, TopicChannel
from pulsar_lifecycle.dedup.sequence_map import SequenceMap
from pulsar_lifecycle.state.directory import DirectoryStateStore

NAME = "public/default/channel-test-0-release"
TOPIC = "persistent://public/default/channel-test"


def channel(tmp_path: Path, snapshot_interval: int = 1000) -> TopicChannel:
    seqmap = SequenceMap(TOPIC, snapshot_interval=snapshot_interval)
    seqmap.producer_added(NAME)
    store = DirectoryStateStore(tmp_path / "state", "public", "default", "dedup")
    return TopicChannel(topic=TOPIC, seqmap=seqmap, producer_name=NAME, state_store=store)


def push(ch: TopicChannel, seq: int, tracked: bool, callback=None) -> PendingSend:
    """Register a send the way publish/publish_many do before handing it to the producer."""
    with ch.cond:
        ch.seqmap.mark_pushed(NAME, seq)
        p = PendingSend(seq, callback, tracked=tracked)
        ch.pending.append(p)
        ch.outstanding += 1
        ch.untracked += 0 if tracked else 1
    return p


def msg_id(entry: int) -> object:
    return pulsar.MessageId(-1, 7, entry, -1)._msg_id


def test_untracked_sends_complete_with_the_next_tracked_one(tmp_path):
    ch = channel(tmp_path, snapshot_interval=3)
    results: List[PublishResult] = []
    for seq in (1, 2):
        push(ch, seq, tracked=False)
    last = push(ch, 3, tracked=True, callback=results.append)
    assert (ch.outstanding, ch.untracked) == (3, 2)
    ch.complete(last, pulsar.Result.Ok, msg_id(5))
    assert (ch.outstanding, ch.untracked, len(ch.pending)) == (0, 0, 0)
    assert ch.seqmap.highest_persisted(NAME) == 3
    assert results == [PublishResult(TOPIC, 3, Outcome.PERSISTED, last.position)]
    assert last.position.ledger_id == 7 and last.position.entry_id == 5
    assert ch.due_snapshot is not None  # 3 entries at an interval of 3
    ch.write_due_snapshot()
    assert ch.due_snapshot is None and ch.written_entries == 3


def test_a_failed_tracked_send_strands_the_group_and_fails_the_channel(tmp_path):
    ch = channel(tmp_path)
    results: List[PublishResult] = []
    first = push(ch, 1, tracked=True)
    ch.complete(first, pulsar.Result.Ok, msg_id(0))
    untracked = push(ch, 2, tracked=False)
    last = push(ch, 3, tracked=True, callback=results.append)
    with ch.cond:  # a duplicate of an id in flight waits for it
        ch.waiters.append((3, 0, results.append))
    ch.complete(last, pulsar.Result.Timeout, None)
    assert untracked.stranded and not untracked.done
    assert ch.failed is not None and ch.failed_seq == 3 and ch.outstanding == 0
    assert ch.seqmap.highest_persisted(NAME) == 1  # the watermark stops before the failure
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.FAILED]
    with pytest.raises(PublishError, match="channel failed at sequence id 3"):
        raise ch.failed_error()


def test_strand_takes_untracked_sends_out_of_flight(tmp_path):
    ch = channel(tmp_path)
    a = push(ch, 1, tracked=False)
    b = push(ch, 2, tracked=False)
    ch.track(b)
    assert b.tracked and ch.untracked == 1
    ch.strand(b, "send raised: boom")
    assert a.stranded and b.stranded and ch.outstanding == 0 and ch.untracked == 0
    assert ch.failed == "send raised: boom" and ch.failed_seq == 2
    assert "send of sequence id 2 failed: send raised: boom" in str(ch.send_failed_error())


def test_wait_idle_times_out_while_sends_are_in_flight(tmp_path):
    ch = channel(tmp_path)
    push(ch, 1, tracked=True)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="1 sends still in flight"):
        ch.wait_idle(time.monotonic() + 0.2, 0.2)
    assert time.monotonic() - t0 < 5
