"""`pulsar-lifecycle delayed send|cancel` against a running writer, and the arguments it refuses
before it connects to anything."""
from __future__ import annotations

import time

import pulsar
import pytest

from pulsar_lifecycle.config.function_config import spec_from_config
from pulsar_lifecycle.runtime.broker import free_port
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from support.cli import assert_no_client_log_lines, assert_one_line_error, run_cli
from support.helpers import receive_until
from support.paths import REPO
from support.writer import cli_writer_config


def test_send_and_cancel_through_a_running_writer(broker, tmp_path, unique):
    cfg = cli_writer_config(tmp_path, unique)
    runner = LocalRunner(spec_from_config(cfg), LocalRunOptions(broker_service_url=broker.service_url,
                                                                data_dir=tmp_path / "data")).start()
    target = f"persistent://public/default/orders-{unique}"
    client = quiet_client(broker.service_url)
    consumer = client.subscribe(target, "check", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    common = ["--service-url", broker.service_url, "--writer-config", str(tmp_path / "writer.yaml")]
    try:
        ids = {}
        (tmp_path / "payload.bin").write_bytes(b"\x00binary\xff")
        for name, extra in (("drop", ["drop", "--in", "8s"]),
                            ("keep-1", ["keep-1", "--in", "2s", "--key", "k1", "-p", "tenant=a", "-p", "n=1"]),
                            ("keep-2", ["--file", str(tmp_path / "payload.bin"), "--in", "2s"])):
            res = run_cli("delayed", "send", target, *extra, *common, tmp_path=tmp_path)
            assert res.returncode == 0, res.stderr[-2000:]
            assert_no_client_log_lines(res)
            ids[name] = res.stdout.strip()
            assert "delayed cancel" in res.stderr
            if name == "drop":
                dropped_at = time.monotonic() + 8
                res = run_cli("delayed", "cancel", ids["drop"], *common, tmp_path=tmp_path)
                assert res.returncode == 0 and "cancelled" in res.stdout, res.stderr[-2000:]
        got = receive_until(consumer, 60, lambda got: len(got) >= 2)
        assert len(got) == 2, [m.data() for m in got]
        # give the cancelled message its turn and some more: it must not come
        got += receive_until(consumer, max(0.0, dropped_at - time.monotonic()) + 4, lambda _got: False)
        by_payload = {m.data(): m for m in got}
        assert sorted(by_payload) == [b"\x00binary\xff", b"keep-1"], sorted(by_payload)
        first = by_payload[b"keep-1"]
        assert first.partition_key() == "k1"
        assert first.properties()["tenant"] == "a" and first.properties()["n"] == "1"
    finally:
        consumer.close()
        client.close()
        runner.stop()


@pytest.mark.parametrize("args, needles", [
    (["t", "x", "--in", "-5s"], ["--in", "negative"]),
    (["t", "x", "--in", "500d"], ["--in", "maxDelaySeconds"]),
    (["t", "x", "--in", "soon"], ["--in", "not a duration"]),
    (["t", "x", "--at", "2001-01-01T00:00:00Z"], ["--at", "in the past"]),
    (["t", "x", "--at", "tomorrow"], ["--at", "ISO 8601"]),
    (["bad tenant!/ns/t", "x", "--in", "1s"], ["TOPIC", "invalid tenant"]),
    (["a/b", "x", "--in", "1s"], ["TOPIC"]),
    (["persistent://other/ns/t", "x", "--in", "1s"], ["TOPIC", "allowedTargetPrefix"]),
    (["t", "x", "--in", "1s", "--at", "1"], ["exactly one of --at"]),
    (["t", "--in", "1s"], ["payload"]),
    (["t", "x", "--in", "1s", "-p", "__pl_target__=x"], ["--property", "__pl_"]),
    (["t", "x", "--in", "1s", "-p", "novalue"], ["--property", "key=value"]),
])
def test_send_refuses_bad_arguments_before_connecting(tmp_path, args, needles):
    # Nothing listens at the URL: an argument checked after connecting would fail on the broker
    # (after the 30 s connect timeout) instead of on the argument.
    dead = f"pulsar://127.0.0.1:{free_port()}"
    assert_one_line_error(run_cli("delayed", "send", *args, "--service-url", dead, tmp_path=tmp_path, cwd=REPO),
                          *needles)


def test_cancel_refuses_a_bad_id_and_a_missing_writer_before_connecting(tmp_path, silent_broker):
    dead = f"pulsar://127.0.0.1:{free_port()}"
    assert_one_line_error(run_cli("delayed", "cancel", "12-3", "--service-url", dead, tmp_path=tmp_path, cwd=REPO),
                          "ID", "12-3")
    assert_one_line_error(run_cli("delayed", "cancel", "12:3:0@x", "--service-url", dead, tmp_path=tmp_path, cwd=REPO),
                          "partition")
    assert_one_line_error(run_cli("delayed", "cancel", "12:3", "--service-url", dead, tmp_path=tmp_path),
                          "--scheduling-topic")  # no writer config in tmp_path, none given
    assert_one_line_error(run_cli("delayed", "send", "t", "x", "--in", "1s", "--service-url", silent_broker.url,
                                  "--connect-timeout", "2", tmp_path=tmp_path, cwd=REPO),
                          silent_broker.url, "did not answer")
