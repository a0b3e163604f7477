"""The phase-two decision procedure against the local admin and bookie servers."""
from __future__ import annotations

from pulsar_lifecycle.deletion.admin import PulsarAdminClient
from pulsar_lifecycle.deletion.codec import encode
from pulsar_lifecycle.deletion.engine import Action, DeletionEngine
from pulsar_lifecycle.deletion.engine import DeletionOutcome as Outcome
from pulsar_lifecycle.deletion.metrics import DeletionMetrics
from pulsar_lifecycle.deletion.model import LedgerComponent, LedgerType
from pulsar_lifecycle.deletion.oracle import ComponentOracle, InternalStatsOracle, SnapshotManifestOracle
from pulsar_lifecycle.deletion.routing import StorageRouter
from pulsar_lifecycle.deletion.storage.bookie_http import BookieHttpClient, BookieLedgerStorage
from pulsar_lifecycle.deletion.storage.snapshot import SnapshotStoreStorage
from pulsar_lifecycle.deletion.topics import DeletionTopics
from pulsar_lifecycle.deletion.trusted import TrustedLedgerRegistry
from servers.bookie_http_server import pulsar_metadata
from support.deletion import req

T = "public/default/t-partition-0"
SRC = "persistent://pulsar/system/__ledger_deletion-partition-0"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_engine(admin_url, bookie_url, clock=None, trusted=None, topics=None, **kw):
    oracle = InternalStatsOracle(PulsarAdminClient.connect([admin_url]), ttl_seconds=600, clock=clock or Clock())
    router = StorageRouter(bookkeeper=BookieLedgerStorage(BookieHttpClient.connect([bookie_url])))
    return DeletionEngine(ComponentOracle(default=oracle), router, topics or DeletionTopics(), trusted, **kw), oracle


def test_deletes_a_ledger_removed_from_metadata(admin_server, bookie_server):
    admin_server.set_topic(T, ledgers=[1, 2, 3])
    for i in (1, 2, 3):
        bookie_server.add_ledger(i, pulsar_metadata(T))
    engine, _ = make_engine(admin_server.url, bookie_server.url)
    admin_server.remove_ledger(T, 1)
    d = engine.handle(encode(req(T, 1)), 0, SRC)
    assert (d.action, d.outcome) == (Action.ACK, Outcome.DELETED)
    assert not bookie_server.exists(1)
    # A duplicate request (seed case 2/3) is acked: the ledger is already gone.
    d2 = engine.handle(encode(req(T, 1)), 0, SRC)
    assert (d2.action, d2.outcome) == (Action.ACK, Outcome.ALREADY_GONE)


def test_in_use_ledger_is_never_deleted(admin_server, bookie_server):
    admin_server.set_topic(T, ledgers=[1, 2], cursors={"sub": 3}, schema_ledgers=[4])
    for i in (1, 2, 3, 4):
        bookie_server.add_ledger(i, pulsar_metadata(T))
    engine, _ = make_engine(admin_server.url, bookie_server.url)
    for lid, comp in ((1, LedgerComponent.MANAGED_LEDGER), (3, LedgerComponent.MANAGED_CURSOR), (4, LedgerComponent.SCHEMA_STORAGE)):
        d = engine.handle(encode(req(T, lid, comp)), 0, SRC)
        assert (d.action, d.outcome) == (Action.RETRY, Outcome.IN_USE), d
    assert all(bookie_server.exists(i) for i in (1, 2, 3, 4))


def test_stale_cache_rule_and_one_load_per_ttl(admin_server, bookie_server):
    clock = Clock()
    admin_server.set_topic(T, ledgers=[5, 6])
    for i in (5, 6, 7):
        bookie_server.add_ledger(i, pulsar_metadata(T))
    engine, oracle = make_engine(admin_server.url, bookie_server.url, clock=clock)
    assert engine.handle(encode(req(T, 6)), 0, SRC).outcome is Outcome.IN_USE
    # A roll-over creates ledger 7 and 6 is trimmed; the cached set still says max=6.
    admin_server.add_ledger(T, 7)
    admin_server.remove_ledger(T, 5)
    admin_server.remove_ledger(T, 6)
    d = engine.handle(encode(req(T, 7)), 0, SRC)
    assert (d.action, d.outcome) == (Action.RETRY, Outcome.STALE_CACHE) and "stale" in d.reason
    assert bookie_server.exists(7)
    assert admin_server.calls_for(T) == 1  # every lookup within the TTL came from the cache
    clock.t += 600
    assert engine.handle(encode(req(T, 6)), 1, SRC).outcome is Outcome.DELETED
    assert engine.handle(encode(req(T, 7)), 1, SRC).outcome is Outcome.IN_USE  # 7 is the current ledger
    assert admin_server.calls_for(T) == 2
    assert (oracle.cache.stats.hits, oracle.cache.stats.misses) == (2, 2)


def test_forged_request_deletes_nothing(admin_server, bookie_server):
    victim = "public/default/victim-partition-0"
    admin_server.set_topic(T, ledgers=[10, 30])
    admin_server.set_topic(victim, ledgers=[11])
    bookie_server.add_ledger(11, pulsar_metadata(victim))
    bookie_server.add_ledger(12, pulsar_metadata(victim))
    engine, _ = make_engine(admin_server.url, bookie_server.url)
    # 11 is the victim's current ledger; 12 is not in T's metadata either. Both claimed for T.
    for lid in (11, 12):
        d = engine.handle(encode(req(T, lid, check=lid == 12)), 0, SRC)
        assert (d.action, d.outcome) == (Action.DEAD_LETTER, Outcome.OWNER_MISMATCH), d
        assert "victim" in d.reason
    assert bookie_server.exists(11) and bookie_server.exists(12)
    assert bookie_server.delete_calls == 0


def test_trusted_ids_skip_the_metadata_fetch(admin_server, bookie_server):
    admin_server.set_topic(T, ledgers=[20])
    bookie_server.add_ledger(1, {})  # no ownership metadata at all
    trusted = TrustedLedgerRegistry()
    engine, _ = make_engine(admin_server.url, bookie_server.url, trusted=trusted)
    assert engine.handle(encode(req(T, 1)), 0, SRC).outcome is Outcome.UNVERIFIABLE
    bookie_server.add_ledger(2, {})
    trusted.add(req(T, 2).key)
    d = engine.handle(encode(req(T, 2)), 0, SRC)
    assert d.outcome is Outcome.DELETED and len(trusted) == 0
    assert bookie_server.exists(1) and not bookie_server.exists(2)


def test_malformed_and_unsupported_go_to_the_dlq(admin_server, bookie_server):
    engine, _ = make_engine(admin_server.url, bookie_server.url)
    d = engine.handle(b"\x02garbage", 0, SRC)
    assert d.action is Action.DEAD_LETTER and d.outcome is Outcome.REJECTED and "malformed" in d.reason
    admin_server.set_topic(T, ledgers=[50])
    d = engine.handle(encode(req(T, 3, ltype=LedgerType.OFFLOAD_LEDGER, uuid="12345678-1234-5678-9abc-def012345678", driver="aws-s3")), 0, SRC)
    assert d.action is Action.DEAD_LETTER and "no S3 offload storage" in d.reason
    d = engine.handle(encode(req(T, 3, LedgerComponent.DELAYED_INDEX_BUCKET)), 0, SRC)
    assert d.action is Action.DEAD_LETTER and "DELAYED_INDEX_BUCKET" in d.reason


def test_failures_retry_then_dead_letter(admin_server):
    from servers.bookie_http_server import BookieHttpServer

    admin_server.set_topic(T, ledgers=[9])
    with BookieHttpServer(fail_rate=1.0) as bookie:
        engine, _ = make_engine(admin_server.url, bookie.url, max_redeliver_count=3)
        metrics = DeletionMetrics()
        actions = []
        for attempts in range(5):
            d = engine.handle(encode(req(T, 1)), attempts, SRC)
            metrics.observe(d)
            actions.append(d.action)
        assert actions == [Action.RETRY] * 3 + [Action.DEAD_LETTER] * 2
        assert "gave up after 4 retries" in d.reason and "500" in d.reason
        assert metrics.value("retried") == 3 and metrics.value("dead_lettered") == 2


def test_topic_gone_means_not_in_use(admin_server, bookie_server):
    bookie_server.add_ledger(1, pulsar_metadata(T))
    engine, _ = make_engine(admin_server.url, bookie_server.url)
    assert engine.handle(encode(req(T, 1)), 0, SRC).outcome is Outcome.DELETED


def test_tenant_scope_rejects_cross_tenant(admin_server, bookie_server):
    bookie_server.add_ledger(1, pulsar_metadata("acme/ns/t"))
    topics = DeletionTopics(scope="tenant")
    engine, _ = make_engine(admin_server.url, bookie_server.url, topics=topics)
    evil_src = "persistent://evil/system/__ledger_deletion-partition-0"
    d = engine.handle(encode(req("acme/ns/t", 1)), 0, evil_src)
    assert d.action is Action.DEAD_LETTER and "cross-tenant" in d.reason and bookie_server.exists(1)
    d = engine.handle(encode(req("acme/ns/t", 1)), 0, "persistent://acme/system/__ledger_deletion-partition-0")
    assert d.outcome is Outcome.DELETED


def test_bucket_snapshots_through_manifest_and_store():
    manifest = {1, 2}
    store = {1: b"s1", 2: b"s2", 3: b"s3"}
    engine = DeletionEngine(
        ComponentOracle(by_component={LedgerComponent.DELAYED_INDEX_BUCKET: SnapshotManifestOracle(lambda b: b in manifest)}),
        StorageRouter(snapshot=SnapshotStoreStorage(lambda b: store.pop(b, None) is not None)),
        DeletionTopics(),
    )
    r = lambda b: encode(req("public/default/t", b, LedgerComponent.DELAYED_INDEX_BUCKET))  # noqa: E731
    assert engine.handle(r(1)).outcome is Outcome.IN_USE
    assert engine.handle(r(3)).outcome is Outcome.DELETED and 3 not in store
    manifest.discard(2)  # merged away
    assert engine.handle(r(2)).outcome is Outcome.DELETED and store == {1: b"s1"}
    # A PIP component with no internalStats oracle configured is refused, not guessed.
    d = engine.handle(encode(req("public/default/t", 5)))
    assert d.action is Action.DEAD_LETTER and "no in-use oracle" in d.reason
