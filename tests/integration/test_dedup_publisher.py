"""DedupPublisher against the real embedded broker (pulsar-lite has no de-duplication of its own)."""
from __future__ import annotations

import os
import threading
import time
import types
from collections import Counter
from pathlib import Path
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.dedup import (
    PRODUCER_PROPERTY,
    SEQUENCE_PROPERTY,
    DedupPublisher,
    DedupSnapshot,
    Outcome,
    OutMessage,
    PublishError,
    PublishResult,
    SequenceError,
    snapshot_key,
)
from pulsar_lifecycle.state.directory import DirectoryStateStore

pytestmark = pytest.mark.integration

NAME = "public/default/dedup-test-0-release"


def make_client(url: str) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def make_store(tmp_path: Path) -> DirectoryStateStore:
    return DirectoryStateStore(tmp_path / "state", "public", "default", "dedup")


def count_topic(url: str, topic: str, expected: int, *, quiet_s: float = 1.5, limit_s: float = 60.0) -> Counter:
    """Count (producer, seq) on `topic` with a fresh Shared subscription, bounded in time.

    After `expected` messages it keeps listening for `quiet_s` so that extra copies are seen.
    """
    client = make_client(url)
    counts: Counter = Counter()
    try:
        consumer = client.subscribe(
            topic, f"count-{time.monotonic_ns()}", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000,
        )
        deadline = time.monotonic() + limit_s
        total = 0
        while time.monotonic() < deadline:
            wait_ms = int(quiet_s * 1000) if total >= expected else 1000
            try:
                msg = consumer.receive(wait_ms)
            except pulsar.Timeout:
                if total >= expected:
                    break
                continue
            props = msg.properties()
            counts[(props.get(PRODUCER_PROPERTY), int(props[SEQUENCE_PROPERTY]))] += 1
            total += 1
            consumer.acknowledge(msg)
        consumer.unsubscribe()
    finally:
        client.close()
    return counts


def test_duplicates_are_dropped_and_callbacks_report(broker, unique, tmp_path):
    topic = f"persistent://public/default/dd-{unique}"
    client = make_client(broker.service_url)
    results: List[PublishResult] = []
    lock = threading.Lock()

    def cb(r: PublishResult) -> None:
        with lock:
            results.append(r)

    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        assert pub.open(topic) == -1
        for seq in range(1, 101):
            assert pub.publish(topic, f"m{seq}".encode(), seq, callback=cb) is Outcome.SENT
        # Re-sends while the originals may still be in flight, and after.
        for seq in range(50, 101):
            assert pub.publish(topic, b"again", seq, callback=cb) is Outcome.DUPLICATE
        pub.flush(30)
        for seq in (1, 100):
            assert pub.publish(topic, b"again", seq, callback=cb) is Outcome.DUPLICATE
        assert pub.persisted_seq(topic) == 100 == pub.pushed_seq(topic)
        pub.close()
        with pytest.raises(PublishError, match="closed"):
            pub.publish(topic, b"late", 101)
        assert pub.persisted_seq(topic) == 100
    finally:
        client.close()
    by_outcome = Counter(r.outcome for r in results)
    assert by_outcome == {Outcome.PERSISTED: 100, Outcome.DUPLICATE: 53}
    assert all(r.ok for r in results)
    assert all(r.position is not None for r in results if r.outcome is Outcome.PERSISTED)
    counts = count_topic(broker.service_url, topic, 100)
    assert counts == Counter({(NAME, s): 1 for s in range(1, 101)})


def test_ids_with_holes_and_bad_input(broker, unique, tmp_path):
    topic = f"persistent://public/default/dd-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        ids = [(ledger << 28) | entry for ledger in (3, 4) for entry in (0, 1, 7)]  # Pulsar functions' scheme
        for seq in ids:
            assert pub.publish(topic, b"x", seq) is Outcome.SENT
        assert pub.publish(topic, b"x", (3 << 28) | 5) is Outcome.DUPLICATE  # a hole below the highest
        with pytest.raises(SequenceError, match="out of range"):
            pub.publish(topic, b"x", 0)  # pulsar-client would silently drop 0
        with pytest.raises(ValueError, match="reserved"):
            pub.publish(topic, b"x", ids[-1] + 1, properties={PRODUCER_PROPERTY: "evil"})
        with pytest.raises(TypeError, match="str -> str"):
            pub.publish(topic, b"x", ids[-1] + 1, properties={"k": 1})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match="payload must be bytes"):
            pub.publish(topic, "text", ids[-1] + 1)  # type: ignore[arg-type]
        # The rejected calls did not consume the id.
        assert pub.publish(topic, b"x", ids[-1] + 1, properties={"k": "v"}) is Outcome.SENT
        pub.close()
        assert pub.persisted_seq(topic) == ids[-1] + 1
    finally:
        client.close()
    with pytest.raises(ValueError, match="producer_name"):
        DedupPublisher(client, " ", make_store(tmp_path))


def test_restart_recovers_from_snapshot_plus_tail(broker, unique, tmp_path):
    """Publish 2500, crash without the final snapshot, recover, re-publish all: each once."""
    topic = f"persistent://public/default/dd-{unique}"
    store = make_store(tmp_path)
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, store)
        for seq in range(1, 2501):
            pub.publish(topic, f"m{seq}".encode(), seq)
        pub.flush(60)
        assert pub.persisted_seq(topic) == 2500
        # "Crash": no close(), so the last snapshot is the one taken at 2000 persisted entries.
    finally:
        client.close()
    raw = store.get(snapshot_key(NAME, topic))
    assert raw is not None
    snap = DedupSnapshot.from_bytes(raw)
    assert snap.producers[NAME] == 2000 and snap.entries == 2000 and snap.position is not None

    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, store)
        assert pub.open(topic) == 2500
        stats = pub.recovery_stats(topic)
        assert stats is not None and stats.start == snap.position
        # Only the tail after the snapshot's entry was replayed, not the whole topic.
        assert 500 <= stats.matched < 2000
        outcomes = Counter(pub.publish(topic, f"m{seq}".encode(), seq) for seq in range(1, 2501))
        assert outcomes == {Outcome.DUPLICATE: 2500}
        for seq in range(2501, 3001):
            assert pub.publish(topic, f"m{seq}".encode(), seq) is Outcome.SENT
        pub.close()
    finally:
        client.close()
    final = DedupSnapshot.from_bytes(store.get(snapshot_key(NAME, topic)) or b"")
    assert final.producers[NAME] == 3000
    counts = count_topic(broker.service_url, topic, 3000)
    assert counts == Counter({(NAME, s): 1 for s in range(1, 3001)})


def test_recovery_without_any_snapshot_reads_whole_topic_and_ignores_other_producers(broker, unique, tmp_path):
    topic = f"persistent://public/default/dd-{unique}"
    other = "public/default/other-0-release"
    client = make_client(broker.service_url)
    try:
        mine = DedupPublisher(client, NAME, make_store(tmp_path / "a"), snapshot_interval=10_000)
        theirs = DedupPublisher(client, other, make_store(tmp_path / "b"))
        for seq in range(1, 301):
            mine.publish(topic, b"m", seq)
            theirs.publish(topic, b"o", seq * 10)
        mine.flush(30)
        theirs.close()
        # Crash of "mine" with its state lost entirely: recovery must read from the earliest entry.
    finally:
        client.close()
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path / "fresh"))
        assert pub.open(topic) == 300
        stats = pub.recovery_stats(topic)
        assert stats is not None and stats.start is None and stats.matched == 300
        assert stats.messages_read >= 600
        assert pub.publish(topic, b"m", 300) is Outcome.DUPLICATE
        assert pub.publish(topic, b"m", 301) is Outcome.SENT
        pub.close()
    finally:
        client.close()
    counts = count_topic(broker.service_url, topic, 601)
    assert sum(counts.values()) == 601 and max(counts.values()) == 1
    assert sum(1 for (p, _s) in counts if p == NAME) == 301


def test_short_topic_names_are_the_same_channel(broker, unique, tmp_path):
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        assert pub.publish(f"dd-{unique}", b"x", 1) is Outcome.SENT
        assert pub.publish(f"public/default/dd-{unique}", b"x", 1) is Outcome.DUPLICATE
        assert pub.topics() == [f"persistent://public/default/dd-{unique}"]
        with pytest.raises(ValueError, match="invalid topic name"):
            pub.publish("a/b", b"x", 2)
        pub.close()
    finally:
        client.close()


def test_broker_duplicate_receipt_counts_as_success(broker, unique, tmp_path):
    """A real cluster with broker de-duplication answers a re-sent id with message id -1:-1.

    pulsar-lite never does, so the receipt is fed to the completion path directly, with a real
    pulsar-client MessageId, to check it is treated as success and keeps the snapshot position.
    """
    from pulsar_lifecycle.dedup.channel import PendingSend

    topic = f"persistent://public/default/dd-{unique}"
    client = make_client(broker.service_url)
    results: List[PublishResult] = []
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        pub.publish(topic, b"x", 1)
        pub.flush(10)
        ch = pub._channels[topic]
        pending = PendingSend(2, results.append)
        with ch.cond:
            ch.seqmap.mark_pushed(NAME, 2)
            ch.pending.append(pending)
            ch.outstanding += 1
        ch.on_send_complete(pending, pulsar.Result.Ok, pulsar.MessageId(-1, -1, -1, -1)._msg_id)
        assert results == [PublishResult(topic, 2, Outcome.DUPLICATE, None)]
        assert pub.persisted_seq(topic) == 2
        snap = pub.snapshot(topic)
        assert snap.producers[NAME] == 2 and snap.position is not None and snap.position.ledger_id >= 0
        pub.close()
    finally:
        client.close()


def test_failed_send_stops_the_channel_and_the_watermark(broker, unique, tmp_path):
    """A message the broker cannot take (too big) fails; nothing after it is sent or committed."""
    topic = f"persistent://public/default/dd-{unique}"
    client = make_client(broker.service_url)
    results: List[PublishResult] = []
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        for seq in (1, 2):
            pub.publish(topic, b"small", seq, callback=results.append)
        pub.flush(10)
        pub.publish(topic, os.urandom(6 * 1024 * 1024), 3, callback=results.append)  # > 5 MiB even after LZ4
        with pytest.raises(PublishError, match="sequence id 3"):
            pub.flush(10)
        with pytest.raises(PublishError, match="channel failed at sequence id 3"):
            pub.publish(topic, b"small", 4)
        assert pub.persisted_seq(topic) == 2
        pub.close()
    finally:
        client.close()
    assert [(r.sequence_id, r.outcome) for r in results] == [
        (1, Outcome.PERSISTED), (2, Outcome.PERSISTED), (3, Outcome.FAILED)
    ]
    assert results[-1].error and not results[-1].ok
    assert count_topic(broker.service_url, topic, 2) == Counter({(NAME, 1): 1, (NAME, 2): 1})


class _FailingPutStore(DirectoryStateStore):
    """A real directory store whose writes fail, as a table service outage would."""

    def put(self, key: str, value: bytes) -> None:
        raise OSError("state store unavailable")


def test_store_outage_and_corrupt_snapshot_fall_back_to_full_replay(broker, unique, tmp_path):
    topic = f"persistent://public/default/dd-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, _FailingPutStore(tmp_path / "state", "public", "default", "dedup"),
                             snapshot_interval=10)
        for seq in range(1, 51):
            assert pub.publish(topic, b"x", seq) is Outcome.SENT  # snapshot failures do not stop publishing
        pub.close()
    finally:
        client.close()
    store = make_store(tmp_path / "other")
    store.put(snapshot_key(NAME, topic), b"{not json")
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, store)
        assert pub.open(topic) == 50
        stats = pub.recovery_stats(topic)
        assert stats is not None and stats.start is None and stats.matched == 50
        assert pub.publish(topic, b"x", 50) is Outcome.DUPLICATE
        pub.close()
    finally:
        client.close()
    assert DedupSnapshot.from_bytes(store.get(snapshot_key(NAME, topic)) or b"").producers[NAME] == 50


# -- publish_many: one completion callback per burst ----------------------------------------------

def test_publish_many_persists_a_burst_and_drops_duplicates(broker, unique, tmp_path):
    """Only the burst's last send has a callback; its success completes the ones before it."""
    topic = f"persistent://public/default/dm-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        first = [OutMessage(f"m{s}".encode(), s, {"k": str(s)}, f"key{s}", 1_000 + s) for s in range(1, 501)]
        assert pub.publish_many(topic, first) == [Outcome.SENT] * 500
        deadline = time.monotonic() + 20
        while pub.persisted_seq(topic) < 500 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pub.persisted_seq(topic) == 500
        # A re-run of the same burst plus new ids: only the new ones leave.
        again = first[-10:] + [OutMessage(f"m{s}".encode(), s) for s in range(501, 511)]
        outcomes = pub.publish_many(topic, again)
        assert outcomes == [Outcome.DUPLICATE] * 10 + [Outcome.SENT] * 10
        pub.flush(10)
        pub.check()
        assert pub.persisted_seq(topic) == 510
        pub.close()
    finally:
        client.close()
    counts = count_topic(broker.service_url, topic, 510)
    assert counts == Counter({(NAME, s): 1 for s in range(1, 511)})


def test_publish_many_with_owned_properties_writes_the_dedup_ones_into_the_callers_dicts(broker, unique, tmp_path):
    """properties_owned: no copy; the dedup properties are written into each dict (replacing a
    stale pair a forwarded message carried), and the messages recover like any others."""
    topic = f"persistent://public/default/dmo-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        dicts = [{"k": str(s), PRODUCER_PROPERTY: "someone-else", SEQUENCE_PROPERTY: "7"} for s in range(1, 101)]
        burst = [OutMessage(f"m{s}".encode(), s, d) for s, d in zip(range(1, 101), dicts)]
        assert pub.publish_many(topic, burst, properties_owned=True) == [Outcome.SENT] * 100
        assert dicts[41] == {"k": "42", PRODUCER_PROPERTY: NAME, SEQUENCE_PROPERTY: "42"}  # the caller's own dict
        # A mapping that is not a dict cannot be written into: it is checked and copied as usual.
        frozen = OutMessage(b"m101", 101, types.MappingProxyType({"k": "101"}))
        assert pub.publish_many(topic, [frozen], properties_owned=True) == [Outcome.SENT]
        with pytest.raises(SequenceError):
            pub.publish_many(topic, [OutMessage(b"zero", 0, {})], properties_owned=True)  # ids are still checked
        pub.close()
        again = DedupPublisher(client, NAME, make_store(tmp_path))
        assert again.open(topic) == 101
        again.close()
    finally:
        client.close()
    counts = count_topic(broker.service_url, topic, 101)
    assert counts == Counter({(NAME, s): 1 for s in range(1, 102)})


def test_wait_persisted_confirms_one_burst_while_the_next_is_in_flight(broker, unique, tmp_path):
    """The syncer's pipeline: wait for burst 1's last id only; a failed send raises instead."""
    topic = f"persistent://public/default/dw-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        pub.publish_many(topic, [OutMessage(b"a", s) for s in range(1, 201)])
        pub.publish_many(topic, [OutMessage(b"b", s) for s in range(201, 401)])
        pub.wait_persisted(topic, 200, timeout_s=10)
        assert pub.persisted_seq(topic) >= 200
        pub.wait_persisted(topic, 150, timeout_s=1)  # already passed: returns at once
        pub.publish_many(topic, [OutMessage(os.urandom(6 * 1024 * 1024), 401)])  # > 5 MiB: refused
        with pytest.raises(PublishError, match="sequence id 401"):
            pub.wait_persisted(topic, 401, timeout_s=10)
        assert pub.persisted_seq(topic) == 400
        pub.close()
    finally:
        client.close()


def test_publish_many_recovers_after_restart(broker, unique, tmp_path):
    """Ids published in bursts are found by the tail replay of a new publisher (no snapshot)."""
    topic = f"persistent://public/default/dmr-{unique}"
    crashed = make_client(broker.service_url)
    pub = DedupPublisher(crashed, NAME, make_store(tmp_path), snapshot_interval=10_000)
    pub.publish_many(topic, [OutMessage(b"x", s) for s in range(1, 301)])
    pub.flush(10)
    # No pub.close(): as after a crash, the snapshot store knows nothing. Its connection goes,
    # as a dead process's does (real Pulsar refuses a second producer of the same name meanwhile).
    crashed.close()
    client = make_client(broker.service_url)
    try:
        pub2 = DedupPublisher(client, NAME, make_store(tmp_path / "other"))
        assert pub2.open(topic) == 300
        assert pub2.publish_many(topic, [OutMessage(b"x", s) for s in range(299, 303)]) == [
            Outcome.DUPLICATE, Outcome.DUPLICATE, Outcome.SENT, Outcome.SENT]
        pub2.flush(10)
    finally:
        client.close()
    assert count_topic(broker.service_url, topic, 302) == Counter({(NAME, s): 1 for s in range(1, 303)})


def test_publish_many_oversized_message_fails_the_channel(broker, unique, tmp_path):
    """pulsar-client fails a too-big message (and the batch holding it) by itself while later
    sends could succeed: such a message closes the group and gets its own callback, so the
    failure is seen, the channel refuses further sends and the watermark never claims an id
    that is not on the topic."""
    topic = f"persistent://public/default/dmf-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        burst = [OutMessage(b"a", 1), OutMessage(b"b", 2), OutMessage(os.urandom(6 * 1024 * 1024), 3),
                 OutMessage(b"d", 4), OutMessage(b"e", 5)]
        try:
            pub.publish_many(topic, burst)  # the failure may already surface here
        except PublishError as exc:
            assert "sequence id" in str(exc)
        with pytest.raises(PublishError, match="failed"):
            pub.flush(10)
        with pytest.raises(PublishError, match="failed"):
            pub.check()
        with pytest.raises(PublishError, match="channel failed at sequence id"):
            pub.publish_many(topic, [OutMessage(b"f", 6)])
        persisted = pub.persisted_seq(topic)
        pub.close()
    finally:
        client.close()
    assert persisted <= 2
    counts = count_topic(broker.service_url, topic, max(persisted, 0))
    assert all(counts[(NAME, s)] == 1 for s in range(1, persisted + 1))
    assert not any(seq >= 3 for _, seq in counts), f"sent after the failure: {sorted(counts)}"


def test_publish_many_bad_message_ends_the_burst_but_not_the_channel(broker, unique, tmp_path):
    """A message with bad properties raises; the ones before it are still sent and confirmed,
    and the channel keeps working (only a failed send fails it)."""
    topic = f"persistent://public/default/dmb-{unique}"
    client = make_client(broker.service_url)
    try:
        pub = DedupPublisher(client, NAME, make_store(tmp_path))
        burst = [OutMessage(b"a", 1), OutMessage(b"b", 2), OutMessage(b"c", 3, {"k": 5}), OutMessage(b"d", 4)]
        with pytest.raises(TypeError, match="properties must be str"):
            pub.publish_many(topic, burst)
        pub.flush(10)
        pub.check()
        assert pub.persisted_seq(topic) == 2
        assert pub.publish_many(topic, [OutMessage(b"c", 3), OutMessage(b"d", 4)]) == [Outcome.SENT] * 2
        pub.flush(10)
        assert pub.persisted_seq(topic) == 4
        pub.close()
    finally:
        client.close()
    assert count_topic(broker.service_url, topic, 4) == Counter({(NAME, s): 1 for s in range(1, 5)})


@pytest.mark.pulsar_only("pulsar-lite accepts a second producer of the same name (Apache Pulsar: ProducerBusy)")
def test_a_successor_opens_only_after_its_predecessor_and_sees_everything_it_sent(broker, unique, tmp_path):
    """A partition's stale owner still sending while its successor opens the same target under the
    same producer name (a rebalance's overlap): the successor's open is refused while the
    predecessor's producer lives, and once it opens, its map holds everything the predecessor
    stored, so re-sending the predecessor's ids stores none of them again."""
    topic = f"persistent://public/default/dd-{unique}"
    old_client, new_client = make_client(broker.service_url), make_client(broker.service_url)
    refused = 0
    sent_until = [0]
    stop = threading.Event()
    try:
        old = DedupPublisher(old_client, NAME, make_store(tmp_path), batching_max_publish_delay_ms=1)
        old.open(topic)

        def keep_sending() -> None:  # the predecessor releasing until it is closed under its feet
            seq = 0
            while not stop.is_set() and seq < 200_000:
                burst = [OutMessage(f"m{s}".encode(), s) for s in range(seq + 1, seq + 51)]
                try:
                    old.publish_many(topic, burst)
                except PublishError:
                    return
                seq += 50
                sent_until[0] = seq
                time.sleep(0.002)

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        new = DedupPublisher(new_client, NAME, make_store(tmp_path))
        deadline = time.monotonic() + 60
        opened = False
        while time.monotonic() < deadline and not opened:
            if refused == 3:
                threading.Timer(0.05, old.close, kwargs={"timeout_s": 10}).start()  # closed mid-open
            try:
                new.open(topic)
                opened = True
            except pulsar.ProducerBusy:
                refused += 1
        stop.set()
        sender.join(timeout=30)
        assert opened, f"the successor never opened ({refused} refusals)"
        assert refused >= 3, "the predecessor's live producer did not keep its successor out"
        stored = new.persisted_seq(topic)
        assert stored > 0
        # Everything the predecessor handed over again, as a recovered index releases it.
        outcomes = Counter(new.publish(topic, f"m{s}".encode(), s) for s in range(1, sent_until[0] + 1))
        new.flush(60)
        new.close()
    finally:
        stop.set()
        old_client.close()
        new_client.close()
    counts = count_topic(broker.service_url, topic, sent_until[0])
    twice = sorted(k for k, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} ids stored twice, first {twice[:5]} (successor knew {stored})"
    assert sum(outcomes.values()) == sent_until[0]
