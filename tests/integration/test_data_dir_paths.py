"""One directory, one state: relative and absolute spellings of a --data-dir (and of the other
paths a user gives) reach the same broker store, function state and files, from any working
directory; an older version's nested broker store is moved into place or, beside a second one,
named in an error. And the embedded broker keeps its port across restarts of one data dir.

Every test starts a run with a relative path, restarts with the absolute one from another working
directory, and looks for what the first run stored (on the embedded broker: these paths are
local-run ones).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import List

import pulsar
import pytest

from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config
from pulsar_lifecycle.delaylevel.producer import DelayLevelProducer
from pulsar_lifecycle.runtime.broker import BrokerError, EmbeddedBroker, find_binary, free_port, port_open
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.timing import DelayedProducer
from support.cli import CLI, assert_one_line_error, cli_env, run_cli, run_json
from support.helpers import stop_process, wait_for
from support.paths import REPO

CONFIGS = REPO / "function-configs"
BROKER_LINE = re.compile(r"^broker (pulsar://\S+);")
RUNNING_LINE = re.compile(r"^running \S+ \(\S+\) on (pulsar://\S+);")


def _stores(data_dir: Path) -> List[Path]:
    return sorted(p for p in data_dir.rglob("pulsar-lite.rocksdb") if p.is_dir())


def _send(url: str, topic: str, payload: bytes) -> None:
    client = quiet_client(url)
    try:
        producer = client.create_producer(topic)
        producer.send(payload)
        producer.close()
    finally:
        client.close()


def _read_all(url: str, topic: str, expect: int, timeout_ms: int = 3000) -> List[bytes]:
    """What a Reader from the earliest message gets (stops after `expect` or a quiet `timeout_ms`)."""
    client = quiet_client(url)
    got: List[bytes] = []
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        try:
            while len(got) < expect:
                try:
                    got.append(reader.read_next(timeout_ms).data())
                except pulsar.Timeout:
                    break
        finally:
            reader.close()
    finally:
        client.close()
    return got


def _old_version_store(data_dir_spelled: str, cwd: Path, topic: str, payload: bytes) -> None:
    """A broker store as versions before this fix left it: pulsar-lite started with its data dir
    as working directory and the relative --db-path `<data dir as spelled>/pulsar-lite.db`, so the
    store is nested inside the data dir. One message is stored in it."""
    data_dir = cwd / data_dir_spelled
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(data_dir / "old-version.log", "ab")
    proc = subprocess.Popen([str(find_binary()), "--addr", f"127.0.0.1:{port}", "--db-path",
                             f"{data_dir_spelled}/pulsar-lite.db", "--log-level", "warn"], cwd=data_dir,
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: port_open("127.0.0.1", port), timeout=15), "old-style broker did not start"
        _send(f"pulsar://127.0.0.1:{port}", topic, payload)
    finally:
        stop_process(proc, signal.SIGTERM, timeout=15)
        log.close()
    assert (data_dir / data_dir_spelled / "pulsar-lite.rocksdb").is_dir()


def test_embedded_broker_relative_then_absolute_from_elsewhere(tmp_path, monkeypatch, unique):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    topic = f"persistent://public/default/paths-{unique}"
    monkeypatch.chdir(tmp_path / "a")
    first = EmbeddedBroker(data_dir=Path("data/broker")).start()
    try:
        _send(first.service_url, topic, b"stored")
    finally:
        first.stop(remove_data=False)
    monkeypatch.chdir(tmp_path / "b")
    second = EmbeddedBroker(data_dir=tmp_path / "a" / "data" / "broker").start()
    try:
        assert second.port == first.port  # the port this data dir last ran on
        assert _read_all(second.service_url, topic, 1) == [b"stored"]
    finally:
        second.stop(remove_data=False)
    assert _stores(tmp_path / "a") == [tmp_path / "a" / "data" / "broker" / "pulsar-lite.rocksdb"]


def test_an_older_versions_nested_store_is_moved_into_place(tmp_path, unique):
    topic = f"persistent://public/default/nested-{unique}"
    _old_version_store(".pulsar-lifecycle/broker", tmp_path, topic, b"from the old version")
    data_dir = tmp_path / ".pulsar-lifecycle" / "broker"
    broker = EmbeddedBroker(data_dir=data_dir).start()
    try:
        assert _read_all(broker.service_url, topic, 1) == [b"from the old version"]
    finally:
        broker.stop(remove_data=False)
    assert _stores(tmp_path) == [data_dir / "pulsar-lite.rocksdb"]
    assert not (data_dir / ".pulsar-lifecycle").exists()  # the emptied nested directories are gone


def test_two_broker_stores_in_one_data_dir_are_named_and_nothing_starts(tmp_path, unique):
    topic = f"persistent://public/default/two-{unique}"
    data_dir = tmp_path / ".pulsar-lifecycle" / "broker"
    current = EmbeddedBroker(data_dir=data_dir).start()
    _send(current.service_url, topic, b"current")
    current.stop(remove_data=False)
    _old_version_store(".pulsar-lifecycle/broker", tmp_path, topic, b"old")
    nested = data_dir / ".pulsar-lifecycle" / "broker" / "pulsar-lite.rocksdb"
    before = _stores(tmp_path)
    assert before == sorted([data_dir / "pulsar-lite.rocksdb", nested])
    refused = EmbeddedBroker(data_dir=data_dir)
    try:
        with pytest.raises(BrokerError) as err:
            refused.start()
    finally:
        refused.stop(remove_data=False)  # a start that wrongly succeeded leaves no broker behind
    text = str(err.value)
    assert str(data_dir / "pulsar-lite.rocksdb") in text and str(nested) in text, text
    assert "Nothing was started" in text and "mv " in text, text
    assert _stores(tmp_path) == before  # nothing moved


def _up(cwd: Path, tmp_path: Path, *args: str) -> "tuple[subprocess.Popen, List[str]]":
    lines: List[str] = []
    proc = subprocess.Popen([*CLI, "up", "--config-dir", str(CONFIGS), "--refresh", "0.5", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=cli_env(tmp_path))

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def _printed(proc: subprocess.Popen, lines: List[str], pattern: "re.Pattern[str]", timeout: float = 120) -> str:
    found: List[str] = []

    def seen() -> bool:
        found.extend(m.group(1) for m in map(pattern.match, lines) if m)
        assert proc.poll() is None, (proc.returncode, lines, proc.stderr.read() if proc.stderr else "")
        return bool(found)
    assert wait_for(seen, timeout=timeout, interval=0.2), lines
    return found[0]


def _park(url: str, business: str, count: int) -> None:
    """`count` messages parked 2 days ahead (more than the shipped syncer's one-day unit, so they stay
    in a delay-level partition) through the DelayLevelProducer."""
    syncer = spec_from_config(load_function_config(CONFIGS / "delay-level-syncer.yaml")).user_config
    client = quiet_client(url)
    try:
        producer = DelayLevelProducer(client, business, DelayedProducer(client, scheduling_topic=syncer["schedulingTopic"]),
                                      delay_level_topic=syncer["delayLevelTopic"])
        for i in range(count):
            producer.send(f"parked-{i}".encode(), delay_ms=2 * 86_400_000)
        producer.flush()
        producer.close()
    finally:
        client.close()


def _inspect(cwd: Path, tmp_path: Path, url: str, data_dir: str) -> "tuple[int, int]":
    """(syncer parked, writer pending) as `inspect` reports them, run from `cwd` with `data_dir` as spelled."""
    syncer = run_json("inspect", "syncer", "--service-url", url, "--function-config-file",
                      str(CONFIGS / "delay-level-syncer.yaml"), "--data-dir", data_dir, "--json",
                      tmp_path=tmp_path, cwd=cwd)
    writer = run_json("inspect", "writer", "--function-config-file", str(CONFIGS / "bucket-snapshot-writer.yaml"),
                      "--data-dir", data_dir, "--json", tmp_path=tmp_path, cwd=cwd)
    return sum(p["parked"] or 0 for p in syncer["partitions"]), writer["pending"]


@pytest.mark.lite_only("up starts its own embedded broker")
def test_up_relative_then_absolute_data_dir_keeps_broker_store_and_port(broker, tmp_path, unique):
    """The first-hour repro: `up` on the default (relative) data dir, two messages parked 2 days
    ahead and one in the writer's index; Ctrl-C; `up --data-dir $PWD/.pulsar-lifecycle` from another
    directory: the same broker store (still 2 parked), the same index, the same URL."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    proc, lines = _up(a, tmp_path)
    try:
        url = _printed(proc, lines, BROKER_LINE)
        _park(url, f"persistent://public/default/paths-up-{unique}", 2)
        res = run_cli("delayed", "send", f"persistent://public/default/paths-up-{unique}", "later", "--in", "2h",
                      "--writer-config", str(CONFIGS / "bucket-snapshot-writer.yaml"), "--service-url", url,
                      tmp_path=tmp_path, cwd=a)
        assert res.returncode == 0, res.stderr[-2000:]
        assert wait_for(lambda: _inspect(a, tmp_path, url, ".pulsar-lifecycle") == (2, 1), timeout=60, interval=1), \
            _inspect(a, tmp_path, url, ".pulsar-lifecycle")
    finally:
        assert stop_process(proc, signal.SIGINT, timeout=60) == 0
    data_dir = a / ".pulsar-lifecycle"
    proc, lines = _up(b, tmp_path, "--data-dir", str(data_dir))
    try:
        again = _printed(proc, lines, BROKER_LINE)
        assert again == url  # the port is kept across restarts of one data dir
        assert _inspect(b, tmp_path, again, str(data_dir)) == (2, 1)
    finally:
        assert stop_process(proc, signal.SIGINT, timeout=60) == 0
    assert _stores(data_dir) == [data_dir / "broker" / "pulsar-lite.rocksdb"]


def _localrun(cwd: Path, tmp_path: Path, data_dir: str, fn: Path) -> "tuple[subprocess.Popen, str]":
    proc = subprocess.Popen([*CLI, "localrun", "--function-config-file", str(fn), "--data-dir", data_dir], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=cli_env(tmp_path))
    lines: List[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
    threading.Thread(target=read, daemon=True).start()
    return proc, _printed(proc, lines, RUNNING_LINE, timeout=60)


def test_localrun_relative_then_absolute_data_dir(tmp_path, unique):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    ns = "persistent://public/default"
    cfg = (CONFIGS / "example-function.yaml").read_text()
    spec = spec_from_config(load_function_config(CONFIGS / "example-function.yaml"))
    fn = tmp_path / "example.yaml"
    fn.write_text(cfg.replace(spec.inputs[0], f"{ns}/paths-in-{unique}").replace(spec.output, f"{ns}/paths-out-{unique}"))
    proc, url = _localrun(a, tmp_path, "local", fn)
    try:
        _send(url, f"{ns}/paths-in-{unique}", b"one")
        assert wait_for(lambda: len(_read_all(url, f"{ns}/paths-out-{unique}", 1, 500)) == 1, timeout=60)
    finally:
        assert stop_process(proc, signal.SIGINT, timeout=60) == 0
    proc, again = _localrun(b, tmp_path, str(a / "local"), fn)
    try:
        assert again == url
        _send(again, f"{ns}/paths-in-{unique}", b"two")
        assert wait_for(lambda: len(_read_all(again, f"{ns}/paths-out-{unique}", 2, 500)) == 2, timeout=60)
        # the first run's output is in this store, and its input was not processed again
        assert _read_all(again, f"{ns}/paths-out-{unique}", 3, 1000) == [b"one!", b"two!"]
    finally:
        assert stop_process(proc, signal.SIGINT, timeout=60) == 0
    assert _stores(a / "local") == [a / "local" / "broker" / "pulsar-lite.rocksdb"]


def test_export_backlog_relative_then_absolute_out(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    jobs = a / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"deliver_at": 4_000_000_000_000 + i, "payload": f"job-{i}"}) + "\n"
                            for i in range(3)))
    first = run_cli("export-backlog", "--from-jobs", "jobs.jsonl", "--dataset-id", "1", "--out", "backlog",
                    tmp_path=tmp_path, cwd=a)
    assert first.returncode == 0 and "exported 3 messages" in first.stdout, first.stdout + first.stderr
    second = run_cli("export-backlog", "--from-jobs", str(jobs), "--dataset-id", "1", "--out", str(a / "backlog"),
                     tmp_path=tmp_path, cwd=b)
    assert second.returncode == 0 and "exported 0 messages" in second.stdout, second.stdout + second.stderr
    assert "3 already exported" in second.stdout, second.stdout
    assert not (b / "backlog").exists()


def _closed_port() -> int:
    port = free_port()
    assert not port_open("127.0.0.1", port)
    return port


@pytest.mark.parametrize("command", [
    ["send-ticks", "--tick-topic", "persistent://public/default/t"],
    ["inspect", "deletion"],
    ["delayed", "send", "persistent://public/default/t", "x", "--in", "1m", "--scheduling-topic",
     "persistent://public/default/s"],
    ["deletion", "dlq", "list"],
], ids=["send-ticks", "inspect", "delayed", "deletion"])
def test_a_refused_connection_fails_at_once_with_what_to_do(tmp_path, command):
    """A stale URL (an `up` restarted on another port, a typo): the default --connect-timeout is
    30 s, and a refused connection must not wait it out."""
    url = f"pulsar://127.0.0.1:{_closed_port()}"
    res = run_cli(*command, "--service-url", url, tmp_path=tmp_path, cwd=REPO, timeout=25)
    assert_one_line_error(res, url, "refused", "--embedded-broker-port")


def test_up_on_a_taken_port_names_its_holder_at_once(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        res = run_cli("up", "--config-dir", str(CONFIGS), "--embedded-broker-port", str(port), "--data-dir",
                      str(tmp_path / "d"), "--run-seconds", "1", tmp_path=tmp_path, timeout=10)
    assert_one_line_error(res, f"127.0.0.1:{port} is taken by process {os.getpid()}", "--embedded-broker-port")


def test_a_remembered_port_taken_meanwhile_is_given_up_for_a_free_one(tmp_path):
    import socket

    first = EmbeddedBroker(data_dir=tmp_path / "broker").start()
    port = first.port
    first.stop(remove_data=False)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        second = EmbeddedBroker(data_dir=tmp_path / "broker").start()
        try:
            assert second.port != port
            assert second.port_changed is not None and second.port_changed[0] == port
            assert f"process {os.getpid()}" in second.port_changed[1]
        finally:
            second.stop(remove_data=False)
    third = EmbeddedBroker(data_dir=tmp_path / "broker").start()  # the new port is the one kept now
    try:
        assert third.port == second.port
    finally:
        third.stop(remove_data=False)


def test_the_previous_broker_of_the_data_dir_on_the_port_is_waited_for(tmp_path):
    """After a crash the previous run's broker holds the port (and the store) for its grace period:
    a restart on the same port waits for it instead of refusing the port as taken."""
    previous = EmbeddedBroker(data_dir=tmp_path / "broker").start()
    port = previous.port
    stopper = threading.Timer(1.0, lambda: previous.stop(remove_data=False))
    stopper.start()
    restarted = EmbeddedBroker(data_dir=tmp_path / "broker", port=port)
    try:
        restarted.start(wait_for_previous=15)
        assert restarted.port == port
    finally:
        stopper.join()
        restarted.stop(remove_data=False)
