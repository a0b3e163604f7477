"""`pulsar-lifecycle validate --system`: the configs of a set join up (config/system.py, tested
directly, and through the CLI on the shipped set and on a set with the dead ends the shipped set
once had, given below as YAML text)."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.cli.up import plan_functions
from pulsar_lifecycle.config.system import (
    FOR_OPERATORS,
    OUTPUT,
    FunctionTopology,
    Scheduling,
    Write,
    system_problems,
)
from pulsar_lifecycle.scheduler.config import parse_writer_config
from support.paths import REPO

NS = "persistent://public/default"
SCHED = f"{NS}/sched"


def _writer(prefixes: tuple = (f"{NS}/",), name: str = "writer", source: str = "w.yaml") -> FunctionTopology:
    return FunctionTopology(source, f"public/default/{name}", (SCHED, f"{NS}/ticks"),
                            (Write("releases", f"{NS}/released", OUTPUT),
                             Write("refused", f"{SCHED}-INVALID", FOR_OPERATORS)),
                            (Scheduling(SCHED, prefixes),))


def test_a_joined_set_has_no_dead_ends() -> None:
    sender = FunctionTopology("s.yaml", "public/default/sender", (f"{NS}/in",),
                              (Write("retries", f"{NS}/in-partition-0", via=SCHED),
                               Write("forwards", "", via=SCHED),
                               Write("dead letters", f"{NS}/in-DLQ", FOR_OPERATORS)))
    assert system_problems([_writer(), sender]) == []


def test_a_topic_nobody_reads_is_a_dead_end_unless_it_is_an_output_or_for_operators() -> None:
    f = FunctionTopology("f.yaml", "public/default/f", (f"{NS}/in",),
                         (Write("requests", f"{NS}/nobody"), Write("output", f"{NS}/out", OUTPUT),
                          Write("dead letters", f"{NS}/dlq", FOR_OPERATORS)))
    assert system_problems([f]) == [f"f.yaml: public/default/f: its requests to {NS}/nobody go to a topic no config "
                                     "of the set reads"]


def test_partitions_and_their_partitioned_topic_count_as_one() -> None:
    by_name = FunctionTopology("r.yaml", "public/default/r", (f"{NS}/t-partition-0", f"{NS}/t-partition-1"))
    whole = FunctionTopology("q.yaml", "public/default/q", (f"{NS}/u",))
    sender = FunctionTopology("s.yaml", "public/default/s", (),
                              (Write("a", f"{NS}/t"), Write("b", f"{NS}/t-partition-1"), Write("c", f"{NS}/u-partition-3")))
    assert system_problems([by_name, whole, sender]) == []


def test_a_delay_through_a_topic_no_writer_reads_and_a_target_the_writer_refuses() -> None:
    worker = FunctionTopology("d.yaml", "pulsar/system/d", tuple(f"persistent://pulsar/system/del-partition-{k}" for k in range(2)),
                              tuple(Write("retries", f"persistent://pulsar/system/del-partition-{k}", via=via)
                                    for k in range(2) for via in (SCHED, f"{NS}/other")))
    problems = system_problems([_writer(), worker])
    assert problems == [
        f"d.yaml: pulsar/system/d: its retries to persistent://pulsar/system/del-partition-0 (and 1 more) are delayed "
        f"through {SCHED}, but writer public/default/writer refuses their target (outside its allowedTargetPrefix "
        f"['{NS}/']) to its -INVALID topic",
        f"d.yaml: pulsar/system/d: its retries to persistent://pulsar/system/del-partition-0 (and 1 more) are delayed "
        f"through {NS}/other, which no BucketSnapshotWriter of the set reads: they are never delivered",
    ]
    assert system_problems([_writer((f"{NS}/", "persistent://pulsar/system/del")), worker])[0].endswith(
        "they are never delivered")  # the prefix fixed: only the unserved topic is left


def test_duplicate_names_and_delay_level_topics_without_a_syncer() -> None:
    syncer = FunctionTopology("s.yaml", "public/default/s", (f"{NS}/dl",), (), syncs=(f"{NS}/dl",))
    problems = system_problems([_writer(source="a.yaml"), _writer(source="b.yaml"), syncer],
                               [(f"{NS}/dl", "producers"), (f"{NS}/other-dl", "DelayLevelProducer's default")])
    assert problems == [
        "a.yaml, b.yaml: duplicate function name public/default/writer: `functions create` of the second fails "
        "(give each its own name, or keep the alternatives out of the set)",
        f"delay-level topic {NS}/other-dl (DelayLevelProducer's default) has no DelayLevelSyncer in the set: parked "
        f"messages are never forwarded (the set's syncers read ['{NS}/dl'])",
    ]


@pytest.mark.parametrize("value", [[f"{NS}/", "persistent://pulsar/system/__ledger_deletion"],
                                   f"{NS}/, persistent://pulsar/system/__ledger_deletion"])
def test_allowed_target_prefix_takes_a_list_or_a_comma_separated_string(value: Any) -> None:
    cfg = parse_writer_config({"allowedTargetPrefix": value})
    assert cfg.allowed_target_prefixes == (f"{NS}/", "persistent://pulsar/system/__ledger_deletion")
    assert parse_writer_config({"allowedTargetPrefix": f"{NS}/"}).allowed_target_prefixes == (f"{NS}/",)
    assert parse_writer_config({}).allowed_target_prefixes == ()


# The shipped set as it once was (abridged): the deletion worker delayed through a scheduling
# topic no writer read, the syncer served another topic than producers park on, and both writer
# configs had one name.
DEAD_ENDS = {
    "writer.yaml": f"""
        name: bucket-snapshot-writer
        className: bucket_snapshot_writer.BucketSnapshotWriter
        inputs: [{NS}/delayed-ticks, {NS}/delayed-scheduling]
        output: {NS}/delayed-released
        userConfig:
          schedulingTopic: {NS}/delayed-scheduling
          tickTopic: {NS}/delayed-ticks
          allowedTargetPrefix: {NS}/
        """,
    "writer-partitioned.yaml": f"""
        name: bucket-snapshot-writer
        className: bucket_snapshot_writer.BucketSnapshotWriter
        inputs: [{NS}/delayed-ticks]
        output: {NS}/delayed-released
        userConfig:
          schedulingTopic: {NS}/delayed-scheduling
          schedulingTopicPartitions: 4
          tickTopic: {NS}/delayed-ticks
          allowedTargetPrefix: {NS}/
        """,
    "syncer.yaml": f"""
        name: delay-level-syncer
        className: delay_level_syncer.DelayLevelSyncer
        inputs: [{NS}/delayed-released-delay-level-TICK]
        userConfig:
          delayLevelTopic: {NS}/delayed-released-delay-level
          schedulingTopic: {NS}/delayed-scheduling
          tickTopic: {NS}/delayed-released-delay-level-TICK
        """,
    "worker.yaml": """
        tenant: pulsar
        namespace: system
        name: ledger-deletion-worker
        className: ledger_deletion_worker.LedgerDeletionWorker
        inputs: [%s]
        userConfig:
          ledgerDeletionParallelism: 2
          delayBackend: scheduler
          schedulingTopic: persistent://pulsar/system/__delayed_scheduling
        """ % ", ".join(f"persistent://pulsar/system/__ledger_deletion{r}-partition-{k}"
                        for r in ("", "-RETRY") for k in range(2)),
}


def _write_set(tmp_path: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def _dead_ends(*args: str) -> List[str]:
    res = CliRunner().invoke(main, ["validate", "--system", *args], catch_exceptions=False)
    lines = [line[len("dead end: "):] for line in res.output.splitlines() if line.startswith("dead end: ")]
    assert res.exit_code == (1 if lines else 0), res.output
    return lines


def test_the_old_set_fails_naming_each_dead_end(tmp_path: Path) -> None:
    lines = _dead_ends(str(_write_set(tmp_path, DEAD_ENDS)))
    assert len(lines) == 4, lines
    assert lines[0].startswith("writer-partitioned.yaml, writer.yaml: duplicate function name "
                               "public/default/bucket-snapshot-writer")
    for what in ("retries (reconsumeLaterSeconds)", "phase one's requests (sendDelaySeconds)"):
        assert any(what in line and "persistent://pulsar/system/__delayed_scheduling, which no BucketSnapshotWriter"
                   in line for line in lines[1:3]), lines
    assert lines[3].startswith(f"delay-level topic {NS}/delay-level (DelayLevelProducer's default) has no "
                               "DelayLevelSyncer in the set")


def test_the_old_worker_on_the_writers_topic_is_refused_by_its_prefix(tmp_path: Path) -> None:
    files = dict(DEAD_ENDS, **{"worker.yaml": DEAD_ENDS["worker.yaml"].replace(
        "persistent://pulsar/system/__delayed_scheduling", f"{NS}/delayed-scheduling")})
    del files["writer-partitioned.yaml"]
    lines = _dead_ends(str(_write_set(tmp_path, files)))
    assert [line for line in lines if "refuses their target (outside its allowedTargetPrefix" in line
            and line.startswith("worker.yaml")] and len(lines) == 3, lines


def test_the_shipped_set_joins_up_and_so_does_the_partitioned_alternative_in_its_place(tmp_path: Path) -> None:
    assert _dead_ends(str(REPO / "function-configs")) == []
    shipped = sorted((REPO / "function-configs").glob("*.yaml"))
    swapped = [p for p in shipped if p.name != "bucket-snapshot-writer.yaml"]
    swapped.append(REPO / "function-configs" / "alternatives" / "bucket-snapshot-writer-partitioned.yaml")
    assert _dead_ends(*map(str, swapped)) == []
    # both writers at once: nothing is a dead end, but the set would release twice if the
    # scheduling topic were partitioned; the docs keep them apart, the names differ
    names = {yaml.safe_load(p.read_text())["name"] for p in [*shipped, *swapped]}
    assert {"bucket-snapshot-writer", "bucket-snapshot-writer-partitioned"} <= names


def test_a_delay_level_topic_producers_use_needs_a_syncer() -> None:
    lines = _dead_ends("--delay-level-topic", "persistent://public/default/mine", str(REPO / "function-configs"))
    assert lines == ["delay-level topic persistent://public/default/mine (--delay-level-topic) has no "
                     "DelayLevelSyncer in the set: parked messages are never forwarded (the set's syncers read "
                     "['persistent://public/default/delay-level'])"]


def test_up_runs_a_custom_set_as_given_and_names_its_dead_ends(tmp_path: Path) -> None:
    files = dict(DEAD_ENDS)
    del files["writer-partitioned.yaml"]
    paths = sorted(_write_set(tmp_path, files).glob("*.yaml"))
    plans, notes = plan_functions(paths, embedded=True)
    worker = next(p for p in plans if p.spec.name == "ledger-deletion-worker")
    # not rewired to the writer that runs here: the config's own topic, and the dead end said
    assert worker.spec.user_config["schedulingTopic"] == "persistent://pulsar/system/__delayed_scheduling"
    assert [n for n in notes if n.startswith("dead end: worker.yaml") and "__delayed_scheduling" in n], notes
    shipped, shipped_notes = plan_functions(sorted((REPO / "function-configs").glob("*.yaml")), embedded=True)
    assert shipped_notes == [] and len(shipped) == 4


def test_inspect_syncer_says_whether_producers_park_on_its_topic_by_default() -> None:
    from rich.console import Console

    from pulsar_lifecycle.cli.render import syncer_view
    from pulsar_lifecycle.cli.syncer_view import SyncerReport

    def head(topic: str) -> str:
        console = Console(width=400, record=True)
        console.print(syncer_view(SyncerReport("public/default/s", topic, "s", SCHED, 1000, 0), 0))
        return console.export_text().splitlines()[0]
    assert "(DelayLevelProducer's default)" in head("persistent://public/default/delay-level")
    assert "not DelayLevelProducer's default persistent://public/default/delay-level: only producers that name it" \
        in head(f"{NS}/orders-delay-level")


def test_the_worker_and_writer_say_where_their_delays_go() -> None:
    from pulsar_lifecycle.cli.function_registry import topology_of

    inputs = [f"persistent://acme/system/__ledger_deletion{r}-partition-{k}" for r in ("", "-RETRY") for k in range(2)]
    worker = topology_of({"className": "ledger_deletion_worker.LedgerDeletionWorker", "inputs": inputs,
                          "userConfig": {"deletionTopicScope": "tenant", "ledgerDeletionParallelism": 2,
                                         "delayBackend": "broker"}}, "w.yaml")
    # tenant scope: the tenant the inputs name; the broker backend: sent directly, not via a writer
    assert {(w.what.split(" ")[0], w.topic, w.via, w.kind) for w in worker.writes} == {
        ("retries", "persistent://acme/system/__ledger_deletion-RETRY-partition-0", "", "internal"),
        ("retries", "persistent://acme/system/__ledger_deletion-RETRY-partition-1", "", "internal"),
        ("phase", "persistent://acme/system/__ledger_deletion-partition-0", "", "internal"),
        ("phase", "persistent://acme/system/__ledger_deletion-partition-1", "", "internal"),
        ("dead", "persistent://acme/system/__ledger_deletion-DLQ", "", FOR_OPERATORS)}
    assert system_problems([worker]) == []
    writer = topology_of({"className": "bucket_snapshot_writer.BucketSnapshotWriter", "output": f"{NS}/out",
                          "inputs": [f"{NS}/ticks", SCHED],
                          "userConfig": {"schedulingTopic": SCHED, "tickTopic": f"{NS}/ticks",
                                         "snapshotDeletion": "two-phase", "snapshotDeletionParallelism": 1}},
                         "wr.yaml")
    assert writer.schedules == (Scheduling(SCHED, ("persistent://pulsar/system/__ledger_deletion",)),)
    # its snapshot deletion requests go through itself to a deletion topic no config of this set reads
    assert system_problems([writer]) == [
        "wr.yaml: public/default/BucketSnapshotWriter: its two-phase snapshot deletion requests to "
        "persistent://pulsar/system/__ledger_deletion-partition-0 go to a topic no config of the set reads"]


def test_the_default_delay_level_topic_is_checked_only_in_a_set_with_a_syncer() -> None:
    default = [("persistent://public/default/delay-level", "DelayLevelProducer's default")]
    assert system_problems([_writer()], default_parked_on=default) == []
    syncer = FunctionTopology("s.yaml", "public/default/s", (f"{NS}/dl",), (), syncs=(f"{NS}/dl",))
    assert len(system_problems([_writer(), syncer], default_parked_on=default)) == 1
    assert len(system_problems([_writer()], parked_on=default)) == 1  # named explicitly: always
