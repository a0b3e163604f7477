"""`validate --system` on partitioned scheduling topics (issue 41, item 5): a producer whose topic
its writer cannot take is a dead end (a producer that cannot publish to a partitioned topic, one
partition by name that no instance reads, a partition count that differs from the writer's), two
writers on one scheduling topic are reported, and the scaled-out set (partitioned writer, syncer
and deletion worker at parallelism > 1) joins up."""
from __future__ import annotations

from pathlib import Path
from typing import List

import yaml
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.config.system import FunctionTopology, Scheduling, Write, system_problems
from support.paths import REPO

NS = "persistent://public/default"
SCHED = f"{NS}/sched"
CONFIGS = REPO / "function-configs"
PARTITIONED_WRITER = CONFIGS / "alternatives" / "bucket-snapshot-writer-partitioned.yaml"


def _writer(partitions: int, name: str = "writer", source: str = "w.yaml") -> FunctionTopology:
    reads = (SCHED, *(f"{SCHED}-partition-{k}" for k in range(partitions)))
    return FunctionTopology(source, f"public/default/{name}", reads, (), (Scheduling(SCHED, (f"{NS}/",)),))


def _sender(*writes: Write) -> FunctionTopology:
    return FunctionTopology("s.yaml", "public/default/sender", (), writes)


def test_a_producer_that_cannot_publish_to_a_partitioned_topic_is_a_dead_end_there_only() -> None:
    refuses = Write("forwards", "", via=SCHED, partitioned_ok=False)
    assert system_problems([_writer(0), _sender(refuses)]) == []
    assert system_problems([_writer(4), _sender(refuses)]) == [
        f"s.yaml: public/default/sender: its forwards are delayed through {SCHED}, which writer public/default/writer "
        "reads as 4 partitions, but this producer cannot publish to a partitioned topic: it refuses the topic at "
        "its first send"]
    # a producer that routes per partition (every shipped one) is fine on either
    assert system_problems([_writer(4), _sender(Write("forwards", "", via=SCHED))]) == []


def test_one_partition_by_name_must_be_one_the_writer_reads() -> None:
    assert system_problems([_writer(4), _sender(Write("a", "", via=f"{SCHED}-partition-3"))]) == []
    beyond = system_problems([_writer(4), _sender(Write("a", "", via=f"{SCHED}-partition-4"))])
    assert beyond == [f"s.yaml: public/default/sender: its a are delayed through {SCHED}-partition-4, but writer "
                      f"public/default/writer reads partitions 0..3 of {SCHED} only (schedulingTopicPartitions 4): "
                      "they are never delivered"]
    unpartitioned = system_problems([_writer(0), _sender(Write("a", "", via=f"{SCHED}-partition-0"))])
    assert len(unpartitioned) == 1 and "reads as one unpartitioned topic" in unpartitioned[0], unpartitioned


def test_a_producer_counting_partitions_by_name_must_count_the_writers() -> None:
    assert system_problems([_writer(4), _sender(Write("a", "", via=SCHED, partitions=4))]) == []
    more = system_problems([_writer(4), _sender(Write("a", "", via=SCHED, partitions=8))])
    assert len(more) == 1 and "reads 4 (schedulingTopicPartitions)" in more[0] and "never delivered" in more[0]
    fewer = system_problems([_writer(4), _sender(Write("a", "", via=SCHED, partitions=2))])
    assert len(fewer) == 1 and "keys route to other partitions" in fewer[0]
    plain = system_problems([_writer(0), _sender(Write("a", "", via=SCHED, partitions=2))])
    assert len(plain) == 1 and "one unpartitioned topic" in plain[0]


def test_two_writers_on_one_scheduling_topic() -> None:
    problems = system_problems([_writer(0, "plain", "a.yaml"), _writer(4, "parted", "b.yaml")])
    assert problems == [f"a.yaml, b.yaml: scheduling topic {SCHED} is read by 2 writers (public/default/parted, "
                        "public/default/plain; unpartitioned and 4 partitions): every message would be released by "
                        "each (deploy one writer per scheduling topic)"]


def _dead_ends(*paths: Path) -> List[str]:
    res = CliRunner().invoke(main, ["validate", "--system", *map(str, paths)], catch_exceptions=False)
    lines = [line[len("dead end: "):] for line in res.output.splitlines() if line.startswith("dead end: ")]
    assert res.exit_code == (1 if lines else 0), res.output
    return lines


def _scaled(tmp_path: Path, name: str, **changes: object) -> Path:
    cfg = yaml.safe_load((CONFIGS / name).read_text())
    user = dict(cfg["userConfig"], **changes.pop("userConfig", {}))  # type: ignore[arg-type]
    cfg.update(changes, userConfig=user)
    out = tmp_path / name
    out.write_text(yaml.safe_dump(cfg))
    return out


def test_the_scaled_out_set_joins_up(tmp_path: Path) -> None:
    # The partitioned writer (2 instances over 4 partitions), the syncer at 2 and the deletion
    # worker at 4 instances, both delaying through the partitioned topic by its own name.
    syncer = _scaled(tmp_path, "delay-level-syncer.yaml", parallelism=2)
    worker = _scaled(tmp_path, "ledger-deletion-worker.yaml", parallelism=4)
    assert yaml.safe_load(syncer.read_text())["userConfig"]["schedulingTopic"] == f"{NS}/delayed-scheduling"
    assert _dead_ends(PARTITIONED_WRITER, syncer, worker, CONFIGS / "example-function.yaml") == []


def test_a_syncer_pointed_at_a_partition_the_writer_does_not_read_is_a_dead_end(tmp_path: Path) -> None:
    # Passed before: validate took any `<topic>-partition-<k>` as served by the writer of <topic>,
    # whatever its partition count, and whether it read partitions at all.
    beyond = _scaled(tmp_path, "delay-level-syncer.yaml",
                     userConfig={"schedulingTopic": f"{NS}/delayed-scheduling-partition-4"})
    lines = _dead_ends(PARTITIONED_WRITER, beyond, CONFIGS / "ledger-deletion-worker.yaml")
    assert len(lines) == 1 and lines[0].startswith("delay-level-syncer.yaml: public/default/delay-level-syncer: its "
                                                   "forwards of parked messages"), lines
    assert "reads partitions 0..3 of persistent://public/default/delayed-scheduling only" in lines[0], lines
    # the advice docs/scaling.md once gave (partition 0 by name) beside the unpartitioned writer
    lines = _dead_ends(CONFIGS / "bucket-snapshot-writer.yaml", _scaled(
        tmp_path, "delay-level-syncer.yaml", userConfig={"schedulingTopic": f"{NS}/delayed-scheduling-partition-0"}))
    assert len(lines) == 1 and "reads as one unpartitioned topic" in lines[0], lines


def test_both_writers_in_one_set_are_reported(tmp_path: Path) -> None:
    lines = _dead_ends(CONFIGS, PARTITIONED_WRITER)
    assert len(lines) == 1 and "is read by 2 writers" in lines[0] and "unpartitioned and 4 partitions" in lines[0], lines
