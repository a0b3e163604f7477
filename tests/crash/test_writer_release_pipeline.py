"""The writer's release pipeline under SIGKILL, on pulsar-lite and on real Apache Pulsar.

The release thread pops and sends the next round while earlier rounds' confirmations are
outstanding (up to `releaseRoundsInFlight` rounds). A SIGKILL then lands with rounds in flight:
sent, maybe stored, not confirmed, beyond the committed release watermark. Bursts of messages due
at the same instant keep several full rounds in flight; a 10 ms commit interval has the watermark
move while they are. Every message must still be released once: the watermark never passes an
unconfirmed round (a lost message otherwise) and the re-released tail is de-duplicated (a double
otherwise). With the watermark committed past unconfirmed rounds this test fails with messages
never released (docs/architecture.md, "Release pipeline").
"""
from __future__ import annotations

import random
from typing import Dict, Tuple

import pytest

from crash.test_bucket_writer_crash import run_with_sigkills, write_config
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP
from pulsar_lifecycle.timing import now_ms
from support.broker_fixtures import broker_kinds
from support.crash_runs import crash_broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# broker kind -> (bursts, messages per burst, spread messages, SIGKILLs)
SIZES: Dict[str, Tuple[int, int, int, int]] = {
    "lite": (6, 4000, 6000, 6),
    "pulsar": (4, 3000, 4000, 4),
}
BURST_EVERY_MS = 3000
FIRST_BURST_MS = 3000


@pytest.mark.parametrize("kind", broker_kinds())
def test_sigkill_with_rounds_in_flight_neither_loses_nor_doubles(request, tmp_path, unique, kind):
    broker = crash_broker(request, kind)
    bursts, per_burst, spread, kills = SIZES[kind]
    # Small rounds, many of them in flight, and a watermark committed every 10 ms.
    config, sched, out = write_config(tmp_path, unique, releaseBatchSize=250, releaseRoundsInFlight=8,
                                      commitIntervalMillis=10)
    rng = random.Random(4242)
    base = now_ms()
    last_burst_ms = FIRST_BURST_MS + (bursts - 1) * BURST_EVERY_MS
    messages: Dict[bytes, Dict[str, str]] = {}
    for b in range(bursts):
        at = str(base + FIRST_BURST_MS + b * BURST_EVERY_MS)  # one instant: a saturated release
        for i in range(per_burst):
            messages[f"b{b}-{i}".encode()] = {DELIVER_AT_PROP: at}
    for i in range(spread):  # paced releases between the bursts
        messages[f"s{i}".encode()] = {DELIVER_AT_PROP: str(base + rng.randint(0, last_burst_ms))}
    # Each kill just after a burst fell due (its rounds being sent and confirmed) plus jitter.
    offsets = sorted(rng.sample(range(bursts), kills) if kills <= bursts else range(bursts))
    kill_times = [(FIRST_BURST_MS + b * BURST_EVERY_MS) / 1000.0 + rng.uniform(0.05, 0.6) for b in offsets]
    tally = run_with_sigkills(broker, config, tmp_path, sched, [out], messages, kill_times, last_burst_ms)
    tally.assert_exactly_once_never_early(messages, f" (logs in {tmp_path})")
