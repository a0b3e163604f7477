"""Does a set of function configs join up? The analysis behind `pulsar-lifecycle validate --system`.

Each config is described by a FunctionTopology: the topics it reads, every topic it writes
(directly, or delayed through a BucketSnapshotWriter's scheduling topic), the scheduling topics
it serves as a writer (with the targets it accepts) and the delay-level topics it serves as a
syncer. The feature packages build these records from their configs (function_registry.py);
this module only compares them, with no Pulsar I/O, and reports one line per dead end:

* a topic written that no config in the set reads, unless it is the function's declared
  `output` (the user's own topic, e.g. `delayed-released`) or a topic for operators (dead
  letters and refused messages, read with the operator tools);
* a message delayed through a scheduling topic no writer of the set reads, or whose target is
  outside that writer's allowedTargetPrefix (the writer would refuse it to its -INVALID topic);
* a message delayed through a scheduling topic its writer cannot take as sent: a partitioned
  writer's topic (read as `<topic>-partition-<k>`) from a producer that cannot publish to a
  partitioned topic; one partition by name that the writer does not read (beyond its
  `schedulingTopicPartitions`, or of a topic the writer reads unpartitioned); a producer that
  addresses partitions by name over another count than the writer reads;
* one scheduling topic read by two writers of the set (each message would be released twice);
* two configs with one function name (`tenant/namespace/name`);
* a delay-level topic that producers park on (given by the caller) with no syncer of the set
  serving it; DelayLevelProducer's default is checked only in a set with a syncer (a set
  without one does not use delay-level topics).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..topics import TopicName, TopicNameError, strip_partition

__all__ = ["FOR_OPERATORS", "INTERNAL", "OUTPUT", "FunctionTopology", "Scheduling", "Write", "config_inputs",
           "function_name", "generic_topology", "normalize", "system_problems"]

#: A topic some config of the set must read.
INTERNAL = "internal"
#: The function's declared `output`: the user's own topic, read by their consumers.
OUTPUT = "output"
#: Dead letters and refused messages: read by operators (inspect, the DLQ tools), not by a function.
FOR_OPERATORS = "for-operators"
KINDS = (INTERNAL, OUTPUT, FOR_OPERATORS)


def normalize(topic: str) -> str:
    """Pulsar's full topic name (`t` and `tenant/ns/t` get `persistent://`, public/default); a
    name that does not parse is kept as given (the per-file validation reports it)."""
    try:
        return TopicName.from_client(topic).full_name
    except (TopicNameError, ValueError):
        return topic


@dataclass(frozen=True)
class Write:
    """Messages a function sends: `what` they are, to `topic` (empty: per-message targets this
    config cannot name, e.g. the business topics of parked messages), delayed through the
    scheduling topic `via` ("" = sent directly)."""

    what: str
    topic: str = ""
    kind: str = INTERNAL
    via: str = ""
    #: The producer can publish to a partitioned `via` (routes each message to one partition:
    #: DelayedProducer, the DedupPublisher); False: it refuses one at its first send.
    partitioned_ok: bool = True
    #: > 0: the producer addresses `via`'s partitions by name over this many partitions.
    partitions: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Write kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class Scheduling:
    """A scheduling topic a BucketSnapshotWriter serves, and the targets it accepts."""

    topic: str
    allowed_prefixes: Tuple[str, ...]
    #: How many partitions of `topic` the writer reads by name (0: the topic itself); None: as
    #: its `reads` say (`<topic>-partition-<k>`).
    partitions: Optional[int] = None


@dataclass(frozen=True)
class FunctionTopology:
    """What one function config reads, writes and serves (topics fully qualified)."""

    source: str  # the config file, for the report
    fqfn: str  # tenant/namespace/name
    reads: Tuple[str, ...] = ()
    writes: Tuple[Write, ...] = ()
    schedules: Tuple[Scheduling, ...] = ()
    syncs: Tuple[str, ...] = ()  # delay-level topics this function forwards from


def function_name(cfg: Mapping[str, Any]) -> str:
    """`tenant/namespace/name` of a config (Pulsar's defaults: public, default, the class's name)."""
    name = cfg.get("name") or str(cfg.get("className") or "").rsplit(".", 1)[-1]
    return f"{cfg.get('tenant') or 'public'}/{cfg.get('namespace') or 'default'}/{name}"


def config_inputs(cfg: Mapping[str, Any]) -> Tuple[str, ...]:
    """Every input topic a config names (inputs, inputSpecs, customSerdeInputs, topicsPattern)."""
    found: List[str] = []
    raw = cfg.get("inputs")
    if isinstance(raw, str):
        found += [t for t in raw.split(",") if t.strip()]
    elif isinstance(raw, (list, tuple)):
        found += [t for t in raw if isinstance(t, str)]
    for key in ("inputSpecs", "customSerdeInputs", "customSchemaInputs"):
        if isinstance(cfg.get(key), Mapping):
            found += [t for t in cfg[key] if isinstance(t, str)]
    if isinstance(cfg.get("topicsPattern"), str):
        found.append(cfg["topicsPattern"])
    return tuple(dict.fromkeys(normalize(t.strip()) for t in found))


def generic_topology(cfg: Mapping[str, Any], source: str) -> FunctionTopology:
    """A function this package does not know: it reads its inputs and writes its declared output."""
    output = cfg.get("output")
    writes = (Write("output", normalize(output), OUTPUT),) if isinstance(output, str) and output else ()
    return FunctionTopology(source, function_name(cfg), config_inputs(cfg), writes)


class _Readers:
    """Who reads a topic: a consumer of a partitioned topic reads its partitions, and a producer
    of a partitioned topic's base name writes to partitions someone may read by name."""

    def __init__(self, functions: Sequence[FunctionTopology]) -> None:
        self._by_topic: Dict[str, List[str]] = defaultdict(list)
        self._by_base: Dict[str, List[str]] = defaultdict(list)
        for f in functions:
            for topic in f.reads:
                self._by_topic[topic].append(f.fqfn)
                self._by_base[strip_partition(topic)].append(f.fqfn)

    def of(self, topic: str) -> List[str]:
        return self._by_topic.get(topic) or self._by_topic.get(strip_partition(topic)) or self._by_base.get(topic, [])


def _partitions_read(f: FunctionTopology, sched: Scheduling) -> int:
    """How many partitions of its scheduling topic a writer reads by name (0: the topic itself)."""
    if sched.partitions is not None:
        return sched.partitions
    prefix = f"{sched.topic}-partition-"
    found = {int(t[len(prefix):]) for t in f.reads if t.startswith(prefix) and t[len(prefix):].isdigit()}
    return max(found) + 1 if found else 0


def _partition_index(topic: str) -> int:
    try:
        return TopicName.parse(topic).partition_index
    except (TopicNameError, ValueError):
        return -1


def _shape_problem(w: Write, sched_topic: str, writer: str, partitions: int) -> Optional[str]:
    """Why writer `writer` (reading `sched_topic` over `partitions` partitions by name, 0: as one
    topic) cannot take what `w` sends through `w.via`, or None."""
    index = _partition_index(w.via) if w.via != sched_topic else -1
    if index >= 0:  # one partition by name
        if partitions == 0:
            return (f"are delayed through {w.via}, one partition by name of {sched_topic}, which writer {writer} reads "
                    "as one unpartitioned topic: they are never delivered (give the topic's own name)")
        if index >= partitions:
            return (f"are delayed through {w.via}, but writer {writer} reads partitions 0..{partitions - 1} of "
                    f"{sched_topic} only (schedulingTopicPartitions {partitions}): they are never delivered")
        return None
    if partitions and not w.partitioned_ok:
        return (f"are delayed through {w.via}, which writer {writer} reads as {partitions} partitions, but this "
                "producer cannot publish to a partitioned topic: it refuses the topic at its first send")
    if w.partitions and w.partitions != partitions:
        if partitions == 0:
            return (f"are delayed through {w.partitions} partitions of {w.via} by name, but writer {writer} reads "
                    f"{w.via} as one unpartitioned topic: they are never delivered")
        return (f"are delayed through {w.partitions} partitions of {w.via} by name, but writer {writer} reads "
                f"{partitions} (schedulingTopicPartitions): "
                + ("messages routed to the partitions beyond are never delivered" if w.partitions > partitions
                   else "keys route to other partitions than the writer's other producers put them"))
    return None


def _topics_text(topics: Sequence[str]) -> str:
    shown = sorted(set(topics))
    return shown[0] + (f" (and {len(shown) - 1} more)" if len(shown) > 1 else "")


def system_problems(functions: Sequence[FunctionTopology], parked_on: Iterable[Tuple[str, str]] = (),
                    default_parked_on: Iterable[Tuple[str, str]] = ()) -> List[str]:
    """One line per dead end of the set `functions` (see the module docstring), in a stable order.

    `parked_on`: (delay-level topic, who parks there) pairs from outside the configs; each needs a
    syncer in the set. `default_parked_on`: the same, checked only when the set has a syncer
    (DelayLevelProducer's default topic).
    """
    problems: List[str] = []
    by_name: Dict[str, List[str]] = defaultdict(list)
    for f in functions:
        by_name[f.fqfn].append(f.source)
    for fqfn, sources in by_name.items():
        if len(sources) > 1:
            problems.append(f"{', '.join(sources)}: duplicate function name {fqfn}: `functions create` of the "
                            "second fails (give each its own name, or keep the alternatives out of the set)")
    readers = _Readers(functions)
    writers: Dict[str, List[Tuple[str, Tuple[str, ...], int, str]]] = defaultdict(list)
    for f in functions:
        for sched in f.schedules:
            writers[sched.topic].append((f.fqfn, sched.allowed_prefixes, _partitions_read(f, sched), f.source))
    for topic, served_by in writers.items():
        distinct = {fqfn: source for fqfn, _p, _n, source in served_by}
        if len(distinct) > 1:  # one name twice is reported as a duplicate name above
            counts = sorted({n for _f, _p, n, _s in served_by})
            shapes = " and ".join("unpartitioned" if n == 0 else f"{n} partitions" for n in counts)
            problems.append(f"{', '.join(sorted(distinct.values()))}: scheduling topic {topic} is read by "
                            f"{len(distinct)} writers ({', '.join(sorted(distinct))}; {shapes}): every message "
                            "would be released by each (deploy one writer per scheduling topic)")
    # (source, fqfn, what, problem text) -> targets: one line per dead end, however many partitions
    grouped: Dict[Tuple[str, str, str, str], List[str]] = defaultdict(list)
    for f in functions:
        for w in f.writes:
            if w.via:
                served = writers.get(w.via) or writers.get(strip_partition(w.via)) or []
                if not served:
                    grouped[(f.source, f.fqfn, w.what, f"are delayed through {w.via}, which no BucketSnapshotWriter "
                                                        "of the set reads: they are never delivered")].append(w.topic)
                    continue
                for writer, _prefixes, partitions, _source in served:
                    sched_topic = w.via if w.via in writers else strip_partition(w.via)
                    shape = _shape_problem(w, sched_topic, writer, partitions)
                    if shape:
                        grouped[(f.source, f.fqfn, w.what, shape)].append(w.topic)
                for writer, prefixes, _partitions, _source in served:
                    if w.topic and not any(w.topic.startswith(p) for p in prefixes):
                        grouped[(f.source, f.fqfn, w.what,
                                 f"are delayed through {w.via}, but writer {writer} refuses their target "
                                 f"(outside its allowedTargetPrefix {list(prefixes)}) to its -INVALID topic")
                                ].append(w.topic)
            if w.topic and w.kind == INTERNAL and not readers.of(w.topic):
                grouped[(f.source, f.fqfn, w.what, "go to a topic no config of the set reads")].append(w.topic)
    for (source, fqfn, what, text), targets in grouped.items():
        to = f" to {_topics_text([t for t in targets if t])}" if any(targets) else ""
        problems.append(f"{source}: {fqfn}: its {what}{to} {text}")
    synced = {t for f in functions for t in f.syncs}
    for topic, who in dict.fromkeys([*parked_on, *(default_parked_on if synced else ())]):
        if normalize(topic) not in synced:
            serving = sorted(synced)
            problems.append(f"delay-level topic {topic} ({who}) has no DelayLevelSyncer in the set: parked messages "
                            f"are never forwarded (the set's syncers read {serving or 'nothing'})")
    return problems
