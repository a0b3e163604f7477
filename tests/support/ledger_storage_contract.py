"""LedgerStorage behaviour every backend must have (like state_contract.py for StateStore).

A subclass provides the fixture `backend` -> LedgerBackend: the storage under test plus the
means to create ledgers in it the way Pulsar would (owned by a topic, or by another topic) and
to see whether a ledger's bytes are still stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pulsar_lifecycle.deletion.model import PendingDeleteLedgerInfo
from pulsar_lifecycle.deletion.ports import DeleteResult, LedgerStorage, OwnershipStatus

OWNER = "public/default/orders-partition-0"
OTHER = "public/default/other-partition-0"


@dataclass
class LedgerBackend:
    """What a contract test needs from one backend."""

    storage: LedgerStorage
    add: Callable[[str], int]  # stores a ledger owned by topic `tenant/ns/topic`; returns its id
    exists: Callable[[int], bool]
    request: Callable[[int, str], PendingDeleteLedgerInfo]  # (ledger id, requested topic)


class LedgerStorageContract:
    """Backend-independent LedgerStorage tests (not collected by itself: no Test prefix)."""

    # What a check by another topic's request says: MISMATCH where the ledger records its owner;
    # GONE where the owner is the ledger's location (the filesystem offloader's directory).
    FOREIGN_STATUS = OwnershipStatus.MISMATCH
    MISSING_ID = 999_999

    def test_is_a_ledger_storage_with_a_name(self, backend: LedgerBackend) -> None:
        assert isinstance(backend.storage, LedgerStorage)
        assert isinstance(backend.storage.name, str) and backend.storage.name

    def test_an_owned_ledger_matches_and_is_deleted_once_and_for_all(self, backend: LedgerBackend) -> None:
        lid = backend.add(OWNER)
        req = backend.request(lid, OWNER)
        assert backend.storage.check_owner(req).status is OwnershipStatus.MATCH
        assert backend.storage.delete(req) is DeleteResult.DELETED
        assert not backend.exists(lid)
        assert backend.storage.check_owner(req).status is OwnershipStatus.GONE
        # Deleting again is not an error (at-least-once: the same request comes back).
        assert backend.storage.delete(req) in (DeleteResult.DELETED, DeleteResult.NOT_FOUND)

    def test_a_ledger_of_another_topic_is_a_mismatch_and_stays(self, backend: LedgerBackend) -> None:
        lid = backend.add(OTHER)
        check = backend.storage.check_owner(backend.request(lid, OWNER))
        assert check.status is self.FOREIGN_STATUS, check
        assert backend.exists(lid)
        assert backend.storage.check_owner(backend.request(lid, OTHER)).status is OwnershipStatus.MATCH

    def test_a_missing_ledger_is_gone_and_deleting_it_is_not_an_error(self, backend: LedgerBackend) -> None:
        req = backend.request(self.MISSING_ID, OWNER)
        assert backend.storage.check_owner(req).status is OwnershipStatus.GONE
        assert backend.storage.delete(req) in (DeleteResult.DELETED, DeleteResult.NOT_FOUND)

    def test_deleting_one_ledger_leaves_the_others(self, backend: LedgerBackend) -> None:
        first, second = backend.add(OWNER), backend.add(OWNER)
        backend.storage.delete(backend.request(first, OWNER))
        assert not backend.exists(first) and backend.exists(second)
        assert backend.storage.check_owner(backend.request(second, OWNER)).status is OwnershipStatus.MATCH


