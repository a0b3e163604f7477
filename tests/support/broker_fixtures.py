"""Broker fixtures (registered by tests/conftest.py): a real embedded broker on a free loopback port."""
from __future__ import annotations

import os
import uuid

import pytest

from pulsar_lifecycle.runtime.broker import EmbeddedBroker


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One pulsar-lite per test session; tests use unique topic names."""
    b = EmbeddedBroker(data_dir=tmp_path_factory.mktemp("broker"), log_level=os.environ.get("TEST_BROKER_LOG_LEVEL", "warn"))
    b.start()
    yield b
    b.stop(remove_data=not os.environ.get("TEST_KEEP_BROKER_DATA"))


@pytest.fixture
def fresh_broker(tmp_path):
    """A broker of the test's own (for restarts and kills)."""
    b = EmbeddedBroker(data_dir=tmp_path / "broker")
    b.start()
    yield b
    b.stop(remove_data=True)


@pytest.fixture
def unique(request):
    """A topic-name-safe unique suffix for this test."""
    return f"{request.node.name.replace('[', '-').replace(']', '')[:40]}-{uuid.uuid4().hex[:8]}"
