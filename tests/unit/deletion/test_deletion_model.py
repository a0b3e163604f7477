"""PendingDeleteLedgerInfo model, Avro codec, topic names, config validation."""
from __future__ import annotations

import io

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsar_lifecycle.deletion.codec import PARSED_SCHEMA, RESERVED_PROPERTIES, SCHEMA_DICT, decode, encode
from pulsar_lifecycle.deletion.config import DeletionConfig
from pulsar_lifecycle.deletion.model import (
    InvalidRequestError,
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
    TopicRef,
)
from pulsar_lifecycle.deletion.topics import DeletionTopics, check_tenant
from pulsar_lifecycle.topics import java_url_encode

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20).filter(lambda s: s not in (".", ".."))


@st.composite
def requests(draw):
    ltype = draw(st.sampled_from(list(LedgerType)))
    lid = draw(st.integers(min_value=0, max_value=2**63 - 1))
    ctx = None
    if ltype is LedgerType.OFFLOAD_LEDGER or draw(st.booleans()):
        oc = OffloadContext(
            uid_msb=draw(st.integers(-(2**63), 2**63 - 1)),
            uid_lsb=draw(st.integers(-(2**63), 2**63 - 1)),
            driver_name=draw(st.sampled_from([None, "aws-s3", "filesystem"])),
            driver_metadata=draw(st.dictionaries(names, names, max_size=3)),
        )
        ctx = LedgerContext(ledger_id=lid, entries=draw(st.integers(0, 10**6)), offload_context=oc)
    return PendingDeleteLedgerInfo(
        topic_name=f"{draw(names)}/{draw(names)}/{draw(names)}",
        ledger_component=draw(st.sampled_from(list(LedgerComponent))),
        ledger_type=ltype,
        ledger_id=lid,
        context=ctx,
        check_ledger_still_in_use=draw(st.booleans()),
        # The codec refuses its own property names (a separate test); hypothesis can spell them.
        properties=draw(st.dictionaries(names.filter(lambda k: k not in RESERVED_PROPERTIES), names, max_size=3)),
    )


@settings(max_examples=150, deadline=None)
@given(requests())
def test_codec_round_trip(info):
    assert decode(encode(info)) == info


def test_payload_is_plain_avro_readable_with_the_schema():
    info = PendingDeleteLedgerInfo("public/default/t", LedgerComponent.SCHEMA_STORAGE, LedgerType.LEDGER, 7)
    rec = fastavro.schemaless_reader(io.BytesIO(encode(info)), PARSED_SCHEMA, None)
    assert rec["topicName"] == "public/default/t" and rec["ledgerComponent"] == "SCHEMA_STORAGE"
    # Only the PIP's symbols: DELAYED_INDEX_BUCKET travels in properties (test_deletion_java_interop).
    comp = SCHEMA_DICT["fields"][2]["type"][1]["symbols"]
    assert comp == ["MANAGED_LEDGER", "MANAGED_CURSOR", "SCHEMA_STORAGE"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_never_decodes_silently(data):
    try:
        info = decode(data)
    except InvalidRequestError as exc:
        assert "malformed" in str(exc) or "unknown" in str(exc) or "topic" in str(exc) or "ledger" in str(exc)
    else:
        assert decode(encode(info)) == info


def _raw(rec):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, PARSED_SCHEMA, rec)
    return buf.getvalue()


BASE = {"topicName": "public/default/t", "ledgerComponent": "MANAGED_LEDGER", "ledgerType": "LEDGER", "ledgerId": 3,
        "context": None, "checkLedgerStillInUse": True, "properties": None}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"topicName": None}, "topicName is missing"),
        ({"ledgerId": None}, "ledgerId is missing"),
        ({"ledgerId": -5}, "non-negative"),
        ({"topicName": "just-a-topic"}, "tenant/namespace/topic"),
        ({"topicName": "public/../x"}, "illegal path segment"),
        ({"topicName": "non-persistent://public/default/x"}, "only persistent"),
        ({"ledgerType": "OFFLOAD_LEDGER"}, "needs a context"),
    ],
)
def test_invalid_requests_name_the_problem(change, message):
    with pytest.raises(InvalidRequestError, match=message):
        decode(_raw({**BASE, **change}))


def test_trailing_bytes_are_rejected():
    with pytest.raises(InvalidRequestError, match="trailing"):
        decode(_raw(BASE) + b"\x00")


def test_topic_names_and_persistence_names():
    t = TopicRef.parse("persistent://public/default/my topic-partition-3")
    assert t.short_name == "public/default/my topic-partition-3"
    assert t.partition == ("my topic", 3)
    assert t.managed_ledger_name == "public/default/persistent/my+topic-partition-3"
    assert t.schema_id == "public/default/my topic"
    assert java_url_encode("a/b:c~") == "a%2Fb%3Ac%7E"


def test_uuid_halves_match_java():
    oc = OffloadContext.from_uuid("f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f")
    assert oc.uid_msb < 0  # Java stores the halves as signed longs
    assert oc.uuid == "f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f"


def test_deletion_topic_names():
    topics = DeletionTopics()
    assert topics.deletion_partition(2) == "persistent://pulsar/system/__ledger_deletion-partition-2"
    assert topics.retry_partition(0) == "persistent://pulsar/system/__ledger_deletion-RETRY-partition-0"
    assert topics.dlq_topic() == "persistent://pulsar/system/__ledger_deletion-DLQ"
    assert len(topics.input_topics()) == 8
    assert topics.classify(topics.retry_partition(3)).kind == "retry"
    assert topics.classify(topics.deletion_partition(1)).partition == 1
    with pytest.raises(ValueError):
        topics.classify("persistent://public/default/__ledger_deletion-partition-0")
    ref = TopicRef.parse("a/b/c")
    assert topics.partition_for(ref, 5) == topics.partition_for(ref, 5)
    assert 0 <= topics.partition_for(ref, 5) < 4


def test_tenant_scope_isolates_tenants():
    topics = DeletionTopics(scope="tenant")
    assert topics.deletion_partition(0, "acme") == "persistent://acme/system/__ledger_deletion-partition-0"
    src = topics.classify("persistent://acme/system/__ledger_deletion-partition-0")
    assert src.tenant == "acme"
    check_tenant(topics, src, TopicRef.parse("acme/ns/t"))
    with pytest.raises(InvalidRequestError, match="cross-tenant"):
        check_tenant(topics, src, TopicRef.parse("other/ns/t"))


def test_config_defaults_and_validation():
    cfg = DeletionConfig.from_user_config({"delayBackend": "broker"})
    assert (cfg.send_delay_seconds, cfg.reconsume_later_seconds, cfg.max_redeliver_count) == (60, 600, 10)
    assert cfg.ledgers_cache_ttl_seconds == 600 and cfg.topics.parallelism == 4
    assert DeletionConfig.from_user_config({"delayBackend": "broker", "maxRedeliverCount": 5.0}).max_redeliver_count == 5
    with pytest.raises(ValueError, match="unknown userConfig key 'reconsumeLaterSecond'"):
        DeletionConfig.from_user_config({"delayBackend": "broker", "reconsumeLaterSecond": 5})
    with pytest.raises(ValueError, match="schedulingTopic"):
        DeletionConfig.from_user_config({})
    with pytest.raises(ValueError, match="maxRedeliverCount must be >= 1"):
        DeletionConfig.from_user_config({"delayBackend": "broker", "maxRedeliverCount": 0})
    with pytest.raises(ValueError, match="bookieHttpUrls"):
        DeletionConfig.from_user_config({"delayBackend": "broker", "bookieHttpUrls": ["bookie:8000"]})
    with pytest.raises(ValueError, match="given together"):
        DeletionConfig.from_user_config({"delayBackend": "broker", "s3AccessKeyIdSecret": "ak"}, lambda n: "x")
