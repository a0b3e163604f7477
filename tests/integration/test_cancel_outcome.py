"""`delayed cancel` reports what the writer did: cancelled, already delivered, or not known (yet),
with distinct exit statuses and the user's id, in the output and in the writer's log; a restarted
writer does not read the cancels it had handled again."""
from __future__ import annotations

import logging
import time

import pulsar

from pulsar_lifecycle.cli.delayed_cli import EXIT_ALREADY_RELEASED, EXIT_NOT_KNOWN
from pulsar_lifecycle.config.function_config import spec_from_config
from pulsar_lifecycle.runtime.client import quiet_client
from pulsar_lifecycle.runtime.localrun import LocalRunner, LocalRunOptions
from support.cli import run_cli
from support.writer import cli_writer_config


def _cancel(ident: str, common: list, tmp_path) -> tuple:
    res = run_cli("delayed", "cancel", ident, "--timeout", "30", *common, tmp_path=tmp_path)
    return res.returncode, res.stdout.strip(), res.stderr


def test_cancel_reports_the_outcome_and_a_restart_reads_no_cancel_again(broker, tmp_path, unique, caplog):
    caplog.set_level(logging.INFO)
    cfg = cli_writer_config(tmp_path, unique)
    opts = LocalRunOptions(broker_service_url=broker.service_url, data_dir=tmp_path / "data")
    runner = LocalRunner(spec_from_config(cfg), opts).start()
    target = f"persistent://public/default/orders-{unique}"
    common = ["--service-url", broker.service_url, "--writer-config", str(tmp_path / "writer.yaml")]
    client = quiet_client(broker.service_url)
    consumer = client.subscribe(target, "check", initial_position=pulsar.InitialPosition.Earliest)
    try:
        sent = {}
        for name, delay in (("later", "120s"), ("soon", "1s")):
            res = run_cli("delayed", "send", target, name, "--in", delay, *common, tmp_path=tmp_path)
            assert res.returncode == 0, res.stderr[-2000:]
            sent[name] = res.stdout.strip()
        msg = consumer.receive(timeout_millis=60_000)
        assert msg.data() == b"soon"

        code, out, err = _cancel(sent["later"], common, tmp_path)
        assert (code, out) == (0, f"{sent['later']}: cancelled; it will not be delivered"), err[-2000:]
        code, out, _ = _cancel(sent["later"], common, tmp_path)  # asked again: the same answer
        assert code == 0 and "cancelled" in out
        code, out, _ = _cancel(sent["soon"], common, tmp_path)
        assert code == EXIT_ALREADY_RELEASED and out.startswith(f"{sent['soon']}: already delivered"), out
        ledger = int(sent["later"].split(":")[0])
        unknown = f"{ledger}:9999"
        code, out, _ = _cancel(unknown, common, tmp_path)
        assert code == EXIT_NOT_KNOWN and out.startswith(f"{unknown}: not known (yet)"), out
        assert "keeps the cancel for 86400 s (unknownCancelRetentionSeconds)" in out, out
        # The writer's log names the ids users see (a batched 1:4:0 is not 1:4096)
        logged = " ".join(r.getMessage() for r in caplog.records if "event=cancel_request" in r.getMessage())
        for ident, outcome in ((sent["later"], "cancelled"), (sent["soon"], "already_released"),
                               (unknown, "not_known_yet")):
            assert f"id={ident} " in logged and f"outcome={outcome}" in logged, logged

        runner.stop()
        caplog.clear()
        runner = LocalRunner(spec_from_config(cfg), opts).start()
        # A message sent after the restart is released: the restarted writer reads its input by then
        res = run_cli("delayed", "send", target, "after", "--in", "1s", *common, tmp_path=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        assert consumer.receive(timeout_millis=60_000).data() == b"after"
        time.sleep(1.0)  # gap reads run between batches: give one the time to happen
        again = [r.getMessage() for r in caplog.records
                 if "event=cancel_request" in r.getMessage() or
                 ("event=intake_gap_read" in r.getMessage() and r.levelno >= logging.WARNING)]
        assert again == [], again
    finally:
        consumer.close()
        client.close()
        runner.stop()


def test_cancel_without_a_writer_says_so(broker, tmp_path, unique):
    cli_writer_config(tmp_path, unique)  # the config names a scheduling topic nothing reads
    common = ["--service-url", broker.service_url, "--writer-config", str(tmp_path / "writer.yaml")]
    t0 = time.monotonic()
    res = run_cli("delayed", "cancel", "5:1", "--timeout", "1", *common, tmp_path=tmp_path)
    assert res.returncode == 5 and "no answer from the writer within 1 s" in res.stdout, (res.stdout, res.stderr)
    assert time.monotonic() - t0 < 60
    res = run_cli("delayed", "cancel", "5:1", "--no-wait", *common, tmp_path=tmp_path)
    assert res.returncode == 0 and "sent" in res.stderr
