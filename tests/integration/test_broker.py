"""The embedded broker adapter: start, restart with data, and clear errors."""
from __future__ import annotations

import os
import stat

import pytest

from pulsar_lifecycle.runtime.broker import BrokerError, EmbeddedBroker, port_open
from pulsar_lifecycle.runtime.client import quiet_client
from support.paths import REPO

pytestmark = pytest.mark.integration


def test_restart_keeps_data_and_config_is_loopback_only(tmp_path):
    b = EmbeddedBroker(data_dir=tmp_path / "b").start()
    try:
        cfg = (tmp_path / "b" / "pulsar-lite.toml").read_text()
        assert "enabled = false" in cfg and "default_partitions = 0" in cfg and "0.0.0.0" not in cfg
        client = quiet_client(b.service_url)
        client.create_producer("persistent://public/default/keep").send(b"kept")
        client.close()
        b.restart()
        client = quiet_client(b.service_url)
        reader = client.create_reader("persistent://public/default/keep", __import__("pulsar").MessageId.earliest)
        assert reader.read_next(timeout_millis=5000).data() == b"kept"
        client.close()
    finally:
        b.stop()
    assert not port_open("127.0.0.1", b.port)
    assert (tmp_path / "b" / "pulsar-lite.db.metadata.json").exists() or any((tmp_path / "b").iterdir())


def test_metrics_listener_binds_loopback_when_enabled(tmp_path):
    from pulsar_lifecycle.runtime.broker import free_port

    mport = free_port()
    with EmbeddedBroker(data_dir=tmp_path / "m", metrics_port=mport) as b:
        assert f'addr = "127.0.0.1:{mport}"' in (tmp_path / "m" / "pulsar-lite.toml").read_text()
        assert b.pid is not None


def test_locked_data_directory_is_reported(tmp_path):
    with EmbeddedBroker(data_dir=tmp_path / "x"):
        with pytest.raises(BrokerError, match="locked by another broker"):
            EmbeddedBroker(data_dir=tmp_path / "x").start()


def test_missing_binary_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_LITE_BINARY", str(tmp_path / "nope"))
    with pytest.raises(BrokerError, match="does not exist"):
        EmbeddedBroker(data_dir=tmp_path / "y").start()


def test_port_that_never_opens_is_reported(tmp_path, monkeypatch):
    fake = tmp_path / "fake-broker"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PULSAR_LITE_BINARY", str(fake))
    b = EmbeddedBroker(data_dir=tmp_path / "z", start_timeout=1.0)
    with pytest.raises(BrokerError, match="did not open"):
        b.start()
    assert b.pid is None  # stopped by its own PID


def test_broker_that_exits_at_once_is_reported(tmp_path, monkeypatch):
    fake = tmp_path / "crashing-broker"
    fake.write_text("#!/bin/sh\necho 'boom: bad config' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PULSAR_LITE_BINARY", str(fake))
    with pytest.raises(BrokerError, match="rc=3.*boom"):
        EmbeddedBroker(data_dir=tmp_path / "w").start()


def test_localrun_with_unreachable_broker_fails_clearly(tmp_path):
    import subprocess
    import sys

    from pulsar_lifecycle.runtime.broker import free_port

    cfg = REPO / "function-configs" / "example-function.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "ERROR", "localrun", "--function-config-file",
         str(cfg), "--broker-service-url", f"pulsar://127.0.0.1:{free_port()}", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )
    assert proc.returncode == 1
    assert "cannot start public/default/example-function" in proc.stderr
    # Nothing listens there: the connection is refused all along, and the error says so.
    assert "no broker at pulsar://127.0.0.1:" in proc.stderr and "refused the connection" in proc.stderr
