"""Shared fixtures: a real embedded broker on a free loopback port."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pulsar_lifecycle.runtime.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

pytest_plugins = ["spark_fixtures", "deletion_support"]


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
    import uuid

    return f"{request.node.name.replace('[', '-').replace(']', '')[:40]}-{uuid.uuid4().hex[:8]}"
