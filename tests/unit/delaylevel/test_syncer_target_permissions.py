"""The syncer's targetPermissionCheck (issue 45 item 4): a parked message is forwarded to its target X
only when every role that may produce to the delay-level topic D may produce to X; otherwise it goes
to `<D>-DLQ` with the reason naming the roles and is acked, never forwarded. A PartitionForwarder
over a fake publisher and consumer with the writer's engine (TargetPermissionCheck) on a fake
PermissionSource; no broker. The secured-broker test is tests/integration/test_syncer_target_permissions_secured.py."""
from __future__ import annotations

import threading
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import pytest

from pulsar_lifecycle.config.settings import ConfigError
from pulsar_lifecycle.dedup.channel import Outcome, OutMessage
from pulsar_lifecycle.delaylevel.config import SyncerConfig
from pulsar_lifecycle.delaylevel.forwarder import ERROR_PROP, ForwardPolicy, PartitionForwarder
from pulsar_lifecycle.delaylevel.permissions import SyncerTargetCheck, syncer_target_check
from pulsar_lifecycle.scheduler.target_permissions import (
    PermissionsUnavailable,
    ProducePermissions,
    TargetPermissionCheck,
)
from pulsar_lifecycle.scheduling_protocol import TARGET_PROP
from support.parked_fakes import FakeConsumer, FakeMsg

NS = "persistent://public/default"
D = f"{NS}/delay-level"
DLQ = f"{D}-DLQ"
S = f"{NS}/delayed-scheduling"
X = f"{NS}/x"
Y = f"{NS}/y"


class Grants:
    """PermissionSource: topic -> roles granted produce; `down` raises PermissionsUnavailable."""

    def __init__(self, grants: Dict[str, Set[str]], supers: FrozenSet[str] = frozenset()) -> None:
        self.grants, self.supers, self.down, self.closed = grants, supers, False, False

    def produce_permissions(self, topic: str) -> ProducePermissions:
        if self.down:
            raise PermissionsUnavailable(f"admin GET {topic}/permissions: connection refused")
        return ProducePermissions(topic, frozenset(self.grants.get(topic, set())))

    def super_users(self) -> FrozenSet[str]:
        return self.supers

    def close(self) -> None:
        self.closed = True


def check_over(grants: Grants) -> SyncerTargetCheck:
    return SyncerTargetCheck(TargetPermissionCheck(grants, D, D, ttl_seconds=60), D)


class MemState:
    def __init__(self) -> None:
        self.values: Dict[str, bytes] = {}

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> Optional[bytes]:
        return self.values.get(key)


class FakePublisher:
    """DedupPublisher's surface the forwarder uses; topic -> [(sequence id, payload, properties)]."""

    producer_name = "syncer-p0"

    def __init__(self) -> None:
        self.state_store = MemState()
        self.topics: Dict[str, List[Tuple[int, bytes, Dict[str, str]]]] = {}

    def partitions(self, topic: str) -> int:
        return 0

    def destination(self, topic: str, sequence_id: int, partition_key: Optional[str] = None) -> str:
        return topic

    def route(self, topic: str, msgs: Sequence[OutMessage]) -> List[Tuple[str, List[OutMessage]]]:
        return [(topic, list(msgs))]

    def persisted_seq(self, topic: str) -> int:
        return max((s for s, _, _ in self.topics.get(topic, [])), default=-1)

    def publish_many(self, topic: str, msgs: Sequence[OutMessage], *, properties_owned: bool = False) -> List[Outcome]:
        for m in msgs:
            self.topics.setdefault(topic, []).append((m.sequence_id, m.payload, dict(m.properties or {})))
        return [Outcome.SENT for _ in msgs]

    def wait_persisted(self, topic: str, sequence_id: int, timeout_s: Optional[float] = None) -> None:
        pass

    def flush(self, timeout_s: Optional[float] = None) -> None:
        pass

    def reset(self, topic: str) -> None:
        pass

    def payloads(self, topic: str) -> List[bytes]:
        return [p for _, p, _ in self.topics.get(topic, [])]


def forwarder(consumer: FakeConsumer, publisher: FakePublisher, check: Optional[SyncerTargetCheck],
              near_term: Optional[str] = S) -> PartitionForwarder:
    policy = ForwardPolicy(unit_ms=1000, lookahead_ms=0, batch_size=10, near_term_topic=near_term, dead_letter_topic=DLQ,
                           target_exists=None, wait_for_room=lambda stop: None, clock=lambda: 10_000, retry_s=0.0,
                           target_refusal=check.refusal if check is not None else None)
    return PartitionForwarder(0, f"{D}-partition-0", consumer, publisher, policy,  # type: ignore[arg-type]
                              threading.Event())


def test_the_refusal_names_the_roles_and_the_delay_level_topic():
    grants = Grants({D: {"alice", "bob", "syncer"}, X: {"bob"}}, supers=frozenset({"syncer"}))
    check = check_over(grants)
    why = check.refusal(X)
    assert why is not None
    assert "['alice']" in why and X in why and f"the delay-level topic {D}" in why
    assert why.startswith("syncer targetPermissionCheck: ") and "scheduling topic" not in why
    assert check.refusal(D) is None  # every producer of D may produce to D
    check.close()
    assert grants.closed


@pytest.mark.parametrize("near_term", [S, None], ids=["scheduler backend", "broker backend"])
def test_a_target_a_producer_of_the_delay_level_topic_may_not_produce_to_is_dead_lettered(near_term):
    # alice and bob may produce to D, only bob to X, both to Y: the message to X is refused naming
    # alice (whoever parked it: the capability decides), the one to Y is forwarded.
    grants = Grants({D: {"alice", "bob"}, X: {"bob"}, Y: {"alice", "bob"}})
    publisher = FakePublisher()
    msgs = [FakeMsg(1, X), FakeMsg(2, Y)]
    consumer = FakeConsumer(msgs)
    fw = forwarder(consumer, publisher, check_over(grants), near_term)
    fw._step()  # noqa: SLF001 -- one step of the partition's loop, run here instead of its thread
    forwarded_to = near_term or Y
    assert publisher.payloads(DLQ) == [b"m1"], "the refused one goes to the dead-letter topic"
    assert publisher.payloads(forwarded_to) == [b"m2"], "the allowed one is forwarded"
    assert publisher.payloads(X) == []
    letter = publisher.topics[DLQ][0][2]
    assert "['alice']" in letter[ERROR_PROP] and X in letter[ERROR_PROP] and letter[TARGET_PROP] == X
    assert consumer.acked == msgs, "the dead letter is acked, as the forward is"
    assert fw.stats.dead_lettered == 1 and fw.stats.forwarded == 1


def test_the_check_off_forwards_what_the_delay_level_topic_took():
    # What the check closes: without it, alice's message to X leaves for S with the syncer's role.
    publisher = FakePublisher()
    fw = forwarder(FakeConsumer([FakeMsg(1, X)]), publisher, None)
    fw._step()  # noqa: SLF001
    assert publisher.payloads(S) == [b"m1"]


def test_grants_that_cannot_be_read_now_decide_nothing():
    # The admin API is down: the forwarder fails (the syncer is rebuilt), nothing is acked or sent.
    grants = Grants({D: {"alice"}, X: {"alice"}})
    grants.down = True
    publisher, consumer = FakePublisher(), FakeConsumer([FakeMsg(1, X)])
    fw = forwarder(consumer, publisher, check_over(grants))
    with pytest.raises(PermissionsUnavailable):
        fw._step()  # noqa: SLF001
    assert consumer.acked == [] and publisher.topics == {}


def _cfg(**user: object) -> SyncerConfig:
    return SyncerConfig.from_user_config({"delayLevelTopic": D, "schedulingTopic": S, **user})


class Ctx:
    def __init__(self, secrets: Dict[str, str]) -> None:
        self.secrets = secrets

    def get_secret(self, name: str) -> Optional[str]:
        return self.secrets.get(name)


def test_settings_follow_the_writers_semantics():
    cfg = _cfg()
    assert (cfg.target_permission_check, cfg.target_permission_cache_seconds, cfg.admin_token_secret) == ("auto", 60, None)
    assert syncer_target_check(cfg, Ctx({})) is None, "auto without pulsarAdminUrl: off"
    assert syncer_target_check(_cfg(targetPermissionCheck="off", pulsarAdminUrl="http://127.0.0.1:1"), Ctx({})) is None
    with pytest.raises(ConfigError, match="targetPermissionCheck=on needs pulsarAdminUrl"):
        syncer_target_check(_cfg(targetPermissionCheck="on"), Ctx({}))
    with pytest.raises(ConfigError, match="targetPermissionCheck"):
        _cfg(targetPermissionCheck="maybe")
    on = syncer_target_check(_cfg(targetPermissionCheck="on", pulsarAdminUrl="http://127.0.0.1:1",
                                  adminTokenSecret="T", targetPermissionCacheSeconds="5"), Ctx({"T": "tok"}))
    assert on is not None and on.check.scheduling_topic == D and on.check.ttl_seconds == 5
    on.close()
    with pytest.raises(ConfigError, match="secret 'T' is not set"):
        syncer_target_check(_cfg(targetPermissionCheck="on", pulsarAdminUrl="http://127.0.0.1:1", adminTokenSecret="T"),
                            Ctx({}))
