"""`inspect syncer`: what a DelayLevelSyncer still holds, per delay-level partition.

For each partition k the view finds the last message the syncer forwarded: its forward
publisher (`<producer prefix>-p<k>`) numbers every forward by the parked message's position
(`rule.sequence_id`), so the highest sequence id in its dedup state (the snapshot in the
function state, then the near-term topic's tail after it, read as the publisher's recovery reads
it) names that message. A partitioned near-term topic is read per partition (the publisher
de-duplicates, and snapshots, per destination partition), and the handled position the syncer
records before each ack that leaves no forward on a plain near-term topic (over partitions,
dead letters, cancels, the broker backend) counts too. Forwarding is in order within a
partition, so what follows it is what the syncer still holds:

- parked messages: with the admin REST API (real Pulsar, `--admin-url`) the backlog of the
  syncer's subscription on the partition (`msgBacklog`); otherwise (pulsar-lite has no admin
  API) the messages after the last forwarded one, counted with a non-durable Reader. The Reader
  count also includes messages the syncer dead-lettered or cancelled after its last forward;
- the next forward time: that of the first message after the last forwarded one
  (`rule.forward_at` of its properties), on the syncer's clock.

Nothing is acknowledged or written: Readers and the publisher recovery's end probe only.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import pulsar

from ..dedup.publisher import snapshot_key
from ..dedup.recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY, read_tail
from ..dedup.sequence_map import DedupSnapshot, Position, SnapshotFormatError
from ..delaylevel.admin import AdminView
from ..delaylevel.config import SyncerConfig, parse_syncer_config
from ..delaylevel.errors import ParkedMessageError
from ..delaylevel.forwarder import HANDLED_KEY_PREFIX, PROBLEM_KEY_PREFIX
from ..delaylevel.rule import forward_at, parse_parked, partition_topic, source_position
from ..delaylevel.service import PARTITIONS_KEY
from ..deletion.admin import AdminAccess
from ..pulsar_io.readers import has_more, holding_messages, reader_at
from ..scheduler.context_state import ContextStateStore
from ..state import StateStore
from ..topics import normalize_topic
from .args import format_ms
from .common import InspectError, StateReader

log = logging.getLogger(__name__)

__all__ = ["PartitionView", "SyncerReport", "inspect_syncer", "syncer_config"]

STATE_PREFIX = "dl/0/"  # the syncer's state prefix (delaylevel/wiring.py)
# A partition whose Reader receives nothing in this long counts as empty (readers.holding_messages).
EMPTY_WAIT_S = 1.0


@dataclass(frozen=True)
class PartitionView:
    """One delay-level partition."""

    partition: int
    topic: str
    parked: Optional[int]  # None: unknown
    parked_source: str  # "admin-backlog" or "reader"
    truncated: bool  # the Reader count stopped at its limit: at least `parked`
    last_forwarded: Optional[str]  # "<ledger>:<entry>:<batch>" of the last forwarded message
    next_forward_ms: Optional[int]
    next_deliver_at_ms: Optional[int]
    problem: str = ""


@dataclass
class SyncerReport:
    """Everything `inspect syncer` shows."""

    fqfn: str
    delay_level_topic: str
    subscription: str
    near_term_topic: Optional[str]
    unit_ms: int
    lookahead_ms: int
    partitions: List[PartitionView] = field(default_factory=list)

    @property
    def parked(self) -> int:
        """Parked messages over every partition (unknown ones count 0)."""
        return sum(p.parked or 0 for p in self.partitions)

    @property
    def next_forward_ms(self) -> Optional[int]:
        """The earliest next forward time over every partition."""
        times = [p.next_forward_ms for p in self.partitions if p.next_forward_ms is not None]
        return min(times) if times else None


def _partition_count(cfg: SyncerConfig, state: Optional[ContextStateStore]) -> int:
    stored = state.get(PARTITIONS_KEY) if state is not None else None
    try:
        remembered = int(stored.decode()) if stored else 0
    except ValueError:
        remembered = 0
    return max(cfg.strategy.partitions, remembered)


def forwarded_watermarks(client: pulsar.Client, state: Optional[ContextStateStore], near_term_topic: str,
                         producers: Dict[int, str], timeout_s: float, tail: bool = True) -> Dict[int, int]:
    """partition -> the highest forward sequence id on `near_term_topic` (absent: none), from each
    producer's dedup snapshot and (with `tail`: the topic holds messages) the topic's tail after
    the oldest snapshot."""
    highest: Dict[int, int] = {}
    starts: List[Optional[Position]] = []
    for k, producer in producers.items():
        raw = state.get(snapshot_key(producer, near_term_topic)) if state is not None else None
        snap = None
        if raw is not None:
            try:
                snap = DedupSnapshot.from_bytes(raw)
            except SnapshotFormatError as exc:
                log.warning("event=inspect_dedup_snapshot_unreadable partition=%d error=%s", k, exc)
        if snap is not None and snap.producers.get(producer, 0) > 0:
            highest[k] = snap.producers[producer]
        starts.append(snap.position if snap is not None else None)
    start = None if not starts or any(s is None for s in starts) else min(starts, key=lambda p: (p.ledger_id, p.entry_id))  # type: ignore[union-attr]
    by_name = {name: k for k, name in producers.items()}

    def on_message(msg: pulsar.Message) -> bool:
        props = msg.properties()
        k = by_name.get(props.get(PRODUCER_PROPERTY, ""))
        if k is None:
            return False
        try:
            seq = int(props.get(SEQUENCE_PROPERTY, ""))
        except ValueError:
            return False
        highest[k] = max(highest.get(k, 0), seq)
        return True

    if tail:
        read_tail(client, near_term_topic, start, on_message, timeout_s=timeout_s)
    return highest


def near_term_destinations(client: pulsar.Client, near_term_topic: str) -> List[str]:
    """The topics the forwards land on: the near-term topic's partitions, or the topic itself."""
    try:
        names = [normalize_topic(p) for p in client.get_topic_partitions(near_term_topic)]
    except pulsar.PulsarException as exc:  # no metadata (yet): read it as a plain topic
        log.debug("event=inspect_near_term_partitions_unknown topic=%s error=%r", near_term_topic, exc)
        return [near_term_topic]
    return names or [near_term_topic]


def handled_positions(state: Optional[StateStore], producers: Dict[int, str]) -> Dict[int, int]:
    """partition -> the handled position the syncer recorded (forwarder.HANDLED_KEY_PREFIX)."""
    out: Dict[int, int] = {}
    for k, producer in producers.items():
        raw = state.get(f"{HANDLED_KEY_PREFIX}/{producer}") if state is not None else None
        try:
            if raw and int(raw) > 0:
                out[k] = int(raw)
        except ValueError:
            log.warning("event=inspect_handled_unreadable partition=%d value=%r", k, raw[:40] if raw else raw)
    return out


def _read_partition(client: pulsar.Client, topic: str, k: int, after: Optional[Tuple[int, int, int]], cfg: SyncerConfig,
                    count_limit: int, timeout_s: float) -> Tuple[int, bool, Optional[Dict[str, str]]]:
    """(messages after `after`, count truncated?, properties of the first of them)."""
    reader = reader_at(client, topic, (after[0], after[1]) if after is not None else None)
    count, head = 0, None
    deadline = time.monotonic() + timeout_s
    try:
        while count < count_limit and time.monotonic() < deadline and has_more(reader):
            try:
                msg = reader.read_next(1000)
            except pulsar.Timeout:
                continue
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id(), max(0, mid.batch_index()))
            if after is not None and pos <= after:
                continue  # the last forwarded message and those before it in its entry
            if head is None:
                head = dict(msg.properties())
            count += 1
    finally:
        reader.close()
    return count, count >= count_limit, head


def _forward_problem(store: Optional[StateStore], k: int) -> str:
    """The syncer's note of a forward of partition k its target refuses (forwarder.py), or ""."""
    raw = store.get(f"{PROBLEM_KEY_PREFIX}/{k}") if store is not None else None
    if not raw:
        return ""
    try:
        p = json.loads(raw)
        return (f"forward to {p['target']} refused since {format_ms(int(p['since_ms']))}: {p['reason']} "
                f"(retried {p['retry_s']:g} s, then dead-lettered to {p['dead_letter_topic']})")
    except (ValueError, KeyError, TypeError) as exc:
        return f"forward refused (unreadable note: {exc})"


def syncer_config(spec: Any) -> SyncerConfig:
    """The syncer's settings; InspectError when `spec` is not a DelayLevelSyncer config.
    Checked before anything connects."""
    fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
    try:
        cfg = parse_syncer_config(spec.user_config or {})
        cfg.strategy.unit_ms  # noqa: B018 - a bad strategy raises here
    except ValueError as exc:
        raise InspectError(f"{fqfn} is not a DelayLevelSyncer config: {exc}") from exc
    if not cfg.delay_level_topic:
        raise InspectError(f"{fqfn} is not a DelayLevelSyncer config: userConfig delayLevelTopic is empty")
    return cfg


def inspect_syncer(spec: Any, client: pulsar.Client, state: Optional[StateStore], *, admin_url: Optional[str] = None,
                   admin_access: Optional[AdminAccess] = None,
                   count_limit: int = 100_000, timeout_s: float = 60.0,
                   empty_wait_s: Optional[float] = EMPTY_WAIT_S) -> SyncerReport:
    """Read what the DelayLevelSyncer `spec` (a FunctionSpec) still holds; see the module docstring.

    Args:
        spec: the syncer's function config.
        client: a client of the broker the syncer runs on.
        state: the syncer's function state (None: none found; the Reader then counts from the start).
        admin_url: the admin REST API (real Pulsar): parked counts from the subscription backlog.
        admin_access: its token and CA on a secured cluster (a 401/403 is AdminRefused, one line).
        count_limit: the Reader counts at most this many messages per partition.
        timeout_s: bound of each read (the tail replay and each partition).
        empty_wait_s: how long a topic that delivers no message to a Reader counts as empty;
            only topics that hold a message are counted and asked for their end (see
            readers.holding_messages: the status view's look at an idle syncer logs no client
            error; a partition whose first message is slower than this counts 0 for one look).
            None: every partition is counted and asked for its end (exact; `inspect syncer`).
    """
    fqfn = f"{spec.tenant}/{spec.namespace}/{spec.name}"
    cfg = syncer_config(spec)
    unit_ms = cfg.strategy.unit_ms
    sub = cfg.subscription or fqfn
    prefix = cfg.producer_name or f"{fqfn}-0"  # the forward publishers' names (delaylevel/wiring.py)
    near = normalize_topic(cfg.scheduling_topic) if cfg.near_term_backend == "scheduler" and cfg.scheduling_topic else None
    store = ContextStateStore(StateReader(state), prefix=STATE_PREFIX) if state is not None else None
    n = _partition_count(cfg, store)
    report = SyncerReport(fqfn, normalize_topic(cfg.delay_level_topic), sub, near, unit_ms, cfg.lookahead_millis)
    dests = near_term_destinations(client, near) if near is not None else []
    topics = [partition_topic(report.delay_level_topic, k) for k in range(n)] + dests
    holding = set(topics) if empty_wait_s is None else holding_messages(client, topics, empty_wait_s)
    producers = {k: f"{prefix}-p{k}" for k in range(n)}
    watermarks = handled_positions(store, producers)
    for dest in dests:  # each one's tail is read only when it holds messages
        for k, top in forwarded_watermarks(client, store, dest, producers, timeout_s, tail=dest in holding).items():
            watermarks[k] = max(watermarks.get(k, 0), top)
    admin = AdminView.connect(admin_url, 60.0, access=admin_access) if admin_url else None
    try:
        for k in range(n):
            topic = partition_topic(report.delay_level_topic, k)
            seq = watermarks.get(k)
            after = source_position(seq) if seq else None
            count, truncated, head = (_read_partition(client, topic, k, after, cfg, count_limit, timeout_s)
                                      if topic in holding else (0, False, None))
            parked: Optional[int] = count
            source = "reader"
            problem = ("" if near is not None or seq else
                       "nearTermBackend broker: counted from the partition's start (no handled position recorded)")
            backlog = admin.subscription_backlog(topic, sub) if admin is not None else None
            if backlog is not None:  # else: no admin API, or the syncer has not subscribed yet
                parked, source, truncated = backlog, "admin-backlog", False
            nxt = deliver = None
            if head is not None:
                try:
                    parked_msg = parse_parked(head, k)
                    deliver = parked_msg.deliver_at
                    nxt = forward_at(parked_msg.base, k, unit_ms, parked_msg.deliver_at, cfg.lookahead_millis)
                except ParkedMessageError as exc:
                    problem = f"the next parked message is malformed: {exc}"
            stuck = _forward_problem(store, k)
            if stuck:
                problem = f"{stuck}; {problem}" if problem else stuck
            report.partitions.append(PartitionView(
                k, topic, parked, source, truncated,
                ":".join(str(x) for x in after) if after is not None else None, nxt, deliver, problem))
    finally:
        if admin is not None:
            admin.close()
    return report
