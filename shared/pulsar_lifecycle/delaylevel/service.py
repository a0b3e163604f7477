"""`DelayLevelSyncerService`: every partition's forwarder, the cancel intake, back-pressure,
the partition-count guard (grow / shrink) and metrics. Built by `wiring.build_syncer`."""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pulsar

from ..clock import Clock, wall_clock_ms
from ..dedup.publisher import DedupPublisher
from ..dedup.recovery import last_position
from ..pulsar_io.producers import ProducerPool
from ..pulsar_io.readers import HoldsMessages, close_quietly, has_more, reader_at
from ..pulsar_io.subscribe import subscribe_promptly
from ..scheduler.partition_assignment import assign_partitions
from ..scheduling_protocol import CANCEL_PROP, MessageRef, ProtocolError, parse_cancel_target
from ..state.base import StateStore
from ..topics import normalize_topic, partition_name
from .admin import AdminView, retention_problems, split_topic
from .config import SyncerConfig
from .errors import ConfigError, ParkedMessageError, PartitionRefusedError, ShrinkRefusedError
from .follow import find_forward
from .forwarder import ForwardPolicy, PartitionForwarder, position_of
from .landed import LandedForwards
from .order import Pos
from .permissions import SyncerTargetCheck
from .rule import CANCEL_PARTITION_PROP, cancel_topic, partition_topic, sequence_id
from .slots import ForwardSlots
from .trail import Checkpoint, ForwardTrail, TrailFormatError

log = logging.getLogger(__name__)

__all__ = ["BacklogGate", "DelayLevelSyncerService", "PARTITIONS_KEY", "check_partition_count"]

PARTITIONS_KEY = "delay-level/partitions"
TRAIL_KEY = "delay-level/forward-trail"
STARTS_KEY = "delay-level/starts"  # /<instance>: how often it started (rotates the subscribe order)
CANCELS = -1  # the cancel consumer's key beside the partition numbers
FORWARD_DONE_WAIT_S = 30.0  # a cancel of a claimed forward waits this long for its publish to finish
SHRINK_PROBE_MS = 1000  # how long a partition is probed for a parked message (shrink guard, discovery)
OPEN_PARALLELISM = 16  # publishers recovered at once at start
DISCOVERY_WINDOW = 16  # partitions probed at once beyond the last one read
PROBE_TIMEOUT_MS = 500  # a forwarder's gap probe waits this long for the message after its frontier (then a new Reader)
GAP_READ_MAX = 20_000  # messages per gap read (the rest is read at the next one)
PROBE_MAX_READS = 10_000  # at most a batch (max batch index 4095 per sequence_id) before that message


@dataclass
class BacklogGate:
    """Back-pressure: blocks forwarders while the writer's subscription backlog is above `limit`."""

    admin: Optional[AdminView]
    topic: str
    subscription: str
    limit: int
    interval_ms: int
    backlog: int = -1  # last value read (-1 = unknown / not checked)
    paused_ms: int = 0  # total time forwarders waited

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._checked = 0.0

    @property
    def enabled(self) -> bool:
        """True when the writer's lag can be read (admin API, subscription) and a limit is set."""
        return self.admin is not None and bool(self.subscription) and self.limit > 0

    def _read(self) -> int:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self.interval_ms / 1000.0:
                self._checked = now
                try:
                    got = self.admin.subscription_backlog(self.topic, self.subscription) if self.admin else None
                except Exception as exc:  # an unreachable admin API must not stop forwarding
                    log.warning("event=delay_level_backlog_unreadable topic=%s error=%r", self.topic, exc)
                    got = None
                self.backlog = -1 if got is None else got
            return self.backlog

    def wait_for_room(self, stop: threading.Event) -> None:
        """Return when the writer's backlog is at most the limit (or unknown), or on stop."""
        if not self.enabled:
            return
        started = time.monotonic()
        logged = False
        while not stop.is_set() and self._read() > self.limit:
            if not logged:
                log.warning("event=delay_level_backpressure topic=%s subscription=%s backlog=%d limit=%d",
                            self.topic, self.subscription, self.backlog, self.limit)
                logged = True
            stop.wait(self.interval_ms / 1000.0)
        with self._lock:
            self.paused_ms += int((time.monotonic() - started) * 1000)


def check_partition_count(state: StateStore, partitions: int, has_backlog: Callable[[int], bool]) -> int:
    """Grow freely, shrink only if every removed partition is empty; returns the previous count.

    The count is remembered in the state store, so a restart with a smaller strategy is caught
    even though the producers' partitions outlive any configuration."""
    raw = state.get(PARTITIONS_KEY)
    previous = int(raw.decode()) if raw else 0
    if previous > partitions:
        for k in range(partitions, previous):
            if has_backlog(k):
                raise ShrinkRefusedError(
                    f"refusing to shrink the delay-level topic from {previous} to {partitions} partitions: "
                    f"partition {k} still holds parked messages (restore the strategy, or wait until they are forwarded)")
    if previous != partitions:
        state.put(PARTITIONS_KEY, str(partitions).encode())
        log.info("event=delay_level_partitions_changed previous=%d partitions=%d", previous, partitions)
    return previous


class DelayLevelSyncerService:
    """Runs one forwarder per partition plus the cancel intake; `healthy` turns False on a failure."""

    def __init__(self, cfg: SyncerConfig, client: pulsar.Client, *, subscription: str, producer_prefix: str,
                 state: StateStore, record_metric: Callable[[str, float], None],
                 admin: Optional[AdminView] = None, instance: int = 0, clock: Clock = wall_clock_ms,
                 num_instances: Optional[int] = None, target_check: Optional[SyncerTargetCheck] = None) -> None:
        self.cfg = cfg
        self.target_check = target_check  # targetPermissionCheck (None: off); closed with the service
        self.client = client
        self.subscription = subscription
        self.producer_prefix = producer_prefix
        self.state = state
        self.record_metric = record_metric
        self.admin = admin
        self.clock = clock
        self.strategy = cfg.strategy
        self.instance = instance
        # The function's instance count: wiring reads it from the Context; userConfig `instances`
        # only for a service built without one.
        self.num_instances = cfg.instances if num_instances is None else num_instances
        # Instance i forwards the partitions `assign_partitions` gives it (k % n == i): one
        # consumer per partition keeps a partition's sequence ids increasing (two consumers would
        # interleave and lose dedup). Discovered partitions follow the same rule (`_owns`).
        try:
            self.owned = list(assign_partitions(self.strategy.partitions, instance, self.num_instances))
        except ValueError as exc:
            raise ConfigError(f"syncer instance {instance} of {self.num_instances}: {exc}") from exc
        self.stop_event = threading.Event()
        self.forwarders: List[PartitionForwarder] = []
        self._publishers: List[DedupPublisher] = []
        self._cancel_consumer: Optional[pulsar.Consumer] = None
        self._threads: List[threading.Thread] = []
        self.failure: Optional[BaseException] = None
        self.gate = BacklogGate(admin, cfg.scheduling_topic, cfg.scheduling_subscription, cfg.max_near_term_backlog,
                                cfg.backlog_check_interval_millis)
        self.retention_problems: List[str] = []
        self._stopped = False
        self.partitions = self.strategy.partitions  # partitions read: the strategy's, grown by discovery
        self._policy: Optional[ForwardPolicy] = None
        self._grow_lock = threading.Lock()  # forwarders are added by discovery while others read the lists
        self._discover_lock = threading.Lock()  # discovery runs from its loop and from a cancel
        # Where forwards can be found for cancels that come after them (scheduler backend only):
        # kept two units + lookahead (a forward waits in the index at most one unit + lookahead).
        self.trail = ForwardTrail(retention_ms=2 * self.strategy.unit_ms + 2 * cfg.lookahead_millis)
        self._tombstones: Optional[ProducerPool] = None  # the writer's cancels, per destination
        self.cancels_followed = 0  # late cancels sent on to the writer as tombstones
        self.cancels_followed_read = 0  # of them, found by reading the topic (not in the landed record)
        self._near_partitions = 0  # the near-term topic's partition count (0: not partitioned)
        self.landed: Dict[int, LandedForwards] = {}  # partition -> where its recent forwards landed
        self.on_failure: Optional[Callable[[], None]] = None  # called once when a thread fails

    # -- start -----------------------------------------------------------------------------

    def _subscribe(self, topic: str, queue: int, subscription: Optional[str] = None) -> pulsar.Consumer:
        # Shared: the one subscription type pulsar-lite gets right; Earliest: messages parked
        # before the syncer first ran are forwarded too.
        # batch_receive (a forwarder's due followers) returns what is queued, waiting at most 1 ms.
        return self.client.subscribe(topic, subscription or self.subscription, consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=queue,
                                     batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(
                                         max(1, min(queue, self.cfg.forward_batch_size)), 16 << 20, 1))

    def _subscribe_partition(self, k: int, queue: int) -> pulsar.Consumer:
        """Partition k's consumer, subscribed through `subscribe_promptly` (a consumer id a dead
        predecessor still holds on pulsar-lite costs a second attempt after 2 s, not the client's
        operation timeout: the rotated order and localrun's random id offset make that rare, not
        impossible). A partition the broker refuses is a PartitionRefusedError that says what to
        do: Apache Pulsar refuses a partition beyond a partitioned topic's partition count
        (NotAllowedError), so the strategy asks for more partitions than the topic has."""
        topic = partition_topic(self.cfg.delay_level_topic, k)

        def attempt() -> "pulsar.Consumer | pulsar.NotAllowedError":
            try:
                return self._subscribe(topic, queue)
            except pulsar.NotAllowedError as refused:  # an answer, not a reason to try again
                return refused
        got = subscribe_promptly(attempt, topic)
        if isinstance(got, pulsar.NotAllowedError):
            exc = got
            dl, n = self.cfg.delay_level_topic, self.strategy.partitions
            raise PartitionRefusedError(
                f"the broker refuses partition {k} of the delay-level topic {dl} ({exc}): a partitioned topic with "
                f"fewer partitions than the strategy's {n}; grow it (pulsar-admin topics update-partitioned-topic "
                f"{dl} -p {n}) or lower messageMaximumDelayTimeSeconds") from exc
        return got

    def _open_probe(self, k: int) -> Optional[pulsar.Consumer]:
        """A probe of partition k: a consumer on this subscription with a queue of one. None when
        the broker refuses the partition (Apache Pulsar, beyond a partitioned topic's partition
        count, NotAllowedError): it does not exist, so it holds nothing."""
        try:
            return self._subscribe(partition_topic(self.cfg.delay_level_topic, k), 1)
        except pulsar.NotAllowedError:
            log.debug("event=delay_level_partition_refused topic=%s partition=%d", self.cfg.delay_level_topic, k)
            return None

    @staticmethod
    def _holds_message(probe: pulsar.Consumer) -> bool:
        """Whether a probe receives a parked message; closed unacked either way (the message goes
        back to the next consumer)."""
        try:
            probe.receive(timeout_millis=SHRINK_PROBE_MS)
            return True
        except pulsar.Timeout:
            return False
        finally:
            probe.close()

    def _has_backlog(self, k: int) -> bool:
        probe = self._open_probe(k)
        return probe is not None and self._holds_message(probe)

    def start(self) -> "DelayLevelSyncerService":
        """Check the partition count and policies, open everything, start the threads."""
        cfg = self.cfg
        n = self.strategy.partitions
        check_partition_count(self.state, n, self._has_backlog)
        if self.admin is not None:
            self._check_retention()
        self._policy = ForwardPolicy(
            unit_ms=self.strategy.unit_ms, lookahead_ms=cfg.lookahead_millis, batch_size=cfg.forward_batch_size,
            near_term_topic=cfg.scheduling_topic if cfg.near_term_backend == "scheduler" else None,
            dead_letter_topic=f"{cfg.delay_level_topic}-DLQ",
            target_exists=self._target_exists if (self.admin is not None and cfg.on_missing_target == "dead-letter") else None,
            wait_for_room=self.gate.wait_for_room, clock=self.clock, receiver_queue_size=cfg.receiver_queue_size,
            pipeline_depth=cfg.forward_pipeline_depth, slots=ForwardSlots(cfg.forward_concurrency),
            retry_s=float(cfg.forward_retry_seconds),
            target_refusal=self.target_check.refusal if self.target_check is not None else None)
        try:
            if self._policy.near_term_topic is not None:
                near = self._policy.near_term_topic
                names = [normalize_topic(p) for p in self.client.get_topic_partitions(near)]
                self._near_partitions = 0 if names == [near] else len(names)
            # Recover every partition's dedup map before the first forward; in parallel, since
            # each recovery probes the topic's end (about 0.5 s on an idle topic).
            with ThreadPoolExecutor(max_workers=OPEN_PARALLELISM) as pool:
                publishers = list(pool.map(self._open_publisher, self.owned))
            consumers = self._subscribe_rotated()
            for k, publisher in zip(self.owned, publishers):
                self._add_forwarder(k, publisher, consumers[k])
            self._cancel_consumer = consumers[CANCELS]
            if self._policy.near_term_topic is not None:
                self._load_trail()
                self._take_checkpoint()  # before the first forward: every later one is after it
                # Cancels go to the partition (or topic) that holds the forward: the writer
                # instance that indexed it. Batching on, as DelayedProducer's.
                self._tombstones = ProducerPool(self.client, batching_enabled=True, batching_max_publish_delay_ms=5,
                                                block_if_queue_full=True)
        except BaseException:
            self.stop()
            raise
        for fw in self.forwarders:
            fw.start()
        loops = [("delay-level-cancels", self._cancel_loop), ("delay-level-monitor", self._metrics_loop)]
        if cfg.partition_discovery_seconds > 0:
            loops.append(("delay-level-discovery", self._discovery_loop))
        for name, target in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("event=delay_level_syncer_started topic=%s partitions=%d owned=%d instance=%d strategy=%r backend=%s",
                 cfg.delay_level_topic, n, len(self.owned), self.instance, str(self.strategy), cfg.near_term_backend)
        return self

    def _open_publisher(self, k: int) -> DedupPublisher:
        """Partition k's forward publisher (stable name `<prefix>-p<k>`), recovered on the near-term topic."""
        publisher = DedupPublisher(self.client, f"{self.producer_prefix}-p{k}", self.state,
                                   snapshot_interval=self.cfg.dedup_snapshot_interval,
                                   max_pending_messages=max(1000, 2 * self.cfg.forward_batch_size),
                                   key_hashing=self.cfg.key_hashing)
        with self._grow_lock:
            self._publishers.append(publisher)  # closed by stop() even if the open below fails
        assert self._policy is not None
        near = self._policy.near_term_topic
        if near is not None:
            if self.cfg.forward_positions_kept > 0:
                prefix = f"{near}-partition-"
                record = LandedForwards(self.cfg.forward_positions_kept, self.trail.retention_ms / 1000.0,
                                        lambda dest: dest == near or dest.startswith(prefix))
                self.landed[k] = record
                publisher.track_landed(record.add)
            publisher.open(near)
        return publisher

    def _subscribe_rotated(self) -> Dict[int, pulsar.Consumer]:
        """The partition consumers and the cancel consumer (key CANCELS), subscribed one after
        the other in an order rotated by one at every start.

        Why (pulsar-lite only): it keys a subscription's consumers by the consumer id the client
        picks (a per-client counter), and after a SIGKILL that resets the connection it keeps the
        dead process's consumers for a long time; a new consumer with the same id on the same
        subscription is refused ("Consumer N already exists") and the client retries until its
        operation timeout, so a restarted syncer that subscribed in the same order as its
        predecessor hung in start() (docs/delay-levels.md, "Lateness after a crash"). Rotating the
        order gives each subscription another id than at the last starts; real Pulsar scopes
        consumer ids per connection and needs none of this."""
        starts_key = f"{STARTS_KEY}/{self.instance}"
        raw = self.state.get(starts_key)
        starts = int(raw.decode()) + 1 if raw else 1
        self.state.put(starts_key, str(starts).encode())
        cfg = self.cfg
        # Every instance reads every cancel (its own subscription) and applies those of its partitions.
        cancel_sub = self.subscription if self.num_instances == 1 else f"{self.subscription}-{self.instance}"
        keys = list(self.owned) + [CANCELS]
        shift = starts % len(keys)
        consumers: Dict[int, pulsar.Consumer] = {}
        try:
            for key in keys[shift:] + keys[:shift]:
                if key == CANCELS:
                    consumers[key] = subscribe_promptly(
                        lambda: self._subscribe(cancel_topic(cfg.delay_level_topic), 1000, cancel_sub),
                        cancel_topic(cfg.delay_level_topic))
                else:
                    consumers[key] = self._subscribe_partition(key, cfg.receiver_queue_size)
        except BaseException:
            for c in consumers.values():
                c.close()
            raise
        return consumers

    def _add_forwarder(self, k: int, publisher: DedupPublisher,
                       consumer: Optional[pulsar.Consumer] = None) -> PartitionForwarder:
        assert self._policy is not None
        topic = partition_topic(self.cfg.delay_level_topic, k)
        if consumer is None:
            consumer = self._subscribe_partition(k, self.cfg.receiver_queue_size)
        forwarder = PartitionForwarder(k, topic, consumer, publisher, self._policy, self.stop_event,
                                       resubscribe=lambda queue: self._resubscribe(topic, queue),
                                       probe=lambda after: self._first_after(topic, after),
                                       read_gap=lambda after, until: self._read_between(topic, after, until),
                                       read_tail=lambda after, limit: self._read_to_end(topic, after, limit),
                                       holds_messages=HoldsMessages(self.client, topic))
        with self._grow_lock:
            self.forwarders.append(forwarder)  # stop() closes its consumer
        return forwarder

    def _resubscribe(self, topic: str, queue: int) -> pulsar.Consumer:
        """A new consumer of a partition for its stall watchdog. Through `subscribe_promptly`:
        on pulsar-lite a dead predecessor that re-subscribed the same partition may still hold
        the consumer id this one gets (a restarted process numbers its consumers alike), and the
        refused subscribe would hold the partition for the client's operation timeout."""
        return subscribe_promptly(lambda: self._subscribe(topic, queue), f"{topic} (re-subscribed)")

    def _first_after(self, topic: str, after: Optional[Pos]) -> Optional[Pos]:
        """The position of `topic`'s first message after `after` (None: its first), read by a
        Reader, or None when none arrives within PROBE_TIMEOUT_MS. The forwarders' gap check
        (order.py): the ids alone cannot tell what follows a ledger change or a restart."""
        reader = reader_at(self.client, topic, None if after is None else (after.ledger, after.entry),
                           receiver_queue_size=100)
        try:
            for _ in range(PROBE_MAX_READS):  # the rest of the frontier's batch comes first
                pos = position_of(reader.read_next(PROBE_TIMEOUT_MS).message_id(), with_size=True)
                if after is None or pos.key > after.key:
                    return pos
        except pulsar.Timeout:
            return None
        finally:
            reader.close()
        return None

    def _read_between(self, topic: str, after: Optional[Pos], until: Pos) -> List[pulsar.Message]:
        """`topic`'s messages after `after` (None: from its first) and before `until`, in order,
        read by a Reader of its own (at most GAP_READ_MAX; stops after PROBE_TIMEOUT_MS without a
        message). The forwarders' gap read (forwarder.py `_read_the_gap`)."""
        reader = reader_at(self.client, topic, None if after is None else (after.ledger, after.entry))
        found: List[pulsar.Message] = []
        try:
            while len(found) < GAP_READ_MAX:
                msg = reader.read_next(PROBE_TIMEOUT_MS)
                key = position_of(msg.message_id()).key
                if after is not None and key <= after.key:
                    continue
                if key >= until.key:
                    break
                found.append(msg)
        except pulsar.Timeout:
            pass
        finally:
            reader.close()
        return found

    def _read_to_end(self, topic: str, after: Optional[Pos], limit: int) -> Tuple[List[pulsar.Message], bool]:
        """(`topic`'s messages after `after` (None: from its first), in order, read by a Reader of
        its own; True when they reach the end the broker reports, whole batch entries included).
        At most `limit`; stops early after PROBE_TIMEOUT_MS without a message. The forwarders'
        tail read (forwarder.py `_read_tail`)."""
        reader = reader_at(self.client, topic, None if after is None else (after.ledger, after.entry))
        found: List[pulsar.Message] = []
        rest = 0  # messages of the last read batch entry still to come
        complete = False
        try:
            for _ in range(limit + PROBE_MAX_READS):  # the rest of the frontier's batch comes first
                # The broker's last message id names an entry, not a batch index: once the Reader
                # is in the last entry it reports nothing more, so the rest of that entry's batch
                # is read by its size (in the message id).
                if len(found) >= limit:
                    break
                if rest <= 0 and not has_more(reader):
                    complete = True
                    break
                msg = reader.read_next(PROBE_TIMEOUT_MS)
                pos = position_of(msg.message_id(), with_size=True)
                rest = pos.size - 1 - pos.batch
                if after is None or pos.key > after.key:
                    found.append(msg)
        except pulsar.Timeout:
            pass
        finally:
            close_quietly(reader, topic)
        return found, complete

    # -- the forward trail (cancels after the forward) ---------------------------------------

    @property
    def _trail_key(self) -> str:
        # The state is shared by the instances (partition-scoped keys); the trail is each
        # instance's own (instance 0 keeps the single-instance key).
        return TRAIL_KEY if self.instance == 0 else f"{TRAIL_KEY}/{self.instance}"

    def _load_trail(self) -> None:
        raw = self.state.get(self._trail_key)
        if raw:
            try:
                self.trail = ForwardTrail.from_bytes(raw, self.trail.retention_ms, self.trail.max_checkpoints)
            except TrailFormatError as exc:  # only late cancels of older forwards lose their way
                log.warning("event=delay_level_trail_unreadable topic=%s error=%s", self.cfg.delay_level_topic, exc)

    def _take_checkpoint(self) -> None:
        """Record the near-term topic's end, THEN the claims: a forward not claimed at the
        checkpoint is published after the recorded position."""
        assert self._policy is not None and self._policy.near_term_topic is not None
        near = self._policy.near_term_topic
        if self._near_partitions:
            ends = {p: last_position(self.client, partition_name(near, p)) for p in range(self._near_partitions)}
            claimed = {f.k: f.claimed for f in list(self.forwarders)}
            self.trail.add(Checkpoint(self.clock(), None, claimed,
                                      {p: (e.ledger_id, e.entry_id) if e else None for p, e in ends.items()}))
            self.state.put(self._trail_key, self.trail.to_bytes())
            return
        end = last_position(self.client, near)
        claimed = {f.k: f.claimed for f in list(self.forwarders)}
        self.trail.add(Checkpoint(self.clock(), (end.ledger_id, end.entry_id) if end else None, claimed))
        self.state.put(self._trail_key, self.trail.to_bytes())

    def _cancel_forwarded(self, forwarder: PartitionForwarder, seq: int, ack: Callable[[], None]) -> str:
        """Follow a cancel whose parked message was already forwarded into the writer's index:
        send the writer's tombstone naming the forward's position to the partition (or topic)
        that holds it; `ack` runs once the tombstone is confirmed (or at once when there is
        nothing to follow). The position comes from the landed record (confirmed sends), else
        from reading the scheduling topic from a trail checkpoint."""
        near = self._policy.near_term_topic if self._policy else None
        if near is None or self._tombstones is None:
            ack()
            return "too-late"  # broker deliver_at: Pulsar cannot cancel a delayed message
        record = self.landed.get(forwarder.k)
        hit = record.get(seq) if record is not None else None
        if hit is None and forwarder.done < seq:
            deadline = time.monotonic() + FORWARD_DONE_WAIT_S
            while forwarder.done < seq and time.monotonic() < deadline and not self.stop_event.is_set():
                time.sleep(0.005)  # claimed but still being published
                hit = record.get(seq) if record is not None else None
                if hit is not None:
                    break
        if hit is None:
            found, cp = self.trail.scan_checkpoint(forwarder.k, seq)
            if not found:
                ack()
                return "released"  # forwarded before the oldest checkpoint: released by now
            name = forwarder.publisher.producer_name
            if self._near_partitions:
                for p in range(self._near_partitions):
                    start = cp.positions.get(p) if cp is not None else None
                    pos = find_forward(self.client, partition_name(near, p), start, name, seq)
                    if pos is not None:
                        hit = (partition_name(near, p), pos.ledger_id, pos.entry_id, pos.batch_index)
                        break
            else:
                pos = find_forward(self.client, near, cp.position if cp is not None else None, name, seq)
                if pos is not None:
                    hit = (near, pos.ledger_id, pos.entry_id, pos.batch_index)
            if hit is None:
                ack()
                return "not-forwarded"  # dropped by an earlier cancel, or dead-lettered
            self.cancels_followed_read += 1
        dest, ledger, entry, batch = hit
        props = {CANCEL_PROP: MessageRef(ledger, entry, -1, batch).format_cancel()}

        def sent(res: object, _mid: object) -> None:
            if res == pulsar.Result.Ok:
                ack()  # else unacked: the cancel is redelivered and followed again
            else:
                log.warning("event=delay_level_cancel_follow_failed partition=%d seq=%d dest=%s result=%s",
                            forwarder.k, seq, dest, res)
        self._tombstones.get(dest).send_async(b"", sent, properties=props)
        log.info("event=delay_level_cancel_followed partition=%d seq=%d dest=%s forward=%d:%d:%d", forwarder.k, seq,
                 dest, ledger, entry, batch)
        return "followed"

    # -- partition discovery -----------------------------------------------------------------

    def _discovery_loop(self) -> None:
        while not self.stop_event.wait(self.cfg.partition_discovery_seconds):
            try:
                self.discover_partitions()
            except Exception as exc:  # a failed probe is retried next interval; forwarding goes on
                log.warning("event=delay_level_discovery_failed topic=%s error=%r", self.cfg.delay_level_topic, exc)

    def discover_partitions(self) -> List[int]:
        """Read the partitions appended beyond the ones read so far (a grown maximum delay).

        Probes the next DISCOVERY_WINDOW partitions beyond the last one read with the shrink
        guard's probe (this subscription, a queue of one, closed unacked: it also creates the
        subscription, so on Pulsar the partition's messages are backlog from then on), subscribed
        one after the other and read in parallel. The first partition the broker refuses ends the
        window: Apache Pulsar refuses every partition beyond a partitioned topic's partition count
        (one refusal per round, which pulsar-client logs). A grown strategy appends a contiguous
        range, so every partition up to the farthest one holding a message is taken; then the next
        window is probed. Each one found is remembered as the partition count (a restart with the
        old strategy is refused while it holds messages) and, when this instance owns it,
        forwarded from now on; up to the strategy's cap. Returns the partitions found."""
        found: List[int] = []
        with self._discover_lock:
            while not self.stop_event.is_set():
                window = list(range(self.partitions, min(self.partitions + DISCOVERY_WINDOW, self.strategy.max_partitions)))
                probes: List[pulsar.Consumer] = []
                try:
                    for k in window:
                        probe = self._open_probe(k)
                        if probe is None:
                            break
                        probes.append(probe)
                except BaseException:
                    for probe in probes:
                        probe.close()
                    raise
                if not probes:
                    break
                with ThreadPoolExecutor(max_workers=len(probes)) as pool:
                    held = [k for k, has in zip(window, pool.map(self._holds_message, probes)) if has]
                if not held:
                    break
                for k in range(self.partitions, max(held) + 1):
                    self.partitions = k + 1
                    self.state.put(PARTITIONS_KEY, str(self.partitions).encode())
                    found.append(k)
                    owned = k in assign_partitions(k + 1, self.instance, self.num_instances)
                    log.info("event=delay_level_partition_discovered topic=%s partition=%d partitions=%d owned=%s",
                             self.cfg.delay_level_topic, k, self.partitions, owned)
                    if owned and not self.stop_event.is_set():
                        self.owned.append(k)
                        self._add_forwarder(k, self._open_publisher(k)).start()
        return found

    def _check_retention(self) -> None:
        assert self.admin is not None
        try:
            policies = self.admin.namespace_policies(self.cfg.delay_level_topic)
        except Exception as exc:  # the check is advice; forwarding does not depend on it
            log.warning("event=delay_level_retention_unchecked topic=%s error=%r", self.cfg.delay_level_topic, exc)
            return
        _, tenant, namespace, _ = split_topic(self.cfg.delay_level_topic)
        ns = f"{tenant}/{namespace}"
        self.retention_problems = retention_problems(policies, self.strategy.message_maximum_delay_time_seconds, ns)
        for problem in self.retention_problems:
            log.error("event=delay_level_retention_risk topic=%s problem=%r", self.cfg.delay_level_topic, problem)

    def _target_exists(self, topic: str) -> bool:
        assert self.admin is not None
        try:
            return self.admin.topic_exists(topic)
        except Exception as exc:  # unknown is not "deleted": forward rather than dead-letter
            log.warning("event=delay_level_target_unchecked target=%s error=%r", topic, exc)
            return True

    # -- cancels ---------------------------------------------------------------------------

    def _cancel_loop(self) -> None:
        consumer = self._cancel_consumer
        assert consumer is not None
        try:
            while not self.stop_event.is_set():
                try:
                    msg = consumer.receive(timeout_millis=500)
                except pulsar.Timeout:
                    for fw in self.forwarders:
                        fw.resolve_passed_cancels()
                    continue
                self._apply_cancel(consumer, msg)
        except BaseException as exc:
            self.failure = exc
            log.error("event=delay_level_cancel_loop_failed error=%r", exc)
            self.stop_event.set()

    def _apply_cancel(self, consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
        props = msg.properties()
        try:
            ledger, entry, batch = parse_cancel_target(props.get(CANCEL_PROP, ""))
            k = int(props.get(CANCEL_PARTITION_PROP, ""))
            if self.partitions <= k < self.strategy.max_partitions:
                self.discover_partitions()  # a producer with a grown strategy parked it: look now
            if not 0 <= k < self.partitions:
                raise ProtocolError(f"{CANCEL_PARTITION_PROP}={k} is not a partition of {self.cfg.delay_level_topic} "
                                    f"(partitions read: {self.partitions})")
            seq = sequence_id(ledger, entry, batch)
        except (ProtocolError, ValueError, ParkedMessageError) as exc:
            log.warning("event=delay_level_cancel_invalid msg_id=%s error=%r", msg.message_id(), exc)
            consumer.acknowledge(msg)
            return
        forwarder = next((f for f in self.forwarders if f.k == k), None)
        if forwarder is None:  # another instance's partition: it reads the same cancel
            consumer.acknowledge(msg)
            return
        outcome = forwarder.cancel(seq, lambda: consumer.acknowledge(msg))
        if outcome == "too-late":
            # Already forwarded: the tombstone goes to the writer (acked once it is confirmed; a
            # crash before that redelivers the cancel and the tombstone is sent again, harmlessly).
            outcome = self._cancel_forwarded(forwarder, seq, lambda: consumer.acknowledge(msg))
        log.info("event=delay_level_cancel_received partition=%d target=%d:%d:%d outcome=%s", k, ledger, entry, batch, outcome)
        if outcome == "followed":
            self.cancels_followed += 1

    # -- metrics and health ----------------------------------------------------------------

    def metrics(self) -> Dict[str, float]:
        """Current values under Pulsar-style names (labels in braces, as the local runner parses)."""
        out: Dict[str, float] = {
            "pulsar_delay_level_forwarded_total": sum(f.stats.forwarded for f in self.forwarders),
            "pulsar_delay_level_dead_lettered_total": sum(f.stats.dead_lettered for f in self.forwarders),
            "pulsar_delay_level_cancelled_total": sum(f.stats.cancelled for f in self.forwarders),
            "pulsar_delay_level_cancels_followed_total": self.cancels_followed,
            "pulsar_delay_level_cancels_followed_read_total": self.cancels_followed_read,
            "pulsar_delay_level_forward_retries_total": sum(f.stats.forward_retries for f in self.forwarders),
            "pulsar_delay_level_forward_refused_dead_lettered_total": sum(f.stats.forward_failed for f in self.forwarders),
            "pulsar_delay_level_duplicates_total": sum(f.stats.duplicates for f in self.forwarders),
            "pulsar_delay_level_partitions": len(self.forwarders),
            "pulsar_delay_level_near_term_backlog": self.gate.backlog,
            "pulsar_delay_level_backpressure_paused_ms_total": self.gate.paused_ms,
            "pulsar_delay_level_retention_problems": len(self.retention_problems),
        }
        for f in self.forwarders:
            out[f'pulsar_delay_level_next_forward_time_ms{{partition="{f.k}"}}'] = f.stats.next_forward_at
            out[f'pulsar_delay_level_forward_lag_ms{{partition="{f.k}"}}'] = f.stats.forward_lag_ms
            stuck = f.stats.stuck_since_ms
            out[f'pulsar_delay_level_forward_stuck_ms{{partition="{f.k}"}}'] = self.clock() - stuck if stuck else 0
        return out

    def _metrics_loop(self) -> None:
        next_record = time.monotonic()
        while not self.stop_event.wait(0.5):
            if time.monotonic() >= next_record:
                next_record += self.cfg.metrics_interval_seconds
                self._record_metrics()
            if self._tombstones is not None and self.trail.due(self.clock()):
                try:
                    self._take_checkpoint()
                except Exception as exc:  # only late cancels depend on it; retried next round
                    log.warning("event=delay_level_checkpoint_failed topic=%s error=%r", self.cfg.delay_level_topic, exc)
        # Stopped by a failure (not by stop()): ask for a rebuild (the function sends a wake tick).
        if not self._stopped and self.on_failure is not None:
            try:
                self.on_failure()
            except Exception as exc:  # the next tick or restart still rebuilds it
                log.warning("event=delay_level_on_failure_failed error=%r", exc)

    def _record_metrics(self) -> None:
        for name, value in self.metrics().items():
            try:
                self.record_metric(name, value)
            except Exception as exc:  # metrics must never stop forwarding
                log.debug("event=delay_level_metric_failed name=%s error=%r", name, exc)

    @property
    def healthy(self) -> bool:
        """False once a forwarder or the cancel loop failed (the function then rebuilds the service)."""
        return not self.stop_event.is_set() and self.failure is None and all(f.failure is None for f in self.forwarders)

    @property
    def failure_reason(self) -> Optional[BaseException]:
        """The first failure seen."""
        return self.failure or next((f.failure for f in self.forwarders if f.failure is not None), None)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the threads, close consumers (unacked messages are redelivered) and publishers.
        Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.stop_event.set()
        for t in self._threads:  # discovery first: it may still be adding a forwarder
            t.join(timeout_s)
        for fw in self.forwarders:
            fw.join(timeout_s)
        # Each forwarder's current consumer (the stall watchdog may have replaced the first one).
        for c in [f.consumer for f in self.forwarders] + ([self._cancel_consumer] if self._cancel_consumer else []):
            try:
                c.close()
            except Exception as exc:  # closing during a broker outage must not hide the real error
                log.warning("event=delay_level_consumer_close_failed error=%r", exc)
        for p in self._publishers:
            p.close(timeout_s=timeout_s)
        if self._tombstones is not None:
            self._tombstones.close()
        if self.admin is not None:
            self.admin.close()
        if self.target_check is not None:
            self.target_check.close()
