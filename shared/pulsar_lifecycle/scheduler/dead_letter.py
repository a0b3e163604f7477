"""The writer's dead-letter topic for releases a target refused for targetRetrySeconds.

One de-duplicated producer per target (`dead_letter_producer`): a target's releases are
dead-lettered in release order, so each producer's sequence ids only increase. Before the first
send for a target its mark (the highest sequence id dead-lettered and the reason) is stored, so a
release replayed after a crash at or below the mark goes to the dead-letter topic again
(de-duplicated there), never to the target. The release service decides when to dead-letter
(scheduler/target_health.py); this module sends and remembers.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Dict, Iterable, List, Tuple

from ..dedup.publisher import DedupPublisher, OutMessage
from ..dedup.recovery import PRODUCER_PROPERTY, SEQUENCE_PROPERTY
from ..scheduling_protocol import ERROR_PROP
from ..topics import normalize_topic
from .target_health import DEAD_TARGET_PROP

DEAD_MARK_PREFIX = "dead-target"

__all__ = ["DEAD_MARK_PREFIX", "DeadDest", "DeadLetters", "dead_letter_producer"]


def dead_letter_producer(producer_name: str, target: str) -> str:
    """The dead-letter producer name for releases of `target`: one per target, so the sequence ids
    each de-duplicates on increase (a target's releases are dead-lettered in release order)."""
    digest = hashlib.sha1(normalize_topic(target).encode("utf-8")).hexdigest()[:8]
    return f"{producer_name}-dlq-{digest}"


class DeadDest:
    """Where a dead-lettered release went: a destination of the target's dead-letter publisher."""

    __slots__ = ("publisher", "topic")

    def __init__(self, publisher: Any, topic: str) -> None:
        self.publisher = publisher
        self.topic = topic

    def persisted(self) -> int:
        return int(self.publisher.persisted_seq(self.topic))


class DeadLetters:
    """Sends held releases to `topic` and keeps the per-target marks.

    `publisher` is the release publisher (possibly a partitioned writer's fenced wrapper with
    `inner`): its client, producer name, state store and key hashing make the dead-letter
    producers. `full` maps a target as released to its full name. Release thread only.
    """

    def __init__(self, publisher: Any, topic: str, full: Callable[[str], str]) -> None:
        self.publisher = publisher
        self.topic = topic
        self._full = full
        self._marks: Dict[str, Tuple[int, str]] = {}
        self._publishers: Dict[str, DedupPublisher] = {}
        self._dests: Dict[Tuple[str, str], DeadDest] = {}
        self.count = 0

    def mark(self, target: str) -> Tuple[int, str]:
        """(highest sequence id dead-lettered for `target`, its reason); (-1, "") when none."""
        mark = self._marks.get(target)
        if mark is None:
            mark = self._marks[target] = self._load_mark(target)
        return mark

    def store_mark(self, target: str, seq: int, reason: str) -> None:
        """Stored before the dead-letter sends, so before any commit passes them."""
        if self._marks.get(target, (-1, ""))[0] >= seq:
            return
        self.publisher.state_store.put(self._mark_key(target),
                                       json.dumps({"seq": seq, "reason": reason}).encode("utf-8"))
        self._marks[target] = (seq, reason)

    def send(self, target: str, entries: List[List[Any]], reason: str) -> None:
        """Publish `entries` (release-service entries: [seq, dest, OutMessage, ...]) to the topic:
        payload, key and properties as released, plus ERROR_PROP (the reason) and DEAD_TARGET_PROP
        (the target); each entry's destination becomes its DeadDest."""
        dlq = self._publisher(target)
        msgs = []
        for e in entries:
            m = e[2]
            props = dict(m.properties)
            props.pop(PRODUCER_PROPERTY, None)
            props.pop(SEQUENCE_PROPERTY, None)
            props[ERROR_PROP] = reason
            props[DEAD_TARGET_PROP] = self._full(target)
            msgs.append(OutMessage(m.payload, m.sequence_id, props, m.partition_key, m.event_timestamp))
        by_seq = {e[0]: e for e in entries}
        for dest, group in dlq.route(self.topic, msgs):
            key = (target, dest)
            ref = self._dests.get(key)
            if ref is None:
                ref = self._dests[key] = DeadDest(dlq, dest)
            for m in group:
                by_seq[m.sequence_id][1] = ref
            dlq.publish_many(dest, group, properties_owned=True)
        self.count += len(entries)

    def publishers(self) -> Iterable[DedupPublisher]:
        """The dead-letter publishers opened so far (closed with the service)."""
        return list(self._publishers.values())

    def _publisher(self, target: str) -> DedupPublisher:
        dlq = self._publishers.get(target)
        if dlq is None:
            inner = getattr(self.publisher, "inner", self.publisher)
            dlq = DedupPublisher(inner.client, dead_letter_producer(inner.producer_name, target), inner.state_store,
                                 key_hashing=inner.key_hashing)
            self._publishers[target] = dlq
        return dlq

    def _mark_key(self, target: str) -> str:
        return f"{DEAD_MARK_PREFIX}/{getattr(self.publisher, 'producer_name', '')}@{self._full(target)}"

    def _load_mark(self, target: str) -> Tuple[int, str]:
        store = getattr(self.publisher, "state_store", None)
        raw = store.get(self._mark_key(target)) if store is not None else None
        if raw is None:
            return (-1, "")
        rec = json.loads(raw.decode("utf-8"))
        return (int(rec["seq"]), str(rec.get("reason", "")))
