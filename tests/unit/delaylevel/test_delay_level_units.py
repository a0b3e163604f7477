"""Delay-level engines, tested directly: strategy, partition rule, forward times, sequence ids,
config, retention advice and the grow/shrink guard."""
from __future__ import annotations

import random

import pytest

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.delaylevel import (
    DelayLevelTopicPartitionStrategy,
    DelayTooLongError,
    PartitionBy,
    ShrinkRefusedError,
    StrategyError,
    forward_at,
    sequence_id,
)
from pulsar_lifecycle.delaylevel.admin import retention_problems
from pulsar_lifecycle.delaylevel.config import ConfigError, parse_syncer_config
from pulsar_lifecycle.delaylevel.errors import ParkedMessageError
from pulsar_lifecycle.delaylevel.rule import (
    BASE_PROP,
    LEVEL_PROP,
    dedicated_delay_level_topic,
    default_delay_level_topic,
    parse_parked,
    partition_topic,
    source_position,
    tick_topic,
)
from pulsar_lifecycle.delaylevel.service import check_partition_count
from support.paths import REPO

DAY_MS = 86_400_000


def test_seed_defaults_thirty_days_by_day():
    s = DelayLevelTopicPartitionStrategy()
    assert (s.message_maximum_delay_time_seconds, s.partition_by, s.unit_ms) == (30 * 86400, PartitionBy.DAY, DAY_MS)
    assert s.partitions == 30
    assert s.partition_for(DAY_MS - 1) is None  # under one unit: near-term path
    assert s.partition_for(DAY_MS) == 0  # [1, 2) days
    assert s.partition_for(2 * DAY_MS - 1) == 0
    assert s.partition_for(2 * DAY_MS) == 1
    assert s.partition_for(30 * DAY_MS) == 29  # exactly the maximum is accepted
    with pytest.raises(DelayTooLongError, match="exceeds the maximum"):
        s.partition_for(30 * DAY_MS + 1)


@pytest.mark.parametrize("by, unit_s", [(PartitionBy.YEAR, 365 * 86400), (PartitionBy.MONTH, 30 * 86400),
                                        (PartitionBy.DAY, 86400), (PartitionBy.HOUR, 3600)])
def test_seed_units(by, unit_s):
    s = DelayLevelTopicPartitionStrategy(3 * 365 * 86400, by, max_partitions=100_000)
    assert s.unit_ms == unit_s * 1000
    assert s.partitions == 3 * 365 * 86400 // unit_s


def test_seconds_unit_any_whole_number():
    s = DelayLevelTopicPartitionStrategy(60, PartitionBy.SECONDS, unit_seconds=2)
    assert s.partitions == 30 and s.unit_ms == 2000
    assert [s.partition_for(d) for d in (0, 1999, 2000, 3999, 4000, 60_000)] == [None, None, 0, 0, 1, 29]
    with pytest.raises(StrategyError, match="unitSeconds >= 1"):
        DelayLevelTopicPartitionStrategy(60, PartitionBy.SECONDS)
    with pytest.raises(StrategyError, match="contradicts partitionBy DAY"):
        DelayLevelTopicPartitionStrategy(60, PartitionBy.DAY, unit_seconds=5)
    with pytest.raises(StrategyError, match="partitionBy must be one of"):
        DelayLevelTopicPartitionStrategy(60, "WEEK")  # type: ignore[arg-type]


def test_unreasonable_strategy_names_strategy_count_and_cap():
    with pytest.raises(StrategyError) as err:
        DelayLevelTopicPartitionStrategy(5 * 365 * 86400, PartitionBy.HOUR)
    text = str(err.value)
    assert "partitionBy=HOUR" in text and "43800 partitions" in text and "cap of 1000" in text
    assert DelayLevelTopicPartitionStrategy(5 * 365 * 86400, PartitionBy.HOUR, max_partitions=50_000).partitions == 43800
    with pytest.raises(StrategyError, match="shorter than one unit"):
        DelayLevelTopicPartitionStrategy(3600, PartitionBy.DAY)


def test_every_delay_lands_in_its_slice():
    rng = random.Random(7)
    s = DelayLevelTopicPartitionStrategy(400, PartitionBy.SECONDS, unit_seconds=7)
    for _ in range(20_000):
        d = rng.randint(0, s.max_delay_ms)
        k = s.partition_for(d)
        if k is None:
            assert d < s.unit_ms
        else:
            assert 0 <= k < s.partitions and (k + 1) * s.unit_ms <= d
            assert d < (k + 2) * s.unit_ms or k == s.partitions - 1


def test_forward_time_never_after_deliver_at_minus_lookahead_and_monotone_in_publish_order():
    rng = random.Random(3)
    unit, look = 10_000, 1_500
    s = DelayLevelTopicPartitionStrategy(300, PartitionBy.SECONDS, unit_seconds=10)
    per_partition: dict = {}
    base = 1_700_000_000_000
    for _ in range(5000):
        base += rng.randint(0, 50)  # one producer's clock, in publish order
        d = rng.randint(unit, s.max_delay_ms)
        k = s.partition_for(d)
        f = forward_at(base, k, unit, base + d, look)
        assert f <= base + d - look  # forwarded at least a lookahead before deliver-at
        assert f >= base + d - look - unit  # and at most one unit + lookahead before it
        per_partition.setdefault(k, []).append(f)
    for forwards in per_partition.values():
        assert forwards == sorted(forwards)  # the head is always the first due


def test_growing_the_maximum_only_appends_partitions():
    small = DelayLevelTopicPartitionStrategy(100, PartitionBy.SECONDS, unit_seconds=5)
    big = DelayLevelTopicPartitionStrategy(1000, PartitionBy.SECONDS, unit_seconds=5)
    for d in range(0, small.max_delay_ms + 1, 250):
        assert small.partition_for(d) == big.partition_for(d)


def test_sequence_ids_increase_with_position_and_are_positive():
    positions = [(0, 0, -1), (0, 0, 0), (0, 0, 1), (0, 1, -1), (0, 49_999, 1023), (1, 0, 0), (2**31 - 2, 2**22 - 1, 1023)]
    ids = [sequence_id(*p) for p in positions]
    assert ids[0] == 1 and ids[1] == 1  # batch index -1 and 0 are the same message slot
    assert ids[1:] == sorted(ids[1:]) and len(set(ids[1:])) == len(ids) - 1
    assert ids[-1] < 2**63
    for bad in [(2**31 - 1, 0, 0), (0, 2**22, 0), (0, 0, 1024)]:
        with pytest.raises(ParkedMessageError, match="does not fit a sequence id"):
            sequence_id(*bad)


def test_names():
    t = "persistent://public/default/orders"
    # one shared topic by default, the one the shipped syncer serves; a dedicated one on request
    assert default_delay_level_topic() == "persistent://public/default/delay-level"
    shipped = load_function_config(REPO / "function-configs" / "delay-level-syncer.yaml")["userConfig"]
    assert shipped["delayLevelTopic"] == default_delay_level_topic()
    assert shipped["tickTopic"] == tick_topic(default_delay_level_topic())
    assert dedicated_delay_level_topic(t) == "persistent://public/default/orders-delay-level"
    assert partition_topic(dedicated_delay_level_topic(t), 3) == "persistent://public/default/orders-delay-level-partition-3"


def test_parse_parked_names_the_bad_property():
    good = {"__pl_deliver_at__": "5000", "__pl_target__": "persistent://p/n/t", BASE_PROP: "1000", LEVEL_PROP: "2"}
    assert parse_parked(good, 2).deliver_at == 5000
    with pytest.raises(ParkedMessageError, match="another strategy"):
        parse_parked(good, 3)
    with pytest.raises(ParkedMessageError, match=BASE_PROP):
        parse_parked({**good, BASE_PROP: "x"}, 2)
    with pytest.raises(ParkedMessageError, match="missing __pl_target__"):
        parse_parked({k: v for k, v in good.items() if k != "__pl_target__"}, 2)


def test_config_parsing_and_errors():
    cfg = parse_syncer_config({"delayLevelTopic": "dl", "schedulingTopic": "sched", "partitionBy": "SECONDS",
                               "unitSeconds": 2.0, "messageMaximumDelayTimeSeconds": "60"})
    assert cfg.delay_level_topic == "persistent://public/default/dl" and cfg.strategy.partitions == 30
    with pytest.raises(ConfigError, match="unknown userConfig key 'bogus'"):
        parse_syncer_config({"delayLevelTopic": "dl", "schedulingTopic": "s", "bogus": 1})
    with pytest.raises(ConfigError, match="unitSeconds must be an integer, got 2.5"):
        parse_syncer_config({"delayLevelTopic": "dl", "schedulingTopic": "s", "unitSeconds": 2.5})
    with pytest.raises(ConfigError, match="needs schedulingTopic"):
        parse_syncer_config({"delayLevelTopic": "dl"})
    with pytest.raises(StrategyError, match="exceed the cap"):
        parse_syncer_config({"delayLevelTopic": "dl", "schedulingTopic": "s", "partitionBy": "HOUR",
                             "messageMaximumDelayTimeSeconds": 365 * 86400})


def test_retention_problems():
    assert retention_problems({"message_ttl_in_seconds": 0, "backlog_quota_map": {}}, 86400, "p/n") == []
    probs = retention_problems({"message_ttl_in_seconds": 3600, "backlog_quota_map": {
        "destination_storage": {"limitSize": 1, "policy": "consumer_backlog_eviction"}}}, 86400, "p/n")
    assert len(probs) == 2 and "TTL 3600" in probs[0] and "consumer_backlog_eviction" in probs[1]
    assert retention_problems({"message_ttl_in_seconds": 90000}, 86400, "p/n") == []


class _MemState:
    def __init__(self) -> None:
        self.data: dict = {}

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str):
        return self.data.get(key)


def test_partition_count_grows_freely_and_shrinks_only_when_empty():
    st = _MemState()
    assert check_partition_count(st, 10, lambda k: True) == 0
    assert check_partition_count(st, 20, lambda k: True) == 10  # grow: nothing probed
    probed = []
    with pytest.raises(ShrinkRefusedError, match="partition 17 still holds parked messages"):
        check_partition_count(st, 15, lambda k: probed.append(k) or k == 17)
    assert probed == [15, 16, 17]
    assert check_partition_count(st, 15, lambda k: False) == 20
    assert check_partition_count(st, 15, lambda k: True) == 15


def test_forward_trail_finds_the_checkpoint_before_a_forward_and_forgets_old_ones():
    from pulsar_lifecycle.delaylevel.trail import Checkpoint, ForwardTrail, TrailFormatError

    trail = ForwardTrail(retention_ms=60_000, max_checkpoints=10)
    assert trail.interval_ms == 6000 and trail.due(0)
    assert trail.scan_start(0, 5) == (False, None)  # no checkpoint: nothing known
    trail.add(Checkpoint(1000, None, {0: -1, 1: 7}))
    trail.add(Checkpoint(8000, (3, 40), {0: 4, 1: 9}))
    assert not trail.due(13_000) and trail.due(14_000)
    assert trail.scan_start(0, 5) == (True, (3, 40))  # not claimed at 8 s: published after (3, 40)
    assert trail.scan_start(0, 4) == (True, None)  # claimed at 8 s, not at 1 s: from the start
    assert trail.scan_start(1, 8) == (True, None) and trail.scan_start(1, 6) == (False, None)  # 6: before the oldest
    assert trail.scan_start(2, 1) == (True, (3, 40))  # a partition found later: after the newest
    trail.add(Checkpoint(70_000, (5, 0), {0: 20}))
    assert [cp.taken_at_ms for cp in trail.checkpoints] == [8000, 70_000]  # 1 s is past the retention
    again = ForwardTrail.from_bytes(trail.to_bytes(), 60_000, 10)
    assert again.checkpoints == trail.checkpoints
    with pytest.raises(TrailFormatError, match="version"):
        ForwardTrail.from_bytes(b'{"v": 9, "checkpoints": []}', 60_000)
    with pytest.raises(TrailFormatError, match="unreadable"):
        ForwardTrail.from_bytes(b"[", 60_000)


def test_source_position_inverts_the_sequence_id():
    for pos in [(0, 0, 0), (7, 12345, 99), ((1 << 31) - 2, 3, 0)]:
        assert source_position(sequence_id(*pos)) == pos
    assert source_position(sequence_id(5, 6, -1)) == (5, 6, 0)  # outside a batch: as its index 0
    with pytest.raises(ValueError):
        source_position(0)
