"""Crash tests on both broker kinds: where their `pulsar-lifecycle localrun` processes meet a
broker, the admin REST calls they make on real Pulsar, and how they count what was released.

On pulsar-lite each `localrun` owns an embedded broker (`--embedded-broker-port`) that dies with
it: a separate pulsar-lite keeps a SIGKILLed client's consumers, and their unacked messages,
registered until it restarts (docs/operations.md). On real Pulsar the function processes are
SIGKILLed and the broker lives on, as on a cluster (`--broker-service-url`): the session's
standalone, or a test's own from `pulsar_factory` when it needs broker options or restarts.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import pulsar
import pytest
import requests

from pulsar_lifecycle.runtime.broker import free_port, port_open
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, RELEASED_AT_PROP
from pulsar_lifecycle.timing import now_ms
from pulsar_lifecycle.topics import TopicName
from support.helpers import wait_for

MessageIds = Set[Tuple[int, int, int]]


@dataclass
class CrashBroker:
    """The broker a crash test's function processes use: with `embedded_port`, pulsar-lite owned
    by each `localrun` (it dies and restarts with it); otherwise the broker at `service_url`,
    which outlives them (a real Pulsar `standalone`, or a pulsar-lite the test runs itself)."""

    kind: str
    service_url: str
    standalone: Optional[PulsarStandalone] = None
    embedded_port: int = 0

    @property
    def admin_url(self) -> str:
        """Real Pulsar's admin REST API (pulsar-lite has none)."""
        if self.standalone is None:
            raise AssertionError("pulsar-lite has no admin REST API")
        return self.standalone.admin_url

    def localrun_args(self) -> List[str]:
        """The `localrun` options that reach this broker."""
        if self.embedded_port:
            return ["--embedded-broker-port", str(self.embedded_port)]
        return ["--broker-service-url", self.service_url]


def crash_broker(request: pytest.FixtureRequest, kind: str, **pulsar_options: Any) -> CrashBroker:
    """The broker of kind `kind` ("lite" or "pulsar", a test's parameter over `broker_kinds()`).

    Honours `lite_only` / `pulsar_only` as the `broker` fixture does (the parameter is skipped with
    the marker's reason). Real Pulsar: the session's standalone, or with `pulsar_options` a
    standalone of the test's own (`pulsar_factory`, e.g. `deduplication=True`)."""
    other = {"lite": "pulsar_only", "pulsar": "lite_only"}[kind]
    marker = request.node.get_closest_marker(other)
    if marker is not None:
        pytest.skip(f"not on {kind}: {marker.args[0] if marker.args else marker.kwargs.get('reason', '')}")
    if kind == "lite":
        port = free_port()
        return CrashBroker("lite", f"pulsar://127.0.0.1:{port}", embedded_port=port)
    standalone = (request.getfixturevalue("pulsar_factory")(**pulsar_options) if pulsar_options
                  else request.getfixturevalue("pulsar_broker"))
    return CrashBroker("pulsar", standalone.service_url, standalone=standalone)


def start_localrun(config: Path, broker: CrashBroker, data_dir: Path, log: Path, *extra: str,
                   log_level: str = "WARNING", cwd: Optional[Path] = None) -> "subprocess.Popen[bytes]":
    """`pulsar-lifecycle localrun` of `config` on `broker`, its stderr appended to `log`; on
    pulsar-lite returns once its embedded broker serves."""
    with open(log, "ab") as err:  # a file: an undrained PIPE would block the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", log_level, "localrun",
             "--function-config-file", str(config), *broker.localrun_args(), "--data-dir", str(data_dir), *extra],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd or log.parent)
    if broker.embedded_port:
        assert wait_for(lambda: port_open("127.0.0.1", broker.embedded_port), timeout=40), log.read_text()[-3000:]
    return proc


def sigkill(proc: "subprocess.Popen[bytes]") -> None:
    """SIGKILL a function process of the test's own and reap it."""
    proc.kill()
    proc.wait(timeout=10)


def stop_all(procs: Iterable["subprocess.Popen[bytes]"], grace_s: float = 30.0) -> None:
    """SIGINT every process (all at once, so their clean stops overlap), then reap each; one not
    gone within `grace_s` is SIGKILLed."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            sigkill(p)


# -- real Pulsar's admin REST API ------------------------------------------------------------------

def _topic_path(topic: str) -> str:
    t = TopicName.from_client(topic)
    return f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/{t.local_name}"


def admin_request(admin_url: str, method: str, topic: str, suffix: str, body: Any = None) -> requests.Response:
    """One call of the admin REST API on `topic` (`suffix` e.g. "/partitions"), JSON body."""
    return requests.request(method, f"{admin_url}{_topic_path(topic)}{suffix}", json=body, timeout=30)


def create_partitioned_topic(admin_url: str, topic: str, partitions: int) -> None:
    """`pulsar-admin topics create-partitioned-topic -p N` through the REST API."""
    res = admin_request(admin_url, "PUT", topic, "/partitions", partitions)
    assert res.status_code == 204, f"PUT {topic}/partitions {partitions}: {res.status_code} {res.text[:300]}"


def grow_partitioned_topic(admin_url: str, topic: str, partitions: int) -> None:
    """`pulsar-admin topics update-partitioned-topic -p N` through the REST API."""
    res = admin_request(admin_url, "POST", topic, "/partitions", partitions)
    assert res.status_code == 204, f"POST {topic}/partitions {partitions}: {res.status_code} {res.text[:300]}"


def partition_count(admin_url: str, topic: str) -> int:
    """The partitioned topic's partition count as the broker's metadata has it (0: not partitioned)."""
    res = admin_request(admin_url, "GET", topic, "/partitions")
    assert res.status_code == 200, f"GET {topic}/partitions: {res.status_code} {res.text[:300]}"
    return int(res.json()["partitions"])


def topic_stats(admin_url: str, topic: str) -> Dict[str, Any]:
    """The topic's stats (`pulsar-admin topics stats`)."""
    res = admin_request(admin_url, "GET", topic, "/stats")
    assert res.status_code == 200, f"GET {topic}/stats: {res.status_code} {res.text[:300]}"
    return dict(res.json())


def wait_subscribed(admin_url: str, topics: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until each topic has a subscription: on real Pulsar a message published to a topic
    without one is nobody's backlog and may be trimmed (a test publishes once its functions have
    subscribed)."""
    def subscribed(topic: str) -> bool:
        res = admin_request(admin_url, "GET", topic, "/stats")
        return res.status_code == 200 and bool(res.json().get("subscriptions"))
    todo = list(topics)
    assert wait_for(lambda: all(subscribed(t) for t in todo), timeout=timeout, interval=0.5), \
        f"not all of {todo} subscribed within {timeout:.0f} s"


# -- counting releases --------------------------------------------------------------------------------

@dataclass
class ReleaseCount:
    """What reached a released topic: payload -> the distinct message ids it came with (a copy on
    the topic has a new id, a redelivery the same one), and the releases that came early."""

    seen: Dict[bytes, MessageIds] = field(default_factory=dict)
    early: List[bytes] = field(default_factory=list)
    on_message: Optional[Callable[[pulsar.Message], None]] = None

    def record(self, m: pulsar.Message) -> None:
        mid = m.message_id()
        self.seen.setdefault(m.data(), set()).add((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
        deliver_at = int(m.properties()[DELIVER_AT_PROP])
        if int(m.properties()[RELEASED_AT_PROP]) < deliver_at or now_ms() < deliver_at:
            self.early.append(m.data())
        if self.on_message is not None:
            self.on_message(m)

    def pump(self, consumer: pulsar.Consumer, seconds: float, until: Optional[int] = None) -> None:
        """Receive and ack for `seconds`, or until `until` distinct payloads were seen."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (until is None or len(self.seen) < until):
            try:
                m = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            self.record(m)
            consumer.acknowledge(m)

    def assert_exactly_once_never_early(self, expected: Iterable[bytes], where: str = "") -> None:
        """Every expected payload released once, nothing else, none early."""
        want = set(expected)
        missing = want - set(self.seen)
        twice = {k: len(ids) for k, ids in self.seen.items() if len(ids) > 1}
        unknown = set(self.seen) - want
        assert not missing, f"{len(missing)} of {len(want)} never released, e.g. {sorted(missing)[:5]}{where}"
        assert not twice, f"{len(twice)} released more than once, e.g. {list(twice.items())[:5]}{where}"
        assert not unknown, f"{len(unknown)} released that were never sent, e.g. {sorted(unknown)[:5]}{where}"
        assert not self.early, f"{len(self.early)} released early, e.g. {self.early[:5]}{where}"
