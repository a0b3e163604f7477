"""The connection options every command that connects takes, as Pulsar's own tools spell them.

`@client_options` adds `--auth-plugin`, `--auth-params`, `--tls-trust-cert-path`,
`--tls-allow-insecure` and `--client-conf` (default: $PULSAR_CLIENT_CONF) to a click command
without adding parameters to its function; `client_settings(service_url)` inside the command is
the ClientSettings to hand to `runtime.connect.open_client`: the flags given, over the client.conf
keys (runtime/client_conf.py). `conf_default("brokerServiceUrl")` is a default for `--service-url`
(and `"webServiceUrl"` for `--admin-url`) taken from that client.conf, as pulsar-admin takes its
URLs from it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import click

from ..runtime.client import ClientSettings
from ..runtime.client_conf import (
    CLIENT_CONF_ENV,
    ClientConfError,
    client_conf_path,
    read_client_conf,
    settings_for,
)

__all__ = ["client_options", "client_settings", "conf_default"]

_META = "pulsar_lifecycle.cli.client_options"


def _options(ctx: Optional[click.Context]) -> Dict[str, Any]:
    if ctx is None:
        return {}
    return ctx.find_root().meta.setdefault(_META, {})


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    _options(ctx)[param.name or ""] = value
    return value


def _load_conf(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:
    path = client_conf_path(value)
    opts = _options(ctx)
    opts["conf_source"] = str(path) if path else ""
    try:
        opts["conf"] = read_client_conf(path) if path is not None else {}
    except ClientConfError as exc:
        where = "--client-conf" if value else f"${CLIENT_CONF_ENV}"
        raise click.BadParameter(str(exc), param_hint=where) from exc
    return value


def client_options(f: Any) -> Any:
    """The connection options of Pulsar's tools, stored for `client_settings` (not passed to `f`)."""
    f = click.option("--tls-allow-insecure", is_flag=True, default=False, expose_value=False, callback=_store,
                     help="Accept any TLS certificate from the broker (tlsAllowInsecureConnection).")(f)
    f = click.option("--tls-trust-cert-path", default=None, expose_value=False, callback=_store,
                     type=click.Path(exists=True, dir_okay=False),
                     help="CA certificate (PEM) the broker's TLS certificate must chain to, for pulsar+ssl:// "
                          "and https:// URLs (tlsTrustCertsFilePath).")(f)
    f = click.option("--auth-params", default=None, expose_value=False, callback=_store,
                     help="Parameters of --auth-plugin, e.g. token:<jwt> or file:///path/to/token (authParams).")(f)
    f = click.option("--auth-plugin", default=None, expose_value=False, callback=_store,
                     help="Authentication plugin, e.g. org.apache.pulsar.client.impl.auth.AuthenticationToken "
                          "(authPlugin).")(f)
    f = click.option("--client-conf", default=None, expose_value=False, callback=_load_conf, is_eager=True,
                     type=click.Path(dir_okay=False),
                     help=f"A Pulsar client.conf (brokerServiceUrl, webServiceUrl, authPlugin, authParams, "
                          f"tlsTrustCertsFilePath, tlsAllowInsecureConnection) [default: ${CLIENT_CONF_ENV}]; "
                          "flags given win over it.")(f)
    return f


def conf_default(key: str) -> Callable[[], Optional[str]]:
    """A click default: `key` of the command's client.conf (None when there is none)."""
    def default() -> Optional[str]:
        ctx = click.get_current_context(silent=True)
        opts = _options(ctx)
        if "conf" not in opts:  # --client-conf is eager, so this is a command without it
            path = client_conf_path(None)
            return read_client_conf(path).get(key) if path else None
        return opts["conf"].get(key) or None
    return default


def client_settings(service_url: Optional[str]) -> ClientSettings:
    """The ClientSettings for `service_url` (None: the client.conf's brokerServiceUrl) from the
    current command's connection options. Outside a command: $PULSAR_CLIENT_CONF only."""
    opts = _options(click.get_current_context(silent=True))
    conf = opts.get("conf")
    source = opts.get("conf_source") or ""
    if conf is None:
        path = client_conf_path(None, os.environ)
        conf, source = (read_client_conf(path), str(path)) if path else ({}, "")
    return settings_for(service_url, auth_plugin=opts.get("auth_plugin"), auth_params=opts.get("auth_params"),
                        tls_trust_cert_path=opts.get("tls_trust_cert_path"),
                        tls_allow_insecure=opts.get("tls_allow_insecure") or None, conf=conf,
                        conf_source=str(Path(source)) if source else "client.conf")

