"""`up`'s status view looks at the syncer every 5 s; on an idle system that look writes nothing to
the pulsar-client log. pulsar-lite answers a last-message-id request for a topic without messages
with an error the client logs at ERROR and WARN, so the look asks only partitions that hold a
message (before: 30 ERROR + 30 WARN per look with the shipped syncer's 30 partitions)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

from pulsar_lifecycle.cli.syncer_view import syncer_config
from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.delaylevel.rule import partition_topic
from pulsar_lifecycle.logging_setup import CLIENT_LOG_ENV
from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer
from support.paths import REPO

SYNCER = REPO / "function-configs" / "delay-level-syncer.yaml"
LEVEL = re.compile(r"^\S+ \S+ +(WARN|ERROR) ")


# The looks run in a process of their own: pulsar-client keeps the first client's logger for the
# whole process, so in a test process that made clients before, the lines would go elsewhere.
LOOKS = """
import json, sys
from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.cli.syncer_view import inspect_syncer
spec = spec_from_config(load_function_config(sys.argv[1]))
parked = []
for _ in range(int(sys.argv[3])):
    client = quiet_client(sys.argv[2])  # a client per look, as the status view makes
    try:
        parked.append(inspect_syncer(spec, client, None, timeout_s=10).parked)
    finally:
        client.close()
print(json.dumps(parked))
"""


def _looks(log: Path, url: str, count: int) -> List[int]:
    res = subprocess.run([sys.executable, "-c", LOOKS, str(SYNCER), url, str(count)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, **{CLIENT_LOG_ENV: str(log)}))
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_the_status_views_look_at_an_idle_syncer_logs_no_error(tmp_path: Path, unique) -> None:
    log = tmp_path / "pulsar-client.log"
    spec = spec_from_config(load_function_config(SYNCER))
    cfg = syncer_config(spec)
    broker = EmbeddedBroker(data_dir=tmp_path / "broker").start()
    client = quiet_client(broker.service_url)
    # an idle syncer: every partition subscribed, as the running syncer holds them
    consumers = [client.subscribe(partition_topic(cfg.delay_level_topic, k), cfg.subscription or "syncer")
                 for k in range(cfg.strategy.partitions)]
    try:
        assert _looks(log, broker.service_url, 3) == [0, 0, 0]  # the view's looks of ~15 s, back to back
        assert log.is_file()  # the looks' client logged here
        # a parked message is still counted (its partition holds a message: asked for its end)
        producer = DelayLevelProducer(client, f"persistent://public/default/quiet-{unique}",
                                      DelayedProducer(client, scheduling_topic=cfg.scheduling_topic),
                                      delay_level_topic=cfg.delay_level_topic)
        producer.send(b"parked", delay_ms=2 * 86_400_000)
        producer.flush()
        producer.close()
        assert _looks(log, broker.service_url, 1) == [1]
    finally:
        for consumer in consumers:
            consumer.close()
        client.close()
        broker.stop()
    noisy = [line for line in log.read_text().splitlines() if LEVEL.match(line)]
    assert noisy == [], f"{len(noisy)} WARN/ERROR lines, e.g. {noisy[:2]}"
