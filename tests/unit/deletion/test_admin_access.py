"""AdminAccess: how a command's admin REST calls carry its token and CA, and the one line a 401/403
becomes (the secured-cluster run is tests/integration/test_deploy_secured.py)."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Iterator

import pytest

from pulsar_lifecycle.delaylevel.admin import AdminView
from pulsar_lifecycle.deletion.admin import AdminAccess, AdminRefused, PulsarAdminClient
from pulsar_lifecycle.deletion.model import TopicRef


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        auth = self.headers.get("Authorization", "")
        if not auth:
            status, body = 401, {"reason": "Authentication required"}
        elif auth != "Bearer good":
            status, body = 401, {"reason": "Client is not authorized to Get Stats"}
        else:
            status, body = 200, {"ledgers": [{"ledgerId": 3}], "cursors": {}, "subscriptions": {"s": {"msgBacklog": 4}}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass  # quiet


@pytest.fixture
def admin_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_token_is_sent_and_a_refusal_names_url_role_and_call(admin_url: str) -> None:
    topic = TopicRef.parse("public/default/t")
    good = PulsarAdminClient.connect([admin_url], access=AdminAccess.of_client(
        admin_url, token="good", role="ops", ca_path=None, insecure=False))
    assert good.in_use_ledger_ids(topic) == {3}
    bob = PulsarAdminClient.connect([admin_url], access=AdminAccess.of_client(
        admin_url, token="bad", role="bob", ca_path=None, insecure=False))
    with pytest.raises(AdminRefused, match=rf"admin API at {admin_url} refused role 'bob': HTTP 401 on GET "
                                           r"/admin/v2/persistent/public/default/t/internalStats "
                                           r"\(Client is not authorized to Get Stats\); the role needs"):
        bob.internal_stats(topic)
    anonymous = AdminView.connect(admin_url, 60.0, access=AdminAccess.of_client(
        admin_url, token=None, role=None, ca_path=None, insecure=False))
    with pytest.raises(AdminRefused, match=r"refused no token: HTTP 401 .*\(Authentication required\); give a token"):
        anonymous.subscription_backlog("persistent://public/default/t", "s")
    view = AdminView.connect(admin_url, 60.0, access=AdminAccess(admin_url, "good"))
    assert view.subscription_backlog("persistent://public/default/t", "s") == 4


def test_a_given_ca_wins_over_the_environments_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    session = AdminAccess("https://broker:8443", "t", str(ca)).session()
    assert session.verify == str(ca) and not session.trust_env
    assert session.proxies.get("https") == "http://proxy.example:3128"
    assert AdminAccess("https://broker:8443", insecure=True).session().verify is False
    assert AdminAccess("https://broker:8443").session().trust_env  # no CA given: requests' own defaults
