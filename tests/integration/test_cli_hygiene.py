"""Command-line hygiene: arguments are checked before anything connects, and no pulsar-client
C++ log line reaches the console of a command, also when a broker accepts connections and never
answers (the lines go to the client log file instead)."""
from __future__ import annotations

import pytest

from pulsar_lifecycle.runtime.broker import free_port
from support.broker_fixtures import kind_of
from support.cli import assert_no_client_log_lines, assert_one_line_error, client_log_lines, run_cli
from support.paths import REPO

EXAMPLE = str(REPO / "function-configs" / "example-function.yaml")


@pytest.mark.parametrize("args, needles", [
    (["deletion", "enqueue", "--topic", "public/default/t", "--ledger-id", "-5"], ["ledger id", "-5"]),
    (["deletion", "enqueue", "--topic", "bad tenant!/ns/t", "--ledger-id", "5"], ["--topic", "invalid tenant"]),
    (["deletion", "enqueue", "--topic", "t", "--ledger-id", "5"], ["--topic", "tenant/namespace/topic"]),
    (["deletion", "enqueue", "--topic", "non-persistent://a/b/t", "--ledger-id", "5"], ["persistent"]),
    (["deletion", "enqueue", "--topic", "public/default/t", "--ledger-id", "5", "--delay-backend", "scheduler"],
     ["--scheduling-topic"]),
    (["deletion", "enqueue", "--topic", "public/default/t", "--ledger-id", "5", "--send-delay-seconds", "-1"],
     ["--send-delay-seconds"]),
    (["deletion", "enqueue", "--topic", "public/default/t", "--ledger-id", "5", "--parallelism", "0"],
     ["ledgerDeletionParallelism"]),
    (["deletion", "enqueue-topic", "--topic", "public/default/t", "--admin-url", "localhost:8080"], ["--admin-url"]),
    (["deletion", "dlq", "list", "--namespace", "no-slash"], ["deletionNamespace"]),
    (["send-ticks", "--tick-topic", "a/b"], ["--tick-topic"]),
])
def test_arguments_are_refused_before_connecting(tmp_path, args, needles):
    # Nothing listens at the URL and the connect timeout is the default 30 s: an argument checked
    # only after connecting would end in the broker's error, not the argument's.
    dead = f"pulsar://127.0.0.1:{free_port()}"
    assert_one_line_error(run_cli(*args, "--service-url", dead, tmp_path=tmp_path), *needles)


@pytest.mark.parametrize("args", [
    ["deletion", "enqueue", "--topic", "public/default/t", "--ledger-id", "5", "--send-delay-seconds", "0",
     "--connect-timeout", "2"],
    ["deletion", "dlq", "list", "--connect-timeout", "2"],
    ["send-ticks", "--tick-topic", "persistent://public/default/t", "--connect-timeout", "2"],
])
def test_a_broker_that_never_answers_is_one_line_and_no_client_log(tmp_path, silent_broker, args):
    res = run_cli(*args, "--service-url", silent_broker.url, tmp_path=tmp_path)
    assert_one_line_error(res, silent_broker.url, "did not answer")


def test_localrun_against_a_broker_that_never_answers(tmp_path, silent_broker):
    res = run_cli("localrun", "--function-config-file", EXAMPLE, "--broker-service-url", silent_broker.url,
                  "--data-dir", str(tmp_path / "d"), tmp_path=tmp_path)
    assert_one_line_error(res, silent_broker.url, "did not answer")


def test_client_log_lines_go_to_the_log_file_not_the_console(broker, tmp_path, unique):
    """Runs that make pulsar-client log (on pulsar-lite the last-message-id probe of an empty
    topic logs a WARN and an ERROR): the console has none of it, the command's log file has it."""
    syncer = str(REPO / "function-configs" / "delay-level-syncer.yaml")
    res = run_cli("inspect", "syncer", "--function-config-file", syncer, "--service-url", broker.service_url,
                  "--data-dir", str(tmp_path / "none"), "--limit", "10", tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_no_client_log_lines(res)
    log = tmp_path / "cache" / "logs" / "pulsar-client.log"
    assert log.is_file()
    if kind_of(broker) == "lite":
        assert client_log_lines(log.read_text()), log.read_text()[-2000:]
    res = run_cli("localrun", "--function-config-file", EXAMPLE, "--broker-service-url", broker.service_url,
                  "--data-dir", str(tmp_path / "d"), "--run-seconds", "1", "--name", f"ex-{unique}",
                  "-i", f"persistent://public/default/in-{unique}", "-o", f"persistent://public/default/out-{unique}",
                  tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_no_client_log_lines(res)
    assert (tmp_path / "d" / "pulsar-client.log").is_file()  # localrun's client log lives in its --data-dir
