"""A secured real Pulsar standalone (registered by tests/conftest.py): TLS, tokens, authorization.

`secured_pulsar` is one standalone per test session (PulsarStandalone(security=SecuritySetup()):
a CA and broker certificate for 127.0.0.1, AuthenticationProviderToken, authorizationEnabled,
super-user role `superuser`). Skipped when the run leaves real Pulsar out (TEST_BROKERS=lite).
`grant(standalone, topic_or_namespace, role, actions)` grants through the admin REST API over
TLS as the super user.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Iterable, Iterator

import pytest

from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone, SecuritySetup

from .broker_fixtures import broker_kinds


def admin_call(standalone: PulsarStandalone, method: str, path: str, body: object = None) -> bytes:
    """One admin REST call over https with the super user's token; the answer's body."""
    data = None if body is None else json.dumps(body).encode()
    headers = {**standalone.admin_headers(), "Content-Type": "application/json"}
    req = urllib.request.Request(f"{standalone.admin_url_tls}{path}", data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30, context=standalone.ssl_context()) as resp:
        return resp.read()


def grant(standalone: PulsarStandalone, topic: str, role: str, actions: Iterable[str] = ("produce",)) -> None:
    """Grant `role` `actions` on a persistent topic (`persistent://t/n/x`), created first when
    it does not exist (Pulsar grants on existing topics only)."""
    path = topic.replace("persistent://", "")
    try:
        admin_call(standalone, "PUT", f"/admin/v2/persistent/{path}")
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # 409: it exists
            raise
    admin_call(standalone, "POST", f"/admin/v2/persistent/{path}/permissions/{role}", list(actions))


def grant_namespace(standalone: PulsarStandalone, namespace: str, role: str,
                    actions: Iterable[str] = ("produce", "consume")) -> None:
    """Grant `role` `actions` on every topic of `namespace` (`tenant/ns`)."""
    admin_call(standalone, "POST", f"/admin/v2/namespaces/{namespace}/permissions/{role}", list(actions))


SECURED_GROUP = "secured-standalone"


@pytest.fixture(scope="session")
def secured_pulsar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarStandalone]:
    """A secured standalone for the session (no function worker): its modules share it, and are
    marked `xdist_group(SECURED_GROUP)` so that one xdist worker runs them all on one standalone.
    Each test uses topics of its own (`unique`) and grants on those only."""
    if "pulsar" not in broker_kinds():
        pytest.skip("not on pulsar: TEST_BROKERS leaves real Pulsar out")
    p = PulsarStandalone(data_dir=tmp_path_factory.mktemp("secured"), security=SecuritySetup(),
                         log_level=os.environ.get("TEST_PULSAR_LOG_LEVEL", "warn"))
    p.start()
    yield p
    p.stop(remove_data=not os.environ.get("TEST_KEEP_BROKER_DATA"))
