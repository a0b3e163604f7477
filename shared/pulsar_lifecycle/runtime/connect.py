"""Connecting a command to a broker: bounded, and one clear error when it does not work.

`open_client(url, timeout_s)` waits (up to `timeout_s`) for a broker of `url` to accept TCP
connections, then checks that it speaks the Pulsar protocol: it sends the binary protocol's
CONNECT command and waits for any answer. A port that accepts connections and never answers
(a hung broker, a proxy with nothing behind it, another service) would otherwise hold every
client call for its whole operation timeout while the client logs its reconnects.

`open_client` also takes ClientSettings (runtime/client_conf.py: --auth-plugin, --auth-params,
--tls-trust-cert-path, a client.conf). The probe then speaks TLS for pulsar+ssl:// URLs and sends
the command's token in its CONNECT, so a broker that refuses the credential (or wants one and
got none) is reported at once, in one line naming the URL and the role, instead of after the
client's operation timeout: a broker answers a refused CONNECT with an ERROR
(AuthenticationError) and closes, and the client would retry that until it times out. The client
it returns turns a broker's AuthorizationError into PermissionRefused naming the role, the
action and the topic (runtime/client.py).
"""
from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from typing import Optional, Tuple, Union

import pulsar

from .broker import DEFAULT_CONNECT_TIMEOUT_S, BrokerError, broker_hosts, wait_for_broker
from .client import ClientSettings, client_log_path, make_client
from .client_conf import token_of, token_role

log = logging.getLogger(__name__)

# BaseCommand.Type values of the Pulsar binary protocol (PulsarApi.proto).
_CONNECT = 2
_CONNECTED = 3
_ERROR = 14
_SERVER_ERRORS = {3: "AuthenticationError", 4: "AuthorizationError", 19: "UnsupportedVersionError"}
_PROTOCOL_VERSION = 19  # a broker answers with min(ours, its own)
_CLIENT_VERSION = b"pulsar-lifecycle-probe"
# A broker that accepts connections answers CONNECT within milliseconds; one that has not in this
# long is hung (waiting for a broker that comes up late is wait_for_broker's part).
ANSWER_TIMEOUT_S = 10.0
_CLOSED = "closed the connection without answering the Pulsar protocol's CONNECT"


class AuthenticationRefused(BrokerError):
    """The broker refused the command's credential (or wanted one and got none)."""


class TlsRefused(BrokerError):
    """The TLS handshake with the broker failed (an untrusted certificate, a plain-text port)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def connect_frame(auth: Optional[Tuple[str, bytes]] = None) -> bytes:
    """A CONNECT command frame: [total size][command size][BaseCommand{type, connect}];
    `auth` = (auth_method_name, auth_data), e.g. ("token", b"<jwt>")."""
    connect = b"\x0a" + _varint(len(_CLIENT_VERSION)) + _CLIENT_VERSION + b"\x20" + _varint(_PROTOCOL_VERSION)
    if auth is not None:
        method = auth[0].encode()
        connect += b"\x1a" + _varint(len(auth[1])) + auth[1] + b"\x2a" + _varint(len(method)) + method
    command = b"\x08" + _varint(_CONNECT) + b"\x12" + _varint(len(connect)) + connect
    return struct.pack(">II", 4 + len(command), len(command)) + command


def answer_type(frame: bytes) -> Optional[int]:
    """The BaseCommand type of a frame's command (None when `frame` is no command frame)."""
    if len(frame) < 10:
        return None
    total, size = struct.unpack_from(">II", frame, 0)
    if size + 4 > total or frame[8] != 0x08:
        return None
    value, shift = 0, 0
    for byte in frame[9:19]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    return None


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


def _fields(data: bytes) -> dict:
    """The varint and length-delimited fields of one protobuf message (number -> last value)."""
    out: dict = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out[number], pos = _read_varint(data, pos)
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            out[number], pos = data[pos:pos + size], pos + size
        else:
            raise ValueError(f"wire type {wire}")
    return out


def _command_of(frame: bytes, kind: int, field: int) -> Optional[dict]:
    """The fields of the command a frame of type `kind` carries in BaseCommand field `field`
    (ERROR: 14, CONNECTED: 3); None for a frame of another type or one that does not parse."""
    if answer_type(frame) != kind or len(frame) < 8:
        return None
    size = struct.unpack_from(">I", frame, 4)[0]
    try:
        return _fields(_fields(frame[8:8 + size]).get(field, b""))
    except ValueError:
        return None


def error_answer(frame: bytes) -> Optional[Tuple[str, str]]:
    """(server error name, message) of an ERROR command frame, else None."""
    error = _command_of(frame, _ERROR, 14)
    if error is None:
        return None
    code = error.get(2, 0)
    message = error.get(3, b"")
    return (_SERVER_ERRORS.get(code, f"server error {code}"),
            message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message))


APACHE_PULSAR_SERVER = "Pulsar Server"  # Apache Pulsar's CONNECTED server_version: "Pulsar Server" + its version


def server_version(frame: bytes) -> Optional[str]:
    """The server_version of a CONNECTED command frame (Apache Pulsar: "Pulsar Server4.0.0";
    pulsar-lite: "Pulsar-Lite-..."), else None."""
    connected = _command_of(frame, _CONNECTED, 3)
    version = connected.get(1) if connected is not None else None
    return version.decode("utf-8", "replace") if isinstance(version, bytes) else None


def _ask(host: str, port: int, timeout_s: float, auth: Optional[Tuple[str, bytes]] = None,
         tls: Optional[ssl.SSLContext] = None) -> Tuple[bool, str, Optional[str]]:
    """(answered, what happened, the server_version of a CONNECTED answer) for one CONNECT sent
    to host:port (over TLS with `tls`).

    Raises AuthenticationRefused when the broker answers ERROR AuthenticationError, and
    TlsRefused when the TLS handshake fails."""
    try:
        with socket.create_connection((host, port), timeout=max(0.1, timeout_s)) as raw:
            sock: socket.socket = raw
            if tls is not None:
                try:
                    sock = tls.wrap_socket(raw, server_hostname=host)
                except ssl.SSLError as exc:
                    raise TlsRefused(f"TLS handshake with {host}:{port} failed: {exc.reason or exc}") from exc
            sock.settimeout(max(0.1, timeout_s))
            sock.sendall(connect_frame(auth))
            data = b""
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if len(data) >= 10 and (answer_type(data) is None  # not the protocol: no need for more
                                        or len(data) >= 4 + struct.unpack_from(">I", data, 0)[0]):
                    break
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(512)
                if not chunk:
                    if len(data) >= 10:
                        break
                    return False, _CLOSED, None
                data += chunk
    except (ConnectionResetError, BrokenPipeError):  # closed before or while we sent: the same to us
        return False, _CLOSED, None
    except ssl.SSLError as exc:
        raise TlsRefused(f"TLS with {host}:{port} failed: {exc.reason or exc}") from exc
    except socket.timeout:
        return False, f"accepted the connection but did not answer within {timeout_s:.1f} s", None
    except OSError as exc:
        return False, f"refused the protocol exchange ({exc.strerror or exc})", None
    kind = answer_type(data)
    if kind is None:
        return False, "answered with something that is not the Pulsar binary protocol", None
    refused = error_answer(data)
    if refused is not None and refused[0] == "AuthenticationError":
        raise AuthenticationRefused(refused[1])
    # CONNECTED, or an ERROR / AUTH_CHALLENGE: either way a Pulsar broker answered.
    return True, ("connected" if kind == _CONNECTED else f"answered with command type {kind}"), server_version(data)


def _tls_context(settings: ClientSettings) -> ssl.SSLContext:
    """What the client will trust: the settings' CA file (else the system's), or anything with
    tls_allow_insecure; host names checked only with hostname verification on, as the client."""
    ctx = ssl.create_default_context(cafile=settings.tls_trust_cert_path or None)
    ctx.check_hostname = bool(settings.hostname_verification_enabled) and not settings.tls_allow_insecure
    if settings.tls_allow_insecure:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _credential(settings: Optional[ClientSettings]) -> Tuple[Optional[Tuple[str, bytes]], bool, str]:
    """(what the probe sends, whether an AuthenticationError from it is the command's own, how
    the command authenticates in words)."""
    if settings is None or not settings.auth_plugin:
        return None, True, "no credentials (no --auth-plugin/--auth-params, no authPlugin in a client.conf)"
    token = token_of(settings)
    if token is not None:
        role = token_role(settings)
        return ("token", token.encode()), True, f"the token of role {role!r}" if role else "the token given"
    # Another plugin (TLS, OAuth2, basic): the probe cannot speak it; the client will.
    return None, False, f"{settings.auth_plugin}"


def check_broker_answers(service_url: str, timeout_s: float, settings: Optional[ClientSettings] = None) -> Optional[str]:
    """Raise BrokerError unless a broker of `service_url` answers the protocol within `timeout_s`;
    returns the server_version it answered with (None when not known: no CONNECTED, or a
    pulsar+ssl:// URL without settings, which is only checked for TCP).

    With `settings`: TLS for pulsar+ssl:// URLs as the client will do it (TlsRefused when the
    handshake fails), and the settings' token in the CONNECT (AuthenticationRefused naming the
    URL and the credential when the broker refuses it, or refuses a command with none).
    pulsar+ssl:// URLs without settings are only checked for TCP.
    """
    tls = None
    if service_url.startswith("pulsar+ssl://"):
        if settings is None:
            return None
        tls = _tls_context(settings)
    auth, own, how = _credential(settings)
    problems = []
    for host, port in broker_hosts(service_url):
        try:
            answered, what, version = _ask(host, port, timeout_s, auth, tls)
        except AuthenticationRefused as exc:
            if not own:
                return None  # refused the probe's lack of credentials, not the plugin's
            raise AuthenticationRefused(f"the broker at {service_url} refused authentication with {how}: "
                                        f"{exc}") from None
        except TlsRefused as exc:
            raise TlsRefused(f"no TLS connection to {service_url}: {exc} (trusting "
                             f"{settings.tls_trust_cert_path if settings and settings.tls_trust_cert_path else 'the system CAs'}"
                             "; --tls-trust-cert-path / tlsTrustCertsFilePath)") from None
        if answered:
            return version
        problems.append(f"{host}:{port} {what}")
    raise BrokerError(f"no Pulsar broker answers at {service_url}: {'; '.join(problems)}")


def open_client(target: Union[str, ClientSettings], timeout_s: Optional[float]) -> pulsar.Client:
    """A client of `target` (a service URL, or ClientSettings with credentials and TLS) once a
    broker there accepts connections and answers the protocol (accepting the credential).

    `timeout_s` None (a command's `--connect-timeout` not given): waits up to
    DEFAULT_CONNECT_TIMEOUT_S for a broker that does not answer yet, and a refused connection
    fails at once, naming what to do. An explicit `timeout_s` also waits through refused
    connections (a broker still starting) up to that limit.

    Raises BrokerError naming the URL, what happened and the time waited (an answer is waited
    for at most ANSWER_TIMEOUT_S). Client operations then time out after max(timeout, 5)
    seconds; the client's own log goes to `client_log_path()`.
    """
    settings = target if isinstance(target, ClientSettings) else ClientSettings(service_url=target)
    service_url = settings.service_url
    explicit = timeout_s is not None
    limit = timeout_s if timeout_s is not None else DEFAULT_CONNECT_TIMEOUT_S
    t0 = time.monotonic()
    waited = wait_for_broker(service_url, limit, refused_fails=not explicit)
    if waited >= 0.5:
        log.info("event=broker_accepts url=%s waited_s=%.1f", service_url, waited)
    remaining = limit - (time.monotonic() - t0)
    check_broker_answers(service_url, min(ANSWER_TIMEOUT_S, max(1.0, remaining)), settings)
    log.debug("event=broker_answers url=%s seconds=%.2f client_log=%s", service_url, time.monotonic() - t0,
              client_log_path())
    role = token_role(settings)
    who = f"role {role!r}" if role else ("anonymous" if not settings.auth_plugin else f"the role of {settings.auth_plugin}")
    return make_client(settings, operation_timeout_s=max(5, int(limit)), role=who)
