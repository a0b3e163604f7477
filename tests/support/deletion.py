"""Fixtures (registered in conftest.py) and request builders shared by the deletion tests."""
from __future__ import annotations

import os
from typing import Iterator, Optional

import pytest

from pulsar_lifecycle.deletion.model import (
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
)
from servers.bookie_http_server import BookieHttpServer
from servers.internal_stats_server import InternalStatsServer

S3_CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def req(topic: str, ledger_id: int, component: LedgerComponent = LedgerComponent.MANAGED_LEDGER,
        ltype: LedgerType = LedgerType.LEDGER, uuid: Optional[str] = None, driver: Optional[str] = None,
        check: bool = True, **props: str) -> PendingDeleteLedgerInfo:
    """A request; an offload uuid makes an OFFLOAD_LEDGER context."""
    ctx = None
    if uuid is not None:
        ctx = LedgerContext(ledger_id, offload_context=OffloadContext.from_uuid(uuid, driver_name=driver))
    return PendingDeleteLedgerInfo(topic, component, ltype, ledger_id, ctx, check, dict(props))


@pytest.fixture
def admin_server() -> Iterator[InternalStatsServer]:
    with InternalStatsServer() as s:
        yield s


@pytest.fixture
def bookie_server() -> Iterator[BookieHttpServer]:
    with BookieHttpServer() as s:
        yield s


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """moto in server mode on 127.0.0.1; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str):
    """A boto3 client for the moto server, reached over the network like a real endpoint."""
    from pulsar_lifecycle.deletion.storage.s3 import make_s3_client

    return make_s3_client(endpoint, "us-east-1", **S3_CREDS)
