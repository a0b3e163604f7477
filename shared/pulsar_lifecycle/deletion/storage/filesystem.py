"""Offloaded ledgers of the filesystem offloader (reference §5.4).

Layout: `<storageBasePath>/<ManagedLedgerName>/<ledgerId>-<uuid>`, a Hadoop MapFile directory.
The owner is part of the path, so the path built from the request's own topic can only reach
that topic's ledgers; names are checked so nothing outside the base directory is touched.
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from ..model import InvalidRequestError, PendingDeleteLedgerInfo
from ..ports import DeleteResult, OwnershipCheck, OwnershipStatus, StorageError

log = logging.getLogger(__name__)


@dataclass
class FileSystemOffloadStorage:
    """LedgerStorage for OFFLOAD_LEDGER requests of the filesystem offloader."""

    base_path: str
    name: str = "filesystem"

    def __post_init__(self) -> None:
        if not self.base_path:
            raise ValueError("the filesystem offloader needs a base path")
        self.base_path = os.path.realpath(self.base_path)

    def path_for(self, request: "PendingDeleteLedgerInfo") -> str:
        """The ledger's directory; InvalidRequestError if it would leave the base directory."""
        assert request.context is not None and request.context.offload_context is not None
        oc = request.context.offload_context
        ml = request.topic.managed_ledger_name
        declared = oc.driver_metadata.get("ManagedLedgerName")
        if declared is not None and declared != ml:
            raise InvalidRequestError(f"ledger {request.ledger_id}: driver metadata names {declared!r}, topic is {ml!r}")
        path = os.path.realpath(os.path.join(self.base_path, ml, f"{request.ledger_id}-{oc.uuid}"))
        if os.path.commonpath([path, self.base_path]) != self.base_path:
            raise InvalidRequestError(f"ledger {request.ledger_id}: path {path!r} escapes {self.base_path!r}")
        return path

    def check_owner(self, request: "PendingDeleteLedgerInfo") -> OwnershipCheck:
        """The owner is the path: present means owned by the request's topic."""
        path = self.path_for(request)
        if not os.path.lexists(path):
            return OwnershipCheck(OwnershipStatus.GONE, f"{path} is gone")
        return OwnershipCheck(OwnershipStatus.MATCH, f"{path} is under the topic's directory")

    def delete(self, request: "PendingDeleteLedgerInfo") -> DeleteResult:
        """Remove the MapFile directory (or a plain file)."""
        path = self.path_for(request)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            return DeleteResult.NOT_FOUND
        except OSError as exc:
            raise StorageError(f"filesystem delete {path}: {exc}") from None
        log.info("filesystem delete topic=%s ledger=%d path=%s", request.topic_name, request.ledger_id, path)
        return DeleteResult.DELETED
