"""Issue 41, item 6's last test: the scaled-out set deployed through Pulsar's real function worker
(Apache Pulsar 4.0.0 standalone, process runtime, function state on its table service,
support/real_worker.py) with `pulsar-admin functions create` of the shipped YAMLs, userConfig keys
adapted for the test's speed and URLs only:

* function-configs/alternatives/bucket-snapshot-writer-partitioned.yaml at parallelism 2 over the
  4-partition scheduling topic (created partitioned first, as docs/scaling.md deploys it);
* function-configs/delay-level-syncer.yaml at parallelism 2, `schedulingTopic` the partitioned
  topic's base name (the syncer routes its forwards over the partitions itself);
* function-configs/ledger-deletion-worker.yaml at parallelism 2.

`pulsar-lifecycle validate --system` passes on exactly the configs deployed. Business topics: a
4-partition `orders-p` and a plain `orders-n`. Short delays go through `DelayedProducer` (the
partitioned scheduling topic by its base name) and `pulsar-lifecycle delayed send` (the
partitioned writer's config), long ones are parked on the delay-level topic (DelayLevelProducer,
and `delayed send` with the syncer's config) and forwarded by the syncer; keyed and unkeyed.
Asserted: every message released once, none before its deliver-at time (by the writer's
released-at property), each keyed one on partition java_string_hash(key) % 4 of orders-p.
"""
from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.dedup.partition_router import java_string_hash
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.strategy import DelayLevelTopicPartitionStrategy, PartitionBy
from pulsar_lifecycle.packaging.zip_builder import build_wheel
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import RELEASED_AT_PROP
from pulsar_lifecycle.timing import DelayedProducer
from support.crash_runs import create_partitioned_topic
from support.helpers import wait_value
from support.paths import REPO
from support.real_worker import RealWorker

REASON = "Pulsar's function worker and table service run on the real standalone only"
pytestmark = [pytest.mark.pulsar_only(REASON), pytest.mark.xdist_group("real-worker-scaled-out")]

PARTITIONS = 4
WRITER_PARALLELISM = 2
SYNCER_PARALLELISM = 2
DELETION_PARALLELISM = 2
UNIT_S = 5  # the syncer's delay-level unit for the test (the shipped one is a day)
CLI = str(REPO / ".venv" / "bin" / "pulsar-lifecycle")


def _configs(tmp: Path, admin_url: str, bookie_http: str) -> Dict[str, Tuple[Path, Dict]]:
    """The three shipped configs at the test's parallelism, userConfig keys adapted, written to
    `tmp` (the directory `validate --system` checks)."""
    writer = load_function_config(REPO / "function-configs" / "alternatives" / "bucket-snapshot-writer-partitioned.yaml")
    assert writer["userConfig"]["schedulingTopicPartitions"] == PARTITIONS
    writer["parallelism"] = WRITER_PARALLELISM
    # On a cluster: tickMode hold and `send-ticks` (the config's own comment, docs/scaling.md).
    writer["userConfig"] = dict(writer["userConfig"], tickMode="hold", tickTimeMillis=500)
    syncer = load_function_config(REPO / "function-configs" / "delay-level-syncer.yaml")
    syncer["parallelism"] = SYNCER_PARALLELISM
    user = {k: v for k, v in syncer["userConfig"].items() if k != "instances"}  # from the Context
    syncer["userConfig"] = dict(user, partitionBy="SECONDS", unitSeconds=UNIT_S, messageMaximumDelayTimeSeconds=600,
                                lookaheadMillis=3000, partitionDiscoverySeconds=1,
                                # the partitioned topic's BASE name, and the partitioned writer's subscription
                                schedulingTopic=writer["userConfig"]["schedulingTopic"],
                                schedulingSubscription=f"{writer['tenant']}/{writer['namespace']}/{writer['name']}")
    deleter = load_function_config(REPO / "function-configs" / "ledger-deletion-worker.yaml")
    deleter["parallelism"] = DELETION_PARALLELISM
    deleter["userConfig"] = dict(deleter["userConfig"], pulsarAdminUrl=admin_url, bookieHttpUrls=[bookie_http],
                                 sendDelaySeconds=2, reconsumeLaterSeconds=3, ledgersCacheTtlSeconds=1)
    assert deleter["userConfig"]["schedulingTopic"] == writer["userConfig"]["schedulingTopic"]
    tmp.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, cfg in (("writer", writer), ("syncer", syncer), ("deleter", deleter)):
        path = tmp / f"{key}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        out[key] = (path, cfg)
    return out


def _fqfn(cfg: Dict) -> str:
    return f"{cfg['tenant']}/{cfg['namespace']}/{cfg['name']}"


def _cli(*args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"pulsar-lifecycle {' '.join(args)} exited {res.returncode}:\n" \
                                f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.mark.timeout(420)
def test_the_scaled_out_set_through_the_real_worker(real_worker: RealWorker, tmp_path: Path) -> None:
    t0 = time.monotonic()
    sa, admin = real_worker.standalone, real_worker.admin
    configs = _configs(tmp_path / "configs", sa.admin_url, sa.bookie_http_url)
    (writer_path, writer), (syncer_path, syncer) = configs["writer"], configs["syncer"]
    fq = {k: _fqfn(c) for k, (_p, c) in configs.items()}
    scheduling = writer["userConfig"]["schedulingTopic"]

    # The exact set deployed below passes `validate --system` (run as the CLI).
    validated = _cli("validate", "--system", str(tmp_path / "configs"))
    print(f"\nvalidate --system: {validated.stdout.strip()[-400:]}")

    create_partitioned_topic(sa.admin_url, scheduling, PARTITIONS)
    run = uuid.uuid4().hex[:6]
    orders_p, orders_n = (f"persistent://public/default/orders-{k}-{run}" for k in ("p", "n"))
    create_partitioned_topic(sa.admin_url, orders_p, PARTITIONS)
    wheel = build_wheel(REPO, tmp_path / "wheel")
    for key in ("writer", "syncer", "deleter"):
        admin.create(wheel, configs[key][0])
    for ticks, n in ((writer["userConfig"]["tickTopic"], WRITER_PARALLELISM),
                     (syncer["userConfig"]["tickTopic"], SYNCER_PARALLELISM)):
        _cli("send-ticks", "--service-url", sa.service_url, "--tick-topic", ticks, "--instances", str(n))
    for key, n in (("writer", WRITER_PARALLELISM), ("syncer", SYNCER_PARALLELISM), ("deleter", DELETION_PARALLELISM)):
        admin.wait_running(fq[key], n, timeout_s=300)
    t_deployed = time.monotonic() - t0

    client = quiet_client(sa.service_url)
    got: Dict[str, List[Tuple[int, int, Optional[str]]]] = {}  # payload -> (released at, partition, key)
    due: Dict[str, int] = {}
    keys: Dict[str, Optional[str]] = {}
    try:
        consumers = [client.subscribe(t, f"check-{run}", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest)
                     for t in (orders_p, orders_n)]
        near = DelayedProducer(client, scheduling_topic=scheduling)  # the base name: routed by the producer
        strategy = DelayLevelTopicPartitionStrategy(600, PartitionBy.SECONDS, unit_seconds=UNIT_S)
        parked = {t: DelayLevelProducer(client, t, near, strategy=strategy) for t in (orders_p, orders_n)}
        assert parked[orders_p].delay_level_topic == syncer["userConfig"]["delayLevelTopic"]
        now = int(time.time() * 1000)

        def sent(payload: str, at: int, key: Optional[str]) -> None:
            due[payload], keys[payload] = at, key

        for i in range(60):  # short: straight to the writer through the partitioned scheduling topic
            topic = orders_p if i % 3 else orders_n
            key = f"k-{i % 17}" if i % 2 == 0 else None
            at = now + 3000 + 50 * i
            near.send(topic, f"near-{i}".encode(), at, key=key)
            sent(f"near-{i}", at, key)
        for i in range(40):  # long: parked on the delay-level topic, forwarded by the syncer
            topic = orders_p if i % 4 else orders_n
            key = f"k-{i % 13}" if i % 2 == 0 else None
            # From the clock at this send: the near sends before it take seconds on a loaded host, and a
            # delay that shrank below the syncer's unit goes straight to the writer (not parked).
            at = int(time.time() * 1000) + 15_000 + 200 * i
            msg = parked[topic].send(f"parked-{i}".encode(), deliver_at_ms=at, key=key)
            assert msg.parked, msg
            sent(f"parked-{i}", at, key)
        # `delayed send` with the partitioned writer's config and the syncer's: short ones straight
        # to the writer (below the syncer's unit), long ones parked.
        cli_sends = [("cli-near-keyed", orders_p, "3s", "cli-key-1"), ("cli-near-unkeyed", orders_p, "3s", None),
                     ("cli-near-plain", orders_n, "3s", "cli-key-2"),
                     ("cli-parked-keyed", orders_p, "20s", "cli-key-3"), ("cli-parked-unkeyed", orders_p, "20s", None)]
        for payload, topic, delay, key in cli_sends:
            before = int(time.time() * 1000)
            _cli("delayed", "send", topic, payload, "--in", delay, "--service-url", sa.service_url,
                 "--writer-config", str(writer_path), "--syncer-config", str(syncer_path),
                 *(["--key", key] if key else []))
            sent(payload, before + int(delay[:-1]) * 1000, key)  # a lower bound of the deliver-at time
        last_due = max(due.values())

        deadline = time.monotonic() + max(60.0, (last_due - time.time() * 1000) / 1000 + 60)
        while time.monotonic() < deadline and not (set(due) <= set(got) and time.time() * 1000 > last_due + 3000):
            for c in consumers:
                try:
                    m = c.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                released_at = int(m.properties().get(RELEASED_AT_PROP) or m.publish_timestamp())
                name = m.topic_name()
                partition = int(name.rsplit("-partition-", 1)[1]) if "-partition-" in name else -1
                got.setdefault(m.data().decode(), []).append((released_at, partition, m.partition_key() or None))
                c.acknowledge(m)
    finally:
        client.close()

    missing = sorted(set(due) - set(got))
    twice = sorted(p for p, r in got.items() if len(r) > 1)
    early = sorted(p for p, r in got.items() if p in due and min(at for at, _k, _key in r) < due[p])
    unexpected = sorted(set(got) - set(due))
    wrong_partition = {p: (keys[p], r[0][1]) for p, r in got.items() if p in keys and keys[p] and r[0][1] >= 0
                       and r[0][1] != java_string_hash(keys[p]) % PARTITIONS}
    wrong_key = {p: r[0][2] for p, r in got.items() if p in keys and r[0][2] != keys[p]}
    on_p = {p: r[0][1] for p, r in got.items() if r[0][1] >= 0}
    on_n = {p for p, r in got.items() if r[0][1] < 0}
    unkeyed_partitions = sorted({k for p, k in on_p.items() if not keys.get(p)})
    lateness = sorted(max(0, r[0][0] - due[p]) for p, r in got.items() if p in due)
    p99 = lateness[min(len(lateness) - 1, int(len(lateness) * 0.99))] if lateness else 0
    print(f"scaled-out set: deployed in {t_deployed:.0f} s; {len(due)} sent ({sum(1 for p in due if keys[p])} keyed), "
          f"{len(got)} released: {len(on_p)} on {orders_p} (unkeyed on partitions {unkeyed_partitions}), {len(on_n)} "
          f"on {orders_n}; lateness p99 {p99} ms, max {lateness[-1] if lateness else 0} ms; "
          f"test {time.monotonic() - t0:.0f} s")
    assert not (missing or twice or early or unexpected), (
        f"missing {len(missing)} {missing[:5]}, twice {len(twice)} {twice[:5]}, early {len(early)} {early[:5]}, "
        f"unexpected {unexpected[:5]}")
    assert not wrong_partition, f"keyed releases off their key's partition (key, partition): {wrong_partition}"
    assert not wrong_key, f"keys not kept: {wrong_key}"
    assert on_n == {p for p in due if p.startswith("cli-near-plain")} | {
        f"near-{i}" for i in range(60) if i % 3 == 0} | {f"parked-{i}" for i in range(40) if i % 4 == 0}
    assert len(unkeyed_partitions) > 1, f"unkeyed releases all on one partition: {unkeyed_partitions}"

    for fqfn in fq.values():
        admin.delete(fqfn)
    wait_value("every instance stopped after `functions delete`",
               lambda: not any(real_worker.instance_pids(f, i) for f in fq.values() for i in range(4)), timeout_s=120)
