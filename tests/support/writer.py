"""BucketSnapshotWriter test helpers shared by the writer tests: the shipped config with a test's
topics, and a local runner over it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import yaml

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from support.paths import REPO

ROOT = REPO


INTAKES = ("direct", "runtime")


def writer_spec(unique: str, tmp_path: Path, intake: str = "direct", **user):
    """The shipped writer config with this test's topics.

    intake "direct" (the shipped config): userConfig schedulingTopic, the writer's own batch
    consumer, and the scheduling topic also an input (receiver queue 1) that starts the function;
    "runtime": no schedulingTopic, one scheduling message per process() call.
    """
    cfg = load_function_config(ROOT / "function-configs" / "bucket-snapshot-writer.yaml")
    sched = f"persistent://public/default/sched-{unique}"
    ticks = f"persistent://public/default/ticks-{unique}"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg["output"] = f"persistent://public/default/released-{unique}"
    cfg["name"] = f"writer-{unique}"
    user_config = dict(cfg["userConfig"], tickTopic=ticks, snapshotDir=str(tmp_path / "snapshots"),
                       tickTimeMillis=200, schedulingTopic=sched, **user)
    cfg["inputSpecs"][sched] = {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}
    if intake == "runtime":
        del user_config["schedulingTopic"]
    else:
        cfg["inputSpecs"][sched]["receiverQueueSize"] = 1
    cfg["userConfig"] = user_config
    return spec_from_config(cfg), sched


def start_writer(broker, tmp_path, spec) -> LocalRunner:
    return LocalRunner(spec, LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path)).start()


def cli_writer_config(tmp_path: Path, unique: str) -> Dict[str, Any]:
    """The shipped writer config on this test's topics (runner ticks every 200 ms), written to
    tmp_path/writer.yaml for `delayed send|cancel --writer-config`."""
    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    ticks = f"persistent://public/default/ticks-{unique}"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg["output"] = f"persistent://public/default/released-{unique}"
    cfg["name"] = f"writer-{unique}"
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=ticks, tickMode="runner", tickTimeMillis=200,
                             schedulingTopic=f"persistent://public/default/sched-{unique}")
    (tmp_path / "writer.yaml").write_text(yaml.safe_dump(cfg))
    return cfg
