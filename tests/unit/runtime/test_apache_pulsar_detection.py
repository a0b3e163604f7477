"""is_apache_pulsar: the broker behind a local service URL, told from /proc without a round trip,
and the consumer-id skip it turns off (only pulsar-lite keeps a dead process's consumers)."""
from __future__ import annotations

import os
from pathlib import Path

from pulsar_lifecycle.pulsar_io.subscribe import skip_consumer_ids
from pulsar_lifecycle.runtime.broker import is_apache_pulsar

JAVA = ["/usr/lib/jvm/java-17/bin/java", "-Xmx2g", "-cp", "/pulsar/lib/*", "org.apache.pulsar.PulsarStandaloneStarter",
        "--config", "/pulsar/conf/standalone.conf"]
LITE = ["/home/u/.cache/pulsar-lifecycle/pulsar-lite", "--addr", "127.0.0.1:6650", "--db-path", "/d/pulsar-lite.db"]


def fake_proc(tmp_path: Path, port: int, argv) -> Path:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 424242 1\n"
    (proc / "net" / "tcp").write_text(header + row)
    (proc / "net" / "tcp6").write_text(header)
    fd = proc / "4321" / "fd"
    fd.mkdir(parents=True)
    os.symlink("socket:[424242]", fd / "7")
    (proc / "4321" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return proc


def test_a_local_pulsar_jvm_is_apache_pulsar(tmp_path):
    proc = fake_proc(tmp_path, 6650, JAVA)
    assert is_apache_pulsar("pulsar://localhost:6650", proc)
    assert is_apache_pulsar("pulsar://127.0.0.1:6650/", proc)


def test_pulsar_lite_a_remote_host_an_unknown_listener_and_no_url_are_not(tmp_path):
    assert not is_apache_pulsar("pulsar://localhost:6650", fake_proc(tmp_path / "lite", 6650, LITE))
    java = fake_proc(tmp_path / "java", 6650, JAVA)
    assert not is_apache_pulsar("pulsar://broker.example.com:6650", java)  # remote: cannot be told
    assert not is_apache_pulsar("pulsar://localhost:6651", java)  # nothing seen listening there
    assert not is_apache_pulsar("pulsar://localhost:6650,broker.example.com:6650", java)
    assert not is_apache_pulsar(None, java) and not is_apache_pulsar("", java)


class _NoSubscribe:
    def subscribe(self, *args, **kwargs):  # pragma: no cover - must not be reached
        raise AssertionError("the skip subscribed on Apache Pulsar")


def test_no_consumer_id_skip_on_apache_pulsar(caplog):
    caplog.set_level("INFO")
    assert skip_consumer_ids(_NoSubscribe(), 500, "non-persistent://t/n/ids", apache_pulsar=True) == 0  # type: ignore[arg-type]
    assert "event=consumer_ids_skip_not_needed" in caplog.text
