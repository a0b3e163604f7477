"""TopicName, the one parser of topic names: forms, partitions, persistence names, entity names."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsar_lifecycle.topics import TopicName, TopicNameError, is_named_entity, java_url_encode, strip_partition

entity = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_=:.", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))
local = st.text(min_size=1, max_size=20).filter(lambda s: s not in (".", "..") and "\x00" not in s
                                                 and "/" not in s)


@given(entity, entity, local, st.sampled_from(["persistent", "non-persistent"]))
def test_every_name_round_trips_through_its_persistence_name(tenant: str, ns: str, name: str, domain: str) -> None:
    topic = TopicName(tenant, ns, name, domain)
    assert TopicName.from_persistence_name(topic.persistence_name) == topic
    assert TopicName.parse(topic.full_name) == topic


def test_persistence_name_is_javas_url_encoding_of_the_local_name() -> None:
    assert TopicName.parse("persistent://t/n/a b/c").persistence_name == "t/n/persistent/a+b%2Fc"
    assert java_url_encode("a/b:c~ é") == "a%2Fb%3Ac%7E+%C3%A9"
    for bad in ("t/n/x", "t/n/other/x", "t//persistent/x", "t/n/persistent/"):
        with pytest.raises(TopicNameError):
            TopicName.from_persistence_name(bad)


def test_partitions_are_named_and_parsed_one_way() -> None:
    p = TopicName.parse("persistent://t/n/x-RETRY-partition-3")
    assert p.partition == ("x-RETRY", 3) and p.partition_index == 3 and p.base.local_name == "x-RETRY"
    assert p.base.with_partition(3) == p
    assert TopicName.parse("t/n/x").partition is None and TopicName.parse("t/n/x").partition_index == -1
    assert strip_partition("x-partition-1-partition-2") == "x-partition-1"


def test_named_entities_follow_pulsars_rule() -> None:
    assert all(is_named_entity(v) for v in ("public", "a-b_c=d:e.f", "x1"))
    assert not any(is_named_entity(v) for v in ("", "a b", "a/b", "a\u00a0b!"))
