"""The client.conf reader and the settings a command connects with (no broker)."""
from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pulsar_lifecycle.cli.client_options import client_options, client_settings, conf_default
from pulsar_lifecycle.runtime.client_conf import (
    ClientConfError,
    client_conf_path,
    parse_properties,
    read_client_conf,
    settings_for,
    token_of,
    token_role,
)
from pulsar_lifecycle.runtime.connect import connect_frame, error_answer
from pulsar_lifecycle.runtime.pulsar_security import make_token

TOKEN = make_token(b"k" * 32, "alice")
PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def test_properties_as_java_reads_them() -> None:
    text = ("# comment\n! also a comment\n\nbrokerServiceUrl=pulsar+ssl://b:6651/\n"
            "webServiceUrl : https://b:8443/\nauthPlugin " + PLUGIN + "\n"
            "authParams=token:abc\\\n    def\n  tlsAllowInsecureConnection = false  \nkey\\=x=1\nempty=\n")
    props = parse_properties(text)
    assert props["brokerServiceUrl"] == "pulsar+ssl://b:6651/"
    assert props["webServiceUrl"] == "https://b:8443/"
    assert props["authPlugin"] == PLUGIN
    assert props["authParams"] == "token:abcdef"  # a trailing backslash continues the line
    assert props["tlsAllowInsecureConnection"].strip() == "false"
    assert props["key=x"] == "1" and props["empty"] == ""


def test_client_conf_path_flag_then_env(tmp_path: Path) -> None:
    assert client_conf_path("a.conf", {"PULSAR_CLIENT_CONF": "b.conf"}) == Path("a.conf")
    assert client_conf_path(None, {"PULSAR_CLIENT_CONF": "b.conf"}) == Path("b.conf")
    assert client_conf_path(None, {}) is None
    with pytest.raises(ClientConfError, match="cannot read client.conf"):
        read_client_conf(tmp_path / "missing.conf")


def test_flags_win_over_the_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    conf = {"brokerServiceUrl": "pulsar+ssl://b:6651", "authPlugin": PLUGIN, "authParams": "token:fromfile",
            "tlsTrustCertsFilePath": str(ca), "tlsAllowInsecureConnection": "true"}
    s = settings_for(None, conf=conf)
    assert (s.service_url, s.auth_params, s.tls_trust_cert_path, s.tls_allow_insecure, s.use_tls) == (
        "pulsar+ssl://b:6651", "token:fromfile", str(ca), True, True)
    s = settings_for("pulsar://other:6650", auth_params=f"token:{TOKEN}", conf=conf)
    assert s.service_url == "pulsar://other:6650" and s.auth_params == f"token:{TOKEN}" and not s.use_tls
    assert token_role(s) == "alice"


def test_unusable_settings_name_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ClientConfError, match="no broker URL"):
        settings_for(None, conf={})
    with pytest.raises(ClientConfError, match="without --auth-plugin"):
        settings_for("pulsar://b:6650", auth_params="token:x")
    with pytest.raises(ClientConfError, match="not a readable file"):
        settings_for("pulsar+ssl://b:6651", tls_trust_cert_path=str(tmp_path / "nope.pem"))
    with pytest.raises(ClientConfError, match="tlsAllowInsecureConnection"):
        settings_for("pulsar://b:6650", conf={"tlsAllowInsecureConnection": "maybe"})


def test_token_forms(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    for params in (f"token:{TOKEN}", f"file://{f}", TOKEN, '{"token": "%s"}' % TOKEN):
        s = settings_for("pulsar://b:6650", auth_plugin="token", auth_params=params)
        assert token_of(s) == TOKEN and token_role(s) == "alice", params
    assert token_of(settings_for("pulsar://b:6650", auth_plugin="org.x.OAuth2", auth_params="{}")) is None


def test_probe_frames() -> None:
    frame = connect_frame(("token", TOKEN.encode()))
    assert TOKEN.encode() in frame and b"token" in frame
    # What Pulsar 4.0.0 answered a CONNECT without credentials (captured from the secured standalone).
    refused = (b'\x00\x00\x00-\x00\x00\x00)\x08\x0er%\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x10\x03'
               b'\x1a\x16Failed to authenticate')
    assert error_answer(refused) == ("AuthenticationError", "Failed to authenticate")


def _command() -> click.Command:
    @click.command()
    @click.option("--service-url", required=True, default=conf_default("brokerServiceUrl"))
    @client_options
    def cmd(service_url: str) -> None:
        s = client_settings(service_url)
        click.echo(f"{s.service_url} {s.auth_plugin} {s.auth_params} {s.tls_trust_cert_path} {s.tls_allow_insecure}")
    return cmd


def test_command_options_over_client_conf(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    conf = tmp_path / "client.conf"
    conf.write_text(f"brokerServiceUrl=pulsar+ssl://b:6651\nauthPlugin={PLUGIN}\nauthParams=token:file\n"
                    f"tlsTrustCertsFilePath={ca}\n")
    runner = CliRunner()
    res = runner.invoke(_command(), [], env={"PULSAR_CLIENT_CONF": str(conf)})
    assert res.output.split() == ["pulsar+ssl://b:6651", PLUGIN, "token:file", str(ca), "False"], res.output
    res = runner.invoke(_command(), ["--client-conf", str(conf), "--service-url", "pulsar://x:1",
                                     "--auth-params", "token:flag", "--tls-allow-insecure"], env={})
    assert res.output.split() == ["pulsar://x:1", PLUGIN, "token:flag", str(ca), "True"], res.output
    res = runner.invoke(_command(), [], env={"PULSAR_CLIENT_CONF": ""})
    assert res.exit_code != 0 and "--service-url" in f"{res.output} {res.exception}"
    res = runner.invoke(_command(), ["--client-conf", str(tmp_path / "none.conf")], env={})
    assert res.exit_code == 2 and "cannot read client.conf" in res.output
