"""`pulsar-lifecycle delayed send` parks a delay of at least one syncer unit on the syncer's
delay-level topic (DelayLevelProducer on the syncer config's terms), the syncer hands it to the
writer, and `delayed cancel` of its `@dl<k>` id drops it; shorter delays and delays beyond the
syncer's maximum go straight to the writer."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict

import pulsar
import yaml

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.delaylevel.rule import ORIGIN_PARTITION_PROP, partition_topic
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from support.cli import run_cli
from support.helpers import receive_until
from support.paths import REPO

NS = "persistent://public/default"
UNIT_S, MAX_S = 2, 30


def _configs(tmp_path: Path, unique: str) -> Dict[str, Path]:
    sched, wticks = f"{NS}/dsp-sched-{unique}", f"{NS}/dsp-wticks-{unique}"
    writer = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    writer.update(name=f"dsp-writer-{unique}", output=f"{NS}/dsp-released-{unique}",
                  inputSpecs={wticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}})
    writer["userConfig"] = dict(writer["userConfig"], schedulingTopic=sched, tickTopic=wticks, tickMode="runner",
                                tickTimeMillis=200)
    dl = f"{NS}/dsp-dl-{unique}"
    syncer = load_function_config(REPO / "function-configs" / "delay-level-syncer.yaml")
    syncer.update(name=f"dsp-syncer-{unique}", subName=f"dsp-syncer-{unique}",
                  inputSpecs={f"{dl}-TICK": {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}})
    syncer["userConfig"] = dict(syncer["userConfig"], delayLevelTopic=dl, tickTopic=f"{dl}-TICK", schedulingTopic=sched,
                                schedulingSubscription=f"public/default/dsp-writer-{unique}", partitionBy="SECONDS",
                                unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=MAX_S, lookaheadMillis=500)
    paths = {"writer": tmp_path / "writer.yaml", "syncer": tmp_path / "syncer.yaml"}
    paths["writer"].write_text(yaml.safe_dump(writer))
    paths["syncer"].write_text(yaml.safe_dump(syncer))
    return paths


def test_long_delays_park_on_the_syncers_topic_and_cancel_through_it(broker, tmp_path, unique):
    paths = _configs(tmp_path, unique)
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "data")
    writer = LocalRunner(spec_from_config(load_function_config(paths["writer"])), opts).start()
    syncer = LocalRunner(spec_from_config(load_function_config(paths["syncer"])), opts).start()
    target = f"{NS}/dsp-orders-{unique}"
    client = quiet_client(broker.service_url)
    consumer = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    common = ["--service-url", broker.service_url, "--writer-config", str(paths["writer"]),
              "--syncer-config", str(paths["syncer"])]
    ids: Dict[str, str] = {}
    try:
        for name, delay in (("parked", "5s"), ("drop", "7s"), ("near", "1s"), ("far", f"{MAX_S + 30}s")):
            res = run_cli("delayed", "send", target, name, "--in", delay, *common, tmp_path=tmp_path)
            assert res.returncode == 0, res.stderr[-2000:]
            ids[name] = res.stdout.strip()
            if name == "far":
                assert "beyond the syncer's maximum delay" in res.stderr, res.stderr
        # 5 s and 7 s with 2 s units: partitions floor(5/2)-1 = 1 and floor(7/2)-1 = 2 (mid-slice: the
        # producer's clock reads a few ms after the CLI's)
        assert ids["parked"].endswith("@dl1") and ids["drop"].endswith("@dl2"), ids
        assert "@" not in ids["near"] and "@" not in ids["far"], ids
        drop_due = time.time() + 7
        res = run_cli("delayed", "cancel", ids["drop"], *common, tmp_path=tmp_path)
        assert res.returncode == 0 and "cancel sent to" in res.stdout and "-CANCEL" in res.stdout, res.stderr[-2000:]
        got = receive_until(consumer, 60, lambda got: len(got) >= 2 and time.time() > drop_due + 3)
    finally:
        consumer.close()
        client.close()
        syncer.stop()
        writer.stop()
    by_payload = {m.data(): m for m in got}
    assert sorted(by_payload) == [b"near", b"parked"], sorted(by_payload)
    for m in got:  # never early
        assert int(m.properties()[RELEASED_AT_PROP]) >= int(m.properties()[DELIVER_AT_PROP]), m.properties()
    # the parked one came through the syncer, from the partition its id names
    dl = yaml.safe_load(paths["syncer"].read_text())["userConfig"]["delayLevelTopic"]
    assert by_payload[b"parked"].properties().get(ORIGIN_PARTITION_PROP) == partition_topic(dl, 1)
    assert ORIGIN_PARTITION_PROP not in by_payload[b"near"].properties()


def test_a_parked_id_needs_a_syncer_config_and_a_partition_it_has(tmp_path, unique):
    paths = _configs(tmp_path, unique)
    res = run_cli("delayed", "cancel", "5:12:0@dl99", "--service-url", "pulsar://127.0.0.1:1",
                  "--syncer-config", str(paths["syncer"]), tmp_path=tmp_path)
    assert res.returncode == 2 and "15 delay-level partitions, not 100" in res.stderr, res.stderr
    res = run_cli("delayed", "cancel", "5:x@dl1", "--service-url", "pulsar://127.0.0.1:1", tmp_path=tmp_path)
    assert res.returncode == 2 and "@dl<k>" in res.stderr, res.stderr
