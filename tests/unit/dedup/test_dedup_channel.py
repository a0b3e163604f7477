"""TopicChannel's completion bookkeeping, tested directly (no broker): the sends (runs) are registered as
publish_many registers them and completed with real pulsar-client message ids and results."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.dedup.channel import (
    TRACK_EACH_ABOVE_BYTES,
    Outcome,
    OutMessage,
    PendingSend,
    PublishError,
    PublishResult,
    TopicChannel,
    _runs,
)
from pulsar_lifecycle.dedup.sequence_map import SequenceMap
from pulsar_lifecycle.state.directory import DirectoryStateStore

NAME = "public/default/channel-test-0-release"
TOPIC = "persistent://public/default/channel-test"


def channel(tmp_path: Path, snapshot_interval: int = 1000) -> TopicChannel:
    seqmap = SequenceMap(TOPIC, snapshot_interval=snapshot_interval)
    seqmap.producer_added(NAME)
    store = DirectoryStateStore(tmp_path / "state", "public", "default", "dedup")
    return TopicChannel(topic=TOPIC, seqmap=seqmap, producer_name=NAME, state_store=store)


def push(ch: TopicChannel, seqs: List[int], callback=None) -> PendingSend:
    """Register a run of sends (`seqs`, completed by the last one's callback) the way
    publish/publish_many do before handing them to the producer."""
    with ch.cond:
        for seq in seqs:
            ch.seqmap.mark_pushed(NAME, seq)
        p = PendingSend(seqs[-1], callback, count=len(seqs))
        ch.pending.append(p)
        ch.outstanding += len(seqs)
    return p


def msg_id(entry: int) -> object:
    return pulsar.MessageId(-1, 7, entry, -1)._msg_id


def test_a_run_completes_with_its_last_send(tmp_path):
    ch = channel(tmp_path, snapshot_interval=3)
    results: List[PublishResult] = []
    run = push(ch, [1, 2, 3], callback=results.append)
    assert ch.outstanding == 3
    ch.complete(run, pulsar.Result.Ok, msg_id(5))
    assert (ch.outstanding, len(ch.pending)) == (0, 0)
    assert ch.seqmap.highest_persisted(NAME) == 3
    assert results == [PublishResult(TOPIC, 3, Outcome.PERSISTED, run.position)]
    assert run.position.ledger_id == 7 and run.position.entry_id == 5
    assert ch.due_snapshot is not None  # 3 entries at an interval of 3: a run counts its sends
    assert ch.due_snapshot.entries == 3
    ch.write_due_snapshot()
    assert ch.due_snapshot is None and ch.written_entries == 3


def test_runs_completed_out_of_order_move_the_watermark_only_over_the_prefix(tmp_path):
    ch = channel(tmp_path)
    first, second = push(ch, [1, 2]), push(ch, [3, 4, 5])
    ch.complete(second, pulsar.Result.Ok, msg_id(9))
    assert ch.seqmap.highest_persisted(NAME) == -1 and ch.outstanding == 2  # the first run is not confirmed
    ch.complete(first, pulsar.Result.Ok, msg_id(8))
    assert ch.seqmap.highest_persisted(NAME) == 5 and ch.outstanding == 0 and not ch.pending


def test_a_failed_run_fails_the_channel_and_stops_the_watermark(tmp_path):
    ch = channel(tmp_path)
    results: List[PublishResult] = []
    first = push(ch, [1])
    ch.complete(first, pulsar.Result.Ok, msg_id(0))
    run = push(ch, [2, 3], callback=results.append)
    with ch.cond:  # a duplicate of an id in flight waits for it
        ch.waiters.append((3, 0, results.append))
    ch.complete(run, pulsar.Result.Timeout, None)
    assert run.stranded and not run.done
    assert ch.failed is not None and ch.failed_seq == 3 and ch.outstanding == 0
    assert ch.seqmap.highest_persisted(NAME) == 1  # the watermark stops before the failure
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.FAILED]
    with pytest.raises(PublishError, match="channel failed at sequence id 3"):
        raise ch.failed_error()
    ch.strand(run, "again")  # already out of flight: counted once
    assert ch.outstanding == 0


def test_strand_takes_a_run_out_of_flight_once(tmp_path):
    ch = channel(tmp_path)
    run = push(ch, [1, 2])
    ch.strand(run, "send raised: boom")
    assert run.stranded and ch.outstanding == 0
    ch.strand(run, "send raised: again")
    assert ch.outstanding == 0
    assert ch.failed == "send raised: boom" and ch.failed_seq == 2
    assert "send of sequence id 2 failed: send raised: boom" in str(ch.send_failed_error())


def test_a_burst_is_one_run_except_for_oversized_messages():
    small, big = b"x", b"y" * (TRACK_EACH_ABOVE_BYTES + 1)
    burst = [(OutMessage(p, i + 1), {}) for i, p in enumerate([small, small, big, small, big, big])]
    assert [[m.sequence_id for m, _ in run] for run in _runs(burst)] == [[1, 2], [3], [4], [5], [6]]
    assert [[m.sequence_id for m, _ in run] for run in _runs(burst[:2])] == [[1, 2]]
    assert _runs([]) == []


def test_wait_idle_times_out_while_sends_are_in_flight(tmp_path):
    ch = channel(tmp_path)
    push(ch, [1])
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="1 sends still in flight"):
        ch.wait_idle(time.monotonic() + 0.2, 0.2)
    assert time.monotonic() - t0 < 5
