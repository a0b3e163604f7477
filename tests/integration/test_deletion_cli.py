"""Phase-one service and the operator CLI against the embedded broker."""
from __future__ import annotations

import json

import pulsar
import pytest
from click.testing import CliRunner

from pulsar_lifecycle.cli.deletion_cli import deletion
from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.codec import decode, encode
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType, PendingDeleteLedgerInfo
from pulsar_lifecycle.deletion.service import LedgerDeletionService, PendingDeleteSendError
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.deletion.trusted import TrustedLedgerRegistry
from pulsar_lifecycle.runtime.broker import free_port
from pulsar_lifecycle.runtime.client import quiet_client
from support.helpers import drain

pytestmark = pytest.mark.integration


def _opts(broker, topics):
    return ["--service-url", broker.service_url, "--topic-name", topics.topic_name]


def _all_partitions(client, topics, sub, expect):
    got = []
    for k in range(topics.parallelism):
        got += drain(client, topics.deletion_partition(k), sub, expect=expect - len(got), timeout=2 if got else 3)
        if len(got) >= expect:
            break
    return got


def test_failed_send_fails_the_call():
    client = pulsar.Client(f"pulsar://127.0.0.1:{free_port()}", operation_timeout_seconds=2, connection_timeout_ms=1000)
    trusted = TrustedLedgerRegistry()
    service = LedgerDeletionService(client, DeletionTopics(), None, send_delay_seconds=0, trusted=trusted)
    with pytest.raises(PendingDeleteSendError, match="could not store pending deletion"):
        service.append_pending_delete_ledger("public/default/t", 5, None, "MANAGED_LEDGER", "LEDGER")
    assert len(trusted) == 0  # nothing remembered for a request that was never stored
    client.close()


def test_service_creates_partitioned_topics_and_sends(broker, admin_server, unique):
    topics = DeletionTopics(topic_name=f"__ld_{unique.replace('-', '_')}")
    client = quiet_client(broker.service_url)
    service = LedgerDeletionService(client, topics, None, send_delay_seconds=0,
                                    admin=PulsarAdminClient.connect([admin_server.url]))
    service.start()
    assert admin_server.partitioned[f"pulsar/system/{topics.topic_name}"] == 4
    assert admin_server.partitioned[f"pulsar/system/{topics.topic_name}-RETRY"] == 4
    service.append_pending_delete_ledger("persistent://public/default/t-partition-2", 9, None,
                                         LedgerComponent.MANAGED_CURSOR, LedgerType.LEDGER, properties={"cursor": "s"})
    service.close()
    msgs = _all_partitions(client, topics, "check", 1)
    client.close()
    info = decode(msgs[0].data())
    assert (info.topic_name, info.ledger_id, info.properties) == ("public/default/t-partition-2", 9, {"cursor": "s"})


def test_cli_enqueue_list_and_replay(broker, unique):
    topics = DeletionTopics(topic_name=f"__ld_{unique.replace('-', '_')}")
    runner = CliRunner()
    res = runner.invoke(deletion, ["enqueue", *_opts(broker, topics), "--send-delay-seconds", "0",
                                   "--topic", "public/default/t", "--ledger-id", "42",
                                   "--offload-uuid", "12345678-1234-5678-9abc-def012345678", "--offload-driver", "aws-s3"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["type"] == "OFFLOAD_LEDGER"
    bad = runner.invoke(deletion, ["enqueue", *_opts(broker, topics), "--send-delay-seconds", "0",
                                   "--topic", "no-namespace", "--ledger-id", "1"])
    assert bad.exit_code != 0 and "tenant/namespace/topic" in bad.output

    client = quiet_client(broker.service_url)
    dlq = client.create_producer(topics.dlq_topic(), batching_enabled=False)
    info = PendingDeleteLedgerInfo("public/default/t", LedgerComponent.MANAGED_LEDGER, LedgerType.LEDGER, 7)
    dlq.send(encode(info), properties={"REASON": "gave up after 10 retries: boom", "OUTCOME": "FAILED", "RECONSUMETIMES": "10"})
    dlq.send(b"junk", properties={"REASON": "malformed request"})
    dlq.close()
    listed = runner.invoke(deletion, ["dlq", "list", *_opts(broker, topics), "--idle-timeout", "1"])
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.output.splitlines()]
    assert {r["ledger_id"] for r in rows} == {7, None}
    assert any(r["reason"].startswith("gave up") and r["attempts"] == 10 for r in rows)
    replayed = runner.invoke(deletion, ["dlq", "replay", *_opts(broker, topics), "--idle-timeout", "1",
                                        "--reason-contains", "gave up"])
    assert replayed.exit_code == 0, replayed.output
    assert json.loads(replayed.output.splitlines()[0])["ledger_id"] == 7
    # The replayed request is back on the deletion topic; the undecodable one stays in the DLQ.
    msgs = _all_partitions(client, topics, "check", 2)
    assert sorted(decode(m.data()).ledger_id for m in msgs) == [7, 42]
    left = runner.invoke(deletion, ["dlq", "list", *_opts(broker, topics), "--idle-timeout", "1"])
    assert [json.loads(line)["ledger_id"] for line in left.output.splitlines()] == [None]
    client.close()
