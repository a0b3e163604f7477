"""`DedupPublisher`: every output message leaves through here, exactly once per sequence id.

PIP-6 de-duplication done by the client, so it holds on a broker without de-duplication (the
embedded pulsar-lite) and agrees with the broker's own on a real cluster: each topic gets one
pulsar-client producer with the caller's stable producer name, every message carries an explicit
``sequence_id`` (what broker de-duplication keys on) and the properties ``__pl_producer__`` and
``__pl_seq__`` (Python cannot read a message's sequence id back, and recovery must).

Producer settings follow the Pulsar Python runtime's output producer (``setup_producer``):
``block_if_queue_full=True``, batching with a 10 ms delay, ``send_timeout_millis=0`` and LZ4.
All three are kept because they help correctness: a send timeout would fail messages during a
broker outage and leave holes; blocking instead of failing on a full queue does the same; and
batching is safe because only ids above the highest pushed are ever sent, so a batch never
straddles ids the broker has already stored (the client re-sends whole batches unchanged).

Each output topic is a `TopicChannel` (channel.py): its producer, sequence map, sends in flight and
their completion, and its snapshot. The publisher opens channels (recovering each topic's map),
checks messages, and flushes and closes them all.

Threads: `publish` may be called from several threads, but ids must be monotonic per topic, so
callers normally publish from one. pulsar-client runs send callbacks on its I/O thread; the
callbacks only update memory and call the caller's callback (keep that short). Snapshots are
written to the state store by the calling thread (on the next `publish`, `flush` or `close`), never
on the client's I/O thread.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import pulsar

from ..state.base import StateStore
from ..topics import normalize_topic, partition_name
from .channel import (
    SNAPSHOT_KEY_PREFIX,
    Outcome,
    OutMessage,
    PublishCallback,
    PublishError,
    PublishResult,
    TopicChannel,
    snapshot_key,
)
from .partition_router import DEFAULT_KEY_HASHING, RoutingHistory, key_hasher
from .recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY, RecoveryError, TailStats, position_of, read_tail
from .sequence_map import (
    DEFAULT_MAX_PRODUCERS,
    DEFAULT_SNAPSHOT_INTERVAL,
    MAX_SEQUENCE,
    NO_SEQUENCE,
    DedupSnapshot,
    SequenceMap,
    SnapshotFormatError,
    check_sequence_id,
)

log = logging.getLogger(__name__)

RESERVED_PROPERTIES = (PRODUCER_PROPERTY, SEQUENCE_PROPERTY)
_RESERVED = frozenset(RESERVED_PROPERTIES)
ROUTING_KEY_PREFIX = "dedup-routing"
# How often a partitioned topic's partition count is looked up again (Pulsar's clients: 60 s,
# autoUpdatePartitionsInterval).
PARTITION_REFRESH_S = 60.0


def routing_key(producer_name: str, topic: str) -> str:
    """The state-store key of one (producer, partitioned topic) routing history."""
    return f"{ROUTING_KEY_PREFIX}/{producer_name}@{topic}"


@dataclass
class _Route:
    """What the publisher knows of one topic's partitions (history empty: not partitioned)."""

    history: RoutingHistory
    next_check: float

    @property
    def partitioned(self) -> bool:
        return self.history.partitions > 0


def _check_id_and_payload(seq: object, payload: object) -> None:
    """A message's sequence id (> 0: pulsar-client ignores 0) and payload type, or an error naming them."""
    if type(seq) is not int or not 0 < seq <= MAX_SEQUENCE:  # exact types first: once per message
        check_sequence_id(seq, allow_zero=False)  # raises, naming the problem
    if type(payload) is not bytes and not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")


class DedupPublisher:
    """Publishes each (producer, sequence id) at most once per topic, across crashes.

    `producer_name` must be stable across restarts and unique among live publishers (e.g.
    "<tenant>/<ns>/<function>-<instance>-release"). Sequence ids must be > 0 and increase per
    topic; an id at or below the highest already pushed is dropped and reported as DUPLICATE.
    The first publish to a topic (or `open(topic)`) recovers the topic's sequence map from the
    state store's snapshot plus a replay of the topic after it.
    """

    def __init__(
        self,
        client: pulsar.Client,
        producer_name: str,
        state_store: StateStore,
        *,
        snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
        batching_max_publish_delay_ms: int = 10,
        compression_type: pulsar.CompressionType = pulsar.CompressionType.LZ4,
        max_pending_messages: int = 1000,
        producer_properties: Optional[Mapping[str, str]] = None,
        recovery_timeout_s: float = 120.0,
        recovery_max_messages: int = 10_000_000,
        key_hashing: str = DEFAULT_KEY_HASHING,
        partition_refresh_s: float = PARTITION_REFRESH_S,
    ) -> None:
        if not isinstance(producer_name, str) or not producer_name.strip():
            raise ValueError(f"producer_name must be a non-empty str, got {producer_name!r}")
        if not isinstance(state_store, StateStore):
            raise TypeError(f"state_store must implement StateStore (put/get bytes), got {type(state_store).__name__}")
        if recovery_timeout_s <= 0:
            raise ValueError(f"recovery_timeout_s must be > 0, got {recovery_timeout_s!r}")
        if recovery_max_messages < 1:
            raise ValueError(f"recovery_max_messages must be >= 1, got {recovery_max_messages!r}")
        self.client = client
        self.producer_name = producer_name
        self.state_store = state_store
        self.snapshot_interval = snapshot_interval
        self.max_producers = max_producers
        self.batching_max_publish_delay_ms = batching_max_publish_delay_ms
        self.compression_type = compression_type
        self.max_pending_messages = max_pending_messages
        self.producer_properties = dict(producer_properties or {})
        self.recovery_timeout_s = recovery_timeout_s
        self.recovery_max_messages = recovery_max_messages
        self.key_hashing = key_hashing
        self._key_hash = key_hasher(key_hashing)  # RoutingError (a ValueError) for an unknown name
        self.partition_refresh_s = partition_refresh_s
        self._routes: Dict[str, _Route] = {}
        # Validates the map settings now rather than at the first publish.
        SequenceMap("validation", snapshot_interval=snapshot_interval, max_producers=max_producers)
        self._channels: Dict[str, TopicChannel] = {}
        self._names: Dict[str, str] = {}  # topic as given -> normalized name
        self._lock = threading.Lock()
        self._open_locks: Dict[str, threading.Lock] = {}
        self._closed = False
        self._on_landed: Optional[Callable[[str, int, Any], None]] = None

    def track_landed(self, sink: Optional[Callable[[str, int, Any], None]]) -> None:
        """Report where each message lands: `sink(destination, sequence id, message id)` runs on
        pulsar-client's I/O thread for every message the broker confirms from now on, on every
        topic (open or opened later); keep it short. None turns it off. Costs one completion
        callback per message instead of one per `publish_many` run."""
        self._on_landed = sink
        for ch in list(self._channels.values()):
            ch.on_landed = sink

    # -- opening and recovery --------------------------------------------------------------

    def open(self, topic: str) -> int:
        """Recover `topic` (if not yet open) and create its producer; returns the highest persisted id.

        For a partitioned topic every partition is opened, and the highest id persisted on any of
        them is returned."""
        full = normalize_topic(topic)
        route = self._route(full)
        if not route.partitioned:
            return self._channel(full).seqmap.highest_persisted(self.producer_name)
        return max(self._channel(partition_name(full, p)).seqmap.highest_persisted(self.producer_name)
                   for p in range(route.history.partitions))

    # -- partitioned topics ----------------------------------------------------------------

    def _route(self, full: str) -> _Route:
        """How `full` is routed: looked up on first use, and again every partition_refresh_s while
        it is partitioned (a topic can gain partitions, never lose them or stop being partitioned)."""
        route = self._routes.get(full)
        now = time.monotonic()
        if route is not None and (not route.partitioned or now < route.next_check):
            return route
        with self._lock:
            lock = self._open_locks.setdefault(f"route:{full}", threading.Lock())
        with lock:
            route = self._routes.get(full)
            if route is not None and (not route.partitioned or now < route.next_check):
                return route
            names = [normalize_topic(p) for p in self.client.get_topic_partitions(full)]
            count = 0 if names == [full] else len(names)
            if route is None:
                history = RoutingHistory()
                if count:
                    raw = self.state_store.get(routing_key(self.producer_name, full))
                    if raw is not None:
                        history = RoutingHistory.from_bytes(raw)
                route = _Route(history, 0.0)
            if count > route.history.partitions:
                self._grow(full, route.history, count)
            route.next_check = now + self.partition_refresh_s
            self._routes[full] = route
            return route

    def _grow(self, full: str, history: RoutingHistory, count: int) -> None:
        """Route `full` over `count` partitions from the first id above everything sent to its
        current partitions (recovered from them), and store that before anything uses it: an id
        sent, or lost in a crash, under the old count is routed under the old count again."""
        from_seq = 0
        if history.partitions:
            pushed = [self._channel(partition_name(full, p)).seqmap.highest_pushed(self.producer_name)
                      for p in range(history.partitions)]
            from_seq = max(pushed) + 1
        old = history.partitions
        history.grow(count, from_seq)
        self.state_store.put(routing_key(self.producer_name, full), history.to_bytes())
        log.info("event=dedup_partitions_routed topic=%s producer=%s partitions=%d previous=%d from_seq=%d",
                 full, self.producer_name, count, old, from_seq)

    def partitions(self, topic: str) -> int:
        """The partition count `topic` is routed over now (0: not partitioned)."""
        return self._route(normalize_topic(topic)).history.partitions

    def destination(self, topic: str, sequence_id: int, partition_key: Optional[str] = None) -> str:
        """The topic a message with this id and key is published to: `topic` itself, or for a
        partitioned topic the partition its key (or, without a key, its id) routes it to."""
        full = self._full(topic)
        route = self._route(full)
        if not route.partitioned:
            return full
        return partition_name(full, route.history.route(partition_key, sequence_id, self._key_hash))

    def route(self, topic: str, messages: Sequence[OutMessage]) -> List[Tuple[str, List[OutMessage]]]:
        """`messages` grouped by the topic each is published to (a partition of a partitioned
        topic, else `topic`), groups in the order of their first message, messages in order.
        Callers that track a watermark per destination publish each group with `publish_many`."""
        full = self._full(topic)
        route = self._route(full)
        if not route.partitioned:
            return [(full, list(messages))]
        history, key_hash = route.history, self._key_hash
        groups: Dict[int, List[OutMessage]] = {}
        for m in messages:
            p = history.route(m.partition_key, m.sequence_id, key_hash)
            g = groups.get(p)
            if g is None:
                g = groups[p] = []
            g.append(m)
        return [(partition_name(full, p), g) for p, g in groups.items()]

    def _full(self, topic: str) -> str:
        full = self._names.get(topic)
        if full is None:
            full = normalize_topic(topic)
            self._names[topic] = full
        return full

    def _channel_for(self, topic: str, sequence_id: int, partition_key: Optional[str]) -> TopicChannel:
        """The channel a message goes to on `topic` as the caller spells it: the topic's own, or
        for a partitioned topic its routed partition's."""
        full = self._full(topic)
        route = self._routes.get(full)
        if route is None or route.partitioned:
            route = self._route(full)
            if route.partitioned:
                full = partition_name(full, route.history.route(partition_key, sequence_id, self._key_hash))
        return self._channel(full)

    def _channel(self, topic: str) -> TopicChannel:
        ch = self._channels.get(topic)
        if ch is not None:
            return ch
        with self._lock:
            if self._closed:
                raise PublishError(f"publisher {self.producer_name} is closed")
            open_lock = self._open_locks.setdefault(topic, threading.Lock())
        with open_lock:
            ch = self._channels.get(topic)
            if ch is None:
                ch = self._open_channel(topic)
                with self._lock:
                    self._channels[topic] = ch
        return ch

    def _open_channel(self, topic: str) -> TopicChannel:
        seqmap = SequenceMap(topic, snapshot_interval=self.snapshot_interval, max_producers=self.max_producers)
        key = snapshot_key(self.producer_name, topic)
        raw = self.state_store.get(key)
        snapshot: Optional[DedupSnapshot] = None
        if raw is not None:
            try:
                snapshot = DedupSnapshot.from_bytes(raw)
                seqmap.restore(snapshot)
            except (SnapshotFormatError, ValueError) as exc:
                # Replaying the whole topic gives the exact map too, only slower.
                log.warning("event=dedup_snapshot_unreadable topic=%s key=%s error=%s", topic, key, exc)
                snapshot = None
                seqmap = SequenceMap(topic, snapshot_interval=self.snapshot_interval, max_producers=self.max_producers)
        name = self.producer_name

        def on_message(msg: pulsar.Message) -> bool:
            props = msg.properties()
            if props.get(PRODUCER_PROPERTY) != name:
                return False
            raw_seq = props.get(SEQUENCE_PROPERTY)
            try:
                seq = check_sequence_id(int(raw_seq))
            except (TypeError, ValueError):
                log.warning(
                    "event=dedup_replay_bad_sequence topic=%s producer=%s position=%s value=%r",
                    topic, name, position_of(msg.message_id()), raw_seq,
                )
                return False
            seqmap.replay(name, seq, position_of(msg.message_id()))
            return True

        # The producer first, the replay after it. Apache Pulsar refuses a second producer of the same
        # name on a topic while the first one's connection lives (ProducerBusy), and removes a
        # closed one only after the broker stored what it had accepted. So once this producer
        # exists, every message an earlier copy of this publisher (a partition's stale owner, still
        # stopping) sent is already on the topic, and the replay below sees it: replayed first, a
        # copy that sent after the replay's end was measured would have its releases sent again.
        producer = self.client.create_producer(
            topic,
            producer_name=name,
            block_if_queue_full=True,
            batching_enabled=True,
            batching_max_publish_delay_ms=self.batching_max_publish_delay_ms,
            send_timeout_millis=0,
            compression_type=self.compression_type,
            max_pending_messages=self.max_pending_messages,
            properties=self.producer_properties or None,
        )
        try:
            stats = read_tail(
                self.client, topic, seqmap.position, on_message,
                timeout_s=self.recovery_timeout_s, max_messages=self.recovery_max_messages,
            )
            if stats.end is not None and stats.messages_read:
                seqmap.advance_position(stats.end)
            seqmap.producer_added(name)
            ch = TopicChannel(topic=topic, seqmap=seqmap, producer_name=name, state_store=self.state_store,
                              recovery=stats, on_landed=self._on_landed)
            if stats.messages_read:
                # Record the replay so the next recovery starts after it (Pulsar does this only past
                # brokerDeduplicationEntriesInterval entries; one put is cheaper than any re-read).
                ch.due_snapshot = seqmap.take_snapshot()
                ch.write_due_snapshot()
        except BaseException:
            try:
                producer.close()
            except pulsar.PulsarException as exc:  # the replay's error is the one to raise
                log.warning("event=dedup_channel_producer_close_failed topic=%s producer=%s error=%s", topic, name, exc)
            raise
        ch.producer = producer
        log.info(
            "event=dedup_channel_opened topic=%s producer=%s snapshot=%s snapshot_position=%s replayed=%d "
            "matched=%d highest=%d recovery_seconds=%.3f",
            topic, name, snapshot is not None, snapshot.position if snapshot else None,
            stats.messages_read, stats.matched, seqmap.highest_persisted(name), stats.seconds,
        )
        return ch

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        sequence_id: int,
        *,
        properties: Optional[Mapping[str, str]] = None,
        partition_key: Optional[str] = None,
        ordering_key: Optional[str] = None,
        event_timestamp: Optional[int] = None,
        callback: Optional[PublishCallback] = None,
    ) -> Outcome:
        """Send `payload` with `sequence_id` unless that id is already pushed; returns SENT or DUPLICATE.

        `callback(PublishResult)` runs once the fate is known: PERSISTED, DUPLICATE (for a dropped
        id, once everything up to it is persisted) or FAILED.
        """
        props = self._checked_message(payload, sequence_id, properties)
        if self._closed:
            raise PublishError(f"publisher {self.producer_name} is closed")
        ch = self._channel_for(topic, sequence_id, partition_key)
        if ch.due_snapshot is not None:  # unlocked peek; write_due_snapshot re-checks under the lock
            ch.write_due_snapshot()
        return ch.publish(payload, sequence_id, props, callback=callback, partition_key=partition_key,
                          ordering_key=ordering_key, event_timestamp=event_timestamp)

    def publish_many(self, topic: str, messages: Sequence[OutMessage], *,
                     properties_owned: bool = False) -> List[Outcome]:
        """Publish messages with increasing sequence ids to one topic; SENT or DUPLICATE each.

        The fast path for bursts: only the last message sent (and any over
        channel.TRACK_EACH_ABOVE_BYTES) gets a completion callback from pulsar-client, whose success
        also completes the earlier ones (a producer completes its sends in order); a Python
        callback per message costs more than the send itself. There are no per-message
        callbacks: read progress with `persisted_seq(topic)` and failures with `check()`.
        A send that raises fails the channel (the sends of its run have no known fate).

        `properties_owned=True` hands each message's properties dict over: the publisher writes
        its two properties into it (replacing any of those names) instead of copying it, and does
        not check its keys' and values' types. For dicts that are str -> str by construction,
        such as `Message.properties()` (the syncer's forwards: per message, the copy and the
        check cost as much as a third of the send).

        To a partitioned topic each message goes to the partition `route` gives it (its key's,
        or without a key its id's), de-duplicated there; outcomes are in the order given.
        """
        if self._closed:
            raise PublishError(f"publisher {self.producer_name} is closed")
        check = self._owned_message if properties_owned else self._checked_message
        full = self._full(topic)
        route = self._routes.get(full)
        if route is None or route.partitioned:
            route = self._route(full)
        if not route.partitioned:
            ch = self._channel(full)
            if ch.due_snapshot is not None:
                ch.write_due_snapshot()
            return ch.publish_many(messages, check)
        history, key_hash = route.history, self._key_hash
        groups: Dict[int, List[int]] = {}
        for i, m in enumerate(messages):
            groups.setdefault(history.route(m.partition_key, m.sequence_id, key_hash), []).append(i)
        outcomes: List[Outcome] = [Outcome.DUPLICATE] * len(messages)
        for p, idx in groups.items():
            ch = self._channel(partition_name(full, p))
            if ch.due_snapshot is not None:
                ch.write_due_snapshot()
            for i, o in zip(idx, ch.publish_many([messages[i] for i in idx], check)):
                outcomes[i] = o
        return outcomes

    def check(self) -> None:
        """Raise PublishError if a send on any topic failed (the channel then refuses publishes)."""
        for ch in list(self._channels.values()):
            if ch.failed is not None:
                raise ch.send_failed_error()

    def failed_topics(self) -> Dict[str, str]:
        """topic -> error, for the topics (plain or one partition) whose channel a failed send
        stopped; the others publish on. `reset(topic)` lets one be opened again."""
        return {t: str(ch.failed) for t, ch in list(self._channels.items()) if ch.failed is not None}

    def reset(self, topic: str) -> None:
        """Close `topic`'s channel (one failed by a send, say): the next publish to it opens it
        again and recovers its sequence map from the topic, so only the ids not stored there are
        sent again. `topic` is a plain topic or one partition."""
        full = normalize_topic(topic)
        with self._lock:
            ch = self._channels.pop(full, None)
        if ch is not None:
            log.info("event=dedup_channel_reset topic=%s producer=%s failed=%s", full, self.producer_name,
                     ch.failed is not None)
            ch.close()

    def _checked_message(self, payload: object, seq: int, properties: Optional[Mapping[str, str]]) -> Dict[str, str]:
        """Check one message's id, payload and properties; its properties with the dedup ones added."""
        _check_id_and_payload(seq, payload)
        props: Dict[str, str] = dict(properties) if properties else {}
        for k, v in props.items():
            if type(k) is not str or type(v) is not str:  # exact types first: the per-message fast path
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError(f"message properties must be str -> str, got {k!r}: {v!r}")
        if not _RESERVED.isdisjoint(props):
            k = next(k for k in RESERVED_PROPERTIES if k in props)
            raise ValueError(f"message property {k!r} is reserved for de-duplication")
        props[PRODUCER_PROPERTY] = self.producer_name
        props[SEQUENCE_PROPERTY] = str(seq)
        return props

    def _owned_message(self, payload: object, seq: int, properties: Optional[Mapping[str, str]]) -> Dict[str, str]:
        """`_checked_message` for a properties dict handed over (publish_many's `properties_owned`):
        the id and payload are checked, the dedup properties written into the dict itself."""
        if type(properties) is not dict:
            return self._checked_message(payload, seq, properties)  # not a dict to write into
        _check_id_and_payload(seq, payload)
        properties[PRODUCER_PROPERTY] = self.producer_name
        properties[SEQUENCE_PROPERTY] = str(seq)
        return properties

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, topic: str) -> DedupSnapshot:
        """Write the topic's persisted map to the state store now and return it."""
        return self._channel(normalize_topic(topic)).snapshot_now()

    # -- watermarks ------------------------------------------------------------------------

    def persisted_seq(self, topic: str) -> int:
        """Highest id such that it and every id pushed before it are on the topic (-1 if none).
        `topic` is a plain topic or one partition (`destination` names it), not a partitioned one.

        A caller that commits its own progress only up to this id never commits a message that a
        crash could lose.
        """
        ch = self._channels.get(normalize_topic(topic))
        if ch is None:
            return NO_SEQUENCE
        with ch.cond:
            return ch.seqmap.highest_persisted(self.producer_name)

    def pushed_seq(self, topic: str) -> int:
        """Highest id handed to the producer for `topic` (-1 if none)."""
        ch = self._channels.get(normalize_topic(topic))
        if ch is None:
            return NO_SEQUENCE
        with ch.cond:
            return ch.seqmap.highest_pushed(self.producer_name)

    def recovery_stats(self, topic: str) -> Optional[TailStats]:
        """What the recovery of `topic` replayed, or None if the topic is not open."""
        ch = self._channels.get(normalize_topic(topic))
        return ch.recovery if ch is not None else None

    def topics(self) -> List[str]:
        """Topics opened so far."""
        return sorted(self._channels)

    # -- flush and close -------------------------------------------------------------------

    def flush(self, timeout_s: Optional[float] = 30.0) -> None:
        """Wait until every send has completed and write any due snapshot.

        Raises TimeoutError after `timeout_s` (None waits forever) and PublishError if a send failed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for ch in list(self._channels.values()):
            ch.wait_idle(deadline, timeout_s)
            ch.write_due_snapshot()
            if ch.failed is not None:
                raise ch.send_failed_error()

    def wait_persisted(self, topic: str, sequence_id: int, timeout_s: Optional[float] = 30.0, *,
                       partition_key: Optional[str] = None) -> None:
        """Wait until `sequence_id` and every id pushed before it on `topic` are persisted there
        (a DUPLICATE id counts: it was persisted earlier), and write a due snapshot. Lets a caller
        confirm one burst while the next is already being sent (`flush` waits for all). On a
        partitioned topic: on the partition the id (and `partition_key`) routes to.

        Raises PublishError if a send failed, TimeoutError after `timeout_s` (None: never)."""
        ch = self._channel_for(topic, sequence_id, partition_key)
        ch.wait_persisted(sequence_id, None if timeout_s is None else time.monotonic() + timeout_s, timeout_s)
        if ch.due_snapshot is not None:
            ch.write_due_snapshot()

    def close(self, timeout_s: Optional[float] = 30.0) -> None:
        """Flush, write a final snapshot per topic and close the producers (not the client)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush(timeout_s)
        except (TimeoutError, PublishError) as exc:
            # The snapshot below is still exact: it stops at the last contiguous confirmed id.
            log.warning("event=dedup_close_flush_incomplete producer=%s error=%s", self.producer_name, exc)
        for ch in list(self._channels.values()):
            ch.close()

    def __enter__(self) -> "DedupPublisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "SNAPSHOT_KEY_PREFIX",
    "DedupPublisher",
    "OutMessage",
    "Outcome",
    "PublishCallback",
    "PublishError",
    "PublishResult",
    "RecoveryError",
    "snapshot_key",
]
