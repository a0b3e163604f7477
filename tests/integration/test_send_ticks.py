"""`pulsar-lifecycle send-ticks`: the ticks that start a deployed writer whose only input is its tick topic."""
from __future__ import annotations

import pulsar
from click.testing import CliRunner

from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.runtime.broker import free_port
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.scheduling_protocol import TICK_PROP


def test_sends_two_ticks_per_instance_each_a_wake_tick(broker, unique):
    topic = f"persistent://public/default/ticks-{unique}"
    client = quiet_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
        res = CliRunner().invoke(main, ["send-ticks", "--service-url", broker.service_url,
                                        "--tick-topic", topic, "--instances", "3"])
        assert res.exit_code == 0, res.output
        assert f"sent 6 tick(s) to {topic}" in res.output
        got = [consumer.receive(timeout_millis=10_000) for _ in range(6)]
        assert all(m.properties().get(TICK_PROP, "").isdigit() for m in got)
        try:
            extra = consumer.receive(timeout_millis=300)
        except pulsar.Timeout:  # nothing beyond the six
            extra = None
        assert extra is None
    finally:
        client.close()


def test_unreachable_broker_and_bad_count_are_one_line_errors():
    url = f"pulsar://127.0.0.1:{free_port()}"
    res = CliRunner().invoke(main, ["send-ticks", "--service-url", url, "--tick-topic", "t", "--connect-timeout", "0.5"])
    assert res.exit_code == 1 and url in res.output, res.output
    res = CliRunner().invoke(main, ["send-ticks", "--service-url", url, "--tick-topic", "t", "--count", "0"])
    assert res.exit_code == 2 and "--count" in res.output, res.output
