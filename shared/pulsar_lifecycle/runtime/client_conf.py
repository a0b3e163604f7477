"""Pulsar's client.conf, read as `pulsar-admin` and `pulsar-client` read it, and the settings of a command.

A client.conf is a Java properties file. The keys this package takes are the ones Pulsar's own
tools take: `brokerServiceUrl`, `webServiceUrl`, `authPlugin`, `authParams`,
`tlsTrustCertsFilePath`, `tlsAllowInsecureConnection` (and `tlsEnableHostnameVerification`). The
file is the one named by `--client-conf`, else by the `PULSAR_CLIENT_CONF` environment variable
(as Pulsar's scripts pass it); flags given on the command line win over it.

`settings_for(url, flags, conf)` builds the ClientSettings (runtime/client.py) a command connects
with; `token_role(settings)` is the role a token names (its `sub` claim, read without checking
the signature: only the broker can check it), which errors name.
"""
from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Dict, Mapping, Optional

from ..config.exceptions import ConfigError
from .client import ClientSettings

__all__ = [
    "CLIENT_CONF_ENV", "TOKEN_PLUGINS", "ClientConfError", "client_conf_path", "read_client_conf", "settings_for",
    "token_of", "token_role",
]

CLIENT_CONF_ENV = "PULSAR_CLIENT_CONF"
# The names the C++ client (and the Java one) accept for token authentication.
TOKEN_PLUGINS = ("org.apache.pulsar.client.impl.auth.AuthenticationToken", "token")
_TRUE = {"true", "yes", "1", "on"}


class ClientConfError(ConfigError):
    """A client.conf that cannot be read, or a setting in it (or a flag) that is not usable."""


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6] or ""):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_properties(text: str) -> Dict[str, str]:
    """A Java properties text as a dict: `#`/`!` comments, `key=value`, `key: value` or
    `key value`, a trailing backslash continues a line, backslash escapes (java.util.Properties)."""
    props: Dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line continues
            logical += line[:-1]
            continue
        logical += line
        m = re.match(r"((?:\\.|[^=:\s\\])*)\s*[=:\s]?\s*(.*)$", logical, re.S)
        if m and m.group(1):
            props[_unescape(m.group(1))] = _unescape(m.group(2))
        logical = ""
    if logical:
        m = re.match(r"((?:\\.|[^=:\s\\])*)\s*[=:\s]?\s*(.*)$", logical, re.S)
        if m and m.group(1):
            props[_unescape(m.group(1))] = _unescape(m.group(2))
    return props


def client_conf_path(flag: Optional[str], env: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The client.conf to read: `--client-conf`, else $PULSAR_CLIENT_CONF, else none."""
    env = os.environ if env is None else env
    value = flag or env.get(CLIENT_CONF_ENV) or None
    return Path(value).expanduser() if value else None


def read_client_conf(path: Path) -> Dict[str, str]:
    """The properties of the client.conf at `path` (values stripped); ClientConfError naming the
    file when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ClientConfError(f"cannot read client.conf {path}: {exc.strerror or exc}") from exc
    return {k: v.strip() for k, v in parse_properties(text).items()}


def _flag_bool(value: Optional[str], key: str, source: str) -> Optional[bool]:
    if value is None or value == "":
        return None
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in {"false", "no", "0", "off"}:
        return False
    raise ClientConfError(f"{key}={value!r} in {source} is not true or false")


def settings_for(service_url: Optional[str], *, auth_plugin: Optional[str] = None, auth_params: Optional[str] = None,
                 tls_trust_cert_path: Optional[str] = None, tls_allow_insecure: Optional[bool] = None,
                 conf: Optional[Mapping[str, str]] = None, conf_source: str = "client.conf") -> ClientSettings:
    """The ClientSettings of a command: each flag given wins over the client.conf key of the
    same meaning (`conf`, already read); `service_url` None takes `brokerServiceUrl`."""
    conf = conf or {}
    url = service_url or conf.get("brokerServiceUrl") or ""
    if not url:
        raise ClientConfError("no broker URL: give --service-url, or brokerServiceUrl in a client.conf "
                              f"(--client-conf or ${CLIENT_CONF_ENV})")
    plugin = auth_plugin or conf.get("authPlugin") or None
    params = auth_params if auth_params is not None else (conf.get("authParams") or None)
    if params and not plugin:
        raise ClientConfError("--auth-params (authParams) was given without --auth-plugin (authPlugin)")
    trust = tls_trust_cert_path or conf.get("tlsTrustCertsFilePath") or None
    if trust and not Path(trust).is_file():
        raise ClientConfError(f"the TLS trust certificate {trust} (--tls-trust-cert-path / tlsTrustCertsFilePath) "
                              "is not a readable file")
    insecure = tls_allow_insecure if tls_allow_insecure else _flag_bool(
        conf.get("tlsAllowInsecureConnection"), "tlsAllowInsecureConnection", conf_source)
    hostname = _flag_bool(conf.get("tlsEnableHostnameVerification"), "tlsEnableHostnameVerification", conf_source)
    return ClientSettings(service_url=url, auth_plugin=plugin, auth_params=params,
                          use_tls=url.startswith("pulsar+ssl://"), tls_allow_insecure=bool(insecure),
                          hostname_verification_enabled=bool(hostname), tls_trust_cert_path=trust)


def token_of(settings: ClientSettings) -> Optional[str]:
    """The token a token-authenticated `settings` sends (`token:<jwt>`, `file:///path`, a bare
    JWT, or the JSON `{"token": ...}` form); None for other plugins or none."""
    if not settings.auth_plugin or settings.auth_plugin not in TOKEN_PLUGINS:
        return None
    params = (settings.auth_params or "").strip()
    if params.startswith("{"):
        try:
            params = str(json.loads(params).get("token", ""))
        except (ValueError, AttributeError):
            return None
    if params.startswith("token:"):
        return params[len("token:"):].strip() or None
    if params.startswith("file:"):
        path = params[len("file:"):]
        path = path[2:] if path.startswith("//") else path
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise ClientConfError(f"cannot read the token file {path} (authParams): {exc.strerror or exc}") from exc
    return params or None


def token_role(settings: ClientSettings) -> Optional[str]:
    """The role (claim `sub`) of the token `settings` sends, when it is a readable JWT."""
    token = token_of(settings)
    if not token or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, TypeError):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return str(sub) if sub else None
