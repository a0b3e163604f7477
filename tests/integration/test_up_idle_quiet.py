"""An idle `up` on the embedded broker writes no ERROR or WARN line to its pulsar-client log.

pulsar-lite answers the last-message-id request of a topic without messages with an error the
client logs at ERROR and WARN. The shipped functions ask it of topics that may be empty: the dedup
recovery of each publisher at start, and the stall watchdog of each idle delay-level partition and
of the writer's intake. They look with a Reader first and ask only a topic that holds a message
(before: 218 ERROR + 218 WARN lines in 45 s, 180 of them from the syncer's 30 partitions).

`up` runs in a process of its own: pulsar-client keeps the first client's logger for the whole
process, so a client made in the test process would log elsewhere.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.cli import cli_env
from support.paths import REPO

LEVEL = re.compile(r"^\S+ \S+ +(WARN|ERROR) ")
RUN_S = 20  # covers the watchdogs' first checks: 2 s after the start, then at 3, 5, 9 and 17 s


def test_an_idle_up_on_the_embedded_broker_logs_no_client_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    res = subprocess.run(
        [sys.executable, "-m", "pulsar_lifecycle.cli", "--log-level", "INFO", "up", "--data-dir", str(data),
         "--config-dir", str(REPO / "function-configs"), "--run-seconds", str(RUN_S), "--refresh", "5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=RUN_S + 150, stdin=subprocess.DEVNULL,
        env=cli_env(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    logs = res.stdout + res.stderr
    # the functions whose probes are under test ran: the syncer's 30 partitions, the writer's intake
    assert "event=delay_level_syncer_started" in logs and "partitions=30" in logs, logs[-3000:]
    assert "event=scheduling_consumer_subscribed" in logs, logs[-3000:]
    log = data / "pulsar-client.log"
    assert log.is_file(), f"{log} was not written (up's clients logged elsewhere)"
    noisy = [line for line in log.read_text().splitlines() if LEVEL.match(line)]
    assert noisy == [], f"{len(noisy)} WARN/ERROR lines in {log}, e.g. {noisy[:4]}"
