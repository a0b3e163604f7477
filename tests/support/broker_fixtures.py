"""Broker fixtures (registered by tests/conftest.py): real brokers on free loopback ports.

`broker` and `fresh_broker` are parametrized over the broker kinds of this run: `lite`
(pulsar-lite, the embedded broker) and `pulsar` (a real Apache Pulsar standalone resolved from
Maven Central: runtime/pulsar_standalone.py). `TEST_BROKERS=lite` (or `pulsar`) narrows a run;
CI runs both (real Pulsar on PULSAR_SUITE and every crash test; TEST_PULSAR_ALL=1 on everything).
A test that cannot run on one kind says why with
`@pytest.mark.lite_only("reason")` or `@pytest.mark.pulsar_only("reason")`; the parameter is then
skipped with that reason. `pulsar_factory` starts standalones of a test's own (other trackers,
broker de-duplication, restarts) and stops them when the test ends.
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator, List

import pytest

from pulsar_lifecycle.runtime.broker import EmbeddedBroker
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone

BROKER_KINDS = ("lite", "pulsar")


def broker_kinds() -> List[str]:
    """The broker kinds this run covers (TEST_BROKERS, default: both)."""
    raw = os.environ.get("TEST_BROKERS", ",".join(BROKER_KINDS))
    kinds = [k.strip() for k in raw.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in BROKER_KINDS]
    if unknown:
        raise pytest.UsageError(f"TEST_BROKERS names unknown broker kinds {unknown}; use {', '.join(BROKER_KINDS)}")
    return kinds


def kind_of(broker: Any) -> str:
    """`lite` or `pulsar`: which kind of broker a fixture gave."""
    return "pulsar" if isinstance(broker, PulsarStandalone) else "lite"


# The integration modules that also run on real Pulsar in the default run: every function's
# end-to-end tests, the de-duplication, state and deletion proofs and the pulsar-lite workaround
# evidence. Every crash test runs on both. The other integration modules (CLI argument handling,
# console output, `up`, `inspect`, `delayed`, export, benchmark smoke runs) exercise the same
# client paths on pulsar-lite only, so that the suite stays under 30 minutes on 2 cores;
# TEST_PULSAR_ALL=1 runs them on real Pulsar too.
PULSAR_SUITE = frozenset({
    "test_broker_quirks", "test_bucket_writer", "test_bucket_writer_clock", "test_cancel_outcome", "test_dedup_publisher",
    "test_delay_level_function", "test_delay_level_syncer", "test_deletion_cli", "test_deletion_real_pulsar",
    "test_deletion_worker", "test_demo", "test_deploy_example", "test_index_identity", "test_localrun",
    "test_pulsar_localrun",
    "test_snapshot_two_phase_deletion", "test_table_service_real_pulsar", "test_writer_paced_start",
    "test_writer_partitions", "test_writer_wake",
})


def _kinds_for(metafunc: pytest.Metafunc) -> List[str]:
    kinds = broker_kinds()
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    in_suite = (module in PULSAR_SUITE or "crash" in metafunc.module.__name__.split(".")
                or metafunc.definition.get_closest_marker("pulsar_only") is not None)
    if "pulsar" in kinds and not in_suite and not os.environ.get("TEST_PULSAR_ALL"):
        kinds = [k for k in kinds if k != "pulsar"]
    return kinds


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name in ("broker", "fresh_broker"):
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, _kinds_for(metafunc), indirect=True)


def _skip_unless_runs_on(request: pytest.FixtureRequest, kind: str) -> None:
    other = {"lite": "pulsar_only", "pulsar": "lite_only"}[kind]
    marker = request.node.get_closest_marker(other)
    if marker is not None:
        reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
        pytest.skip(f"not on {kind}: {reason}")


@pytest.fixture(scope="session")
def lite_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One pulsar-lite per test session; tests use unique topic names."""
    b = EmbeddedBroker(data_dir=tmp_path_factory.mktemp("broker"), log_level=os.environ.get("TEST_BROKER_LOG_LEVEL", "warn"))
    b.start()
    yield b
    b.stop(remove_data=not os.environ.get("TEST_KEEP_BROKER_DATA"))


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarStandalone]:
    """One real Apache Pulsar standalone per test session (InMemory tracker, no broker dedup)."""
    p = PulsarStandalone(data_dir=tmp_path_factory.mktemp("pulsar"), log_level=os.environ.get("TEST_PULSAR_LOG_LEVEL", "warn"))
    p.start()
    yield p
    p.stop(remove_data=not os.environ.get("TEST_KEEP_BROKER_DATA"))


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Any:
    """The session's broker of the parametrized kind."""
    kind = request.param
    _skip_unless_runs_on(request, kind)
    return request.getfixturevalue(f"{kind}_broker")


@pytest.fixture
def fresh_broker(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """A broker of the test's own (for restarts and kills), of the parametrized kind."""
    kind = request.param
    _skip_unless_runs_on(request, kind)
    b: Any = EmbeddedBroker(data_dir=tmp_path / "broker") if kind == "lite" else PulsarStandalone(data_dir=tmp_path / "pulsar")
    b.start()
    yield b
    b.stop(remove_data=True)


@pytest.fixture
def pulsar_factory(tmp_path: Any) -> Iterator[Callable[..., PulsarStandalone]]:
    """Start real standalones with PulsarStandalone's options; all stopped when the test ends."""
    started: List[PulsarStandalone] = []

    def make(**kwargs: Any) -> PulsarStandalone:
        kwargs.setdefault("data_dir", tmp_path / f"pulsar-{len(started)}")
        p = PulsarStandalone(**kwargs)
        started.append(p)
        return p.start()

    yield make
    for p in started:
        p.stop(remove_data=True)


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A topic-name-safe unique suffix for this test."""
    return f"{request.node.name.replace('[', '-').replace(']', '')[:40]}-{uuid.uuid4().hex[:8]}"
