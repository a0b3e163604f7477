"""A healthy start and a clean stop of the shipped set say nothing at WARNING or above on real
Apache Pulsar too: `up` of function-configs/ as shipped with --broker-service-url on a brand-new
standalone (nothing on its tick topics, no topic of the set created yet); the first delayed
message ever sent is released, another is left pending, and SIGINT stops it. Neither the console
nor the log has a WARNING or ERROR line (test_healthy_start_quiet.py does the same on pulsar-lite;
test_pulsar_localrun.py checks the writer's instance log under Pulsar's own local runner).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from integration.test_healthy_start_quiet import _run_up, alarms
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from support.broker_fixtures import broker_kinds

REASON = "starts a brand-new Apache Pulsar standalone of its own"
pytestmark = [pytest.mark.integration, pytest.mark.pulsar_only(REASON),
              pytest.mark.skipif("pulsar" not in broker_kinds(), reason=f"not on lite: {REASON}")]


@pytest.mark.timeout(300)
def test_up_on_a_brand_new_pulsar_standalone_starts_and_stops_without_a_warning(
        tmp_path: Path, pulsar_factory: Callable[..., PulsarStandalone]) -> None:
    standalone = pulsar_factory()
    texts = _run_up(tmp_path, standalone.service_url)
    assert alarms(*texts) == []
