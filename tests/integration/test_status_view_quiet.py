"""`up`'s status view looks at the syncer every 5 s; on an idle system that look writes nothing to
the pulsar-client log. pulsar-lite answers a last-message-id request for a topic without messages
with an error the client logs at ERROR and WARN, so the look asks only partitions that hold a
message (before: 30 ERROR + 30 WARN per look with the shipped syncer's 30 partitions)."""
from __future__ import annotations

import re
from pathlib import Path

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import partition_topic
from pulsar_lifecycle.logging_setup import CLIENT_LOG_ENV
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer
from pulsar_lifecycle.tools.syncer_view import inspect_syncer, syncer_config
from support.paths import REPO

LEVEL = re.compile(r"^\S+ \S+ +(WARN|ERROR) ")


def test_the_status_views_look_at_an_idle_syncer_logs_no_error(tmp_path: Path, monkeypatch, unique) -> None:
    log = tmp_path / "pulsar-client.log"
    monkeypatch.setenv(CLIENT_LOG_ENV, str(log))
    spec = spec_from_config(load_function_config(REPO / "function-configs" / "delay-level-syncer.yaml"))
    cfg = syncer_config(spec)
    broker = EmbeddedBroker(data_dir=tmp_path / "broker").start()
    client = quiet_client(broker.service_url)
    # an idle syncer: every partition subscribed, as the running syncer holds them
    consumers = [client.subscribe(partition_topic(cfg.delay_level_topic, k), cfg.subscription or "syncer")
                 for k in range(cfg.strategy.partitions)]
    try:
        looks = []
        for _ in range(3):  # the view's looks of ~15 s, one after the other
            look = quiet_client(broker.service_url)  # a client per look, as the status view makes
            try:
                looks.append(inspect_syncer(spec, look, None, timeout_s=10).parked)
            finally:
                look.close()
        assert looks == [0, 0, 0]
        # a parked message is still counted (its partition holds a message: asked for its end)
        producer = DelayLevelProducer(client, f"persistent://public/default/quiet-{unique}",
                                      DelayedProducer(client, scheduling_topic=cfg.scheduling_topic),
                                      delay_level_topic=cfg.delay_level_topic)
        producer.send(b"parked", delay_ms=2 * 86_400_000)
        producer.flush()
        producer.close()
        look = quiet_client(broker.service_url)
        try:
            assert inspect_syncer(spec, look, None, timeout_s=10).parked == 1
        finally:
            look.close()
    finally:
        for consumer in consumers:
            consumer.close()
        client.close()
        broker.stop()
    text = log.read_text() if log.exists() else ""
    noisy = [line for line in text.splitlines() if LEVEL.match(line)]
    assert noisy == [], f"{len(noisy)} WARN/ERROR lines, e.g. {noisy[:2]}"
