"""Connecting a command to a broker: bounded, and one clear error when it does not work.

`open_client(url, timeout_s)` waits (up to `timeout_s`) for a broker of `url` to accept TCP
connections, then checks that it speaks the Pulsar protocol: it sends the binary protocol's
CONNECT command and waits for any answer. A port that accepts connections and never answers
(a hung broker, a proxy with nothing behind it, another service) would otherwise hold every
client call for its whole operation timeout while the client logs its reconnects.
"""
from __future__ import annotations

import logging
import socket
import struct
import time
from typing import Optional, Tuple

import pulsar

from .broker import DEFAULT_CONNECT_TIMEOUT_S, BrokerError, broker_hosts, wait_for_broker
from .client import client_log_path, quiet_client

log = logging.getLogger(__name__)

# BaseCommand.Type values of the Pulsar binary protocol (PulsarApi.proto).
_CONNECT = 2
_CONNECTED = 3
_PROTOCOL_VERSION = 19  # a broker answers with min(ours, its own)
_CLIENT_VERSION = b"pulsar-lifecycle-probe"
# A broker that accepts connections answers CONNECT within milliseconds; one that has not in this
# long is hung (waiting for a broker that comes up late is wait_for_broker's part).
ANSWER_TIMEOUT_S = 10.0
_CLOSED = "closed the connection without answering the Pulsar protocol's CONNECT"


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


def connect_frame() -> bytes:
    """A CONNECT command frame: [total size][command size][BaseCommand{type, connect}]."""
    connect = b"\x0a" + _varint(len(_CLIENT_VERSION)) + _CLIENT_VERSION + b"\x20" + _varint(_PROTOCOL_VERSION)
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


def _ask(host: str, port: int, timeout_s: float) -> Tuple[bool, str]:
    """(answered, what happened) for one CONNECT sent to host:port."""
    try:
        with socket.create_connection((host, port), timeout=max(0.1, timeout_s)) as sock:
            sock.settimeout(max(0.1, timeout_s))
            sock.sendall(connect_frame())
            data = b""
            deadline = time.monotonic() + timeout_s
            while len(data) < 10 and time.monotonic() < deadline:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(64)
                if not chunk:
                    return False, _CLOSED
                data += chunk
    except (ConnectionResetError, BrokenPipeError):  # closed before or while we sent: the same to us
        return False, _CLOSED
    except socket.timeout:
        return False, f"accepted the connection but did not answer within {timeout_s:.1f} s"
    except OSError as exc:
        return False, f"refused the protocol exchange ({exc.strerror or exc})"
    kind = answer_type(data)
    if kind is None:
        return False, "answered with something that is not the Pulsar binary protocol"
    # CONNECTED, or an ERROR / AUTH_CHALLENGE: either way a Pulsar broker answered.
    return True, "connected" if kind == _CONNECTED else f"answered with command type {kind}"


def check_broker_answers(service_url: str, timeout_s: float) -> None:
    """Raise BrokerError unless a broker of `service_url` answers the protocol within `timeout_s`.

    TLS URLs (pulsar+ssl://) are only checked for TCP: the probe speaks plain text.
    """
    if service_url.startswith("pulsar+ssl://"):
        return
    problems = []
    for host, port in broker_hosts(service_url):
        answered, what = _ask(host, port, timeout_s)
        if answered:
            return
        problems.append(f"{host}:{port} {what}")
    raise BrokerError(f"no Pulsar broker answers at {service_url}: {'; '.join(problems)}")


def open_client(service_url: str, timeout_s: Optional[float]) -> pulsar.Client:
    """A client of `service_url` once a broker there accepts connections and answers the protocol.

    `timeout_s` None (a command's `--connect-timeout` not given): waits up to
    DEFAULT_CONNECT_TIMEOUT_S for a broker that does not answer yet, and a refused connection
    fails at once, naming what to do. An explicit `timeout_s` also waits through refused
    connections (a broker still starting) up to that limit.

    Raises BrokerError naming the URL, what happened and the time waited (an answer is waited
    for at most ANSWER_TIMEOUT_S). Client operations then time out after max(timeout, 5)
    seconds; the client's own log goes to `client_log_path()`.
    """
    explicit = timeout_s is not None
    limit = timeout_s if timeout_s is not None else DEFAULT_CONNECT_TIMEOUT_S
    t0 = time.monotonic()
    waited = wait_for_broker(service_url, limit, refused_fails=not explicit)
    if waited >= 0.5:
        log.info("event=broker_accepts url=%s waited_s=%.1f", service_url, waited)
    remaining = limit - (time.monotonic() - t0)
    check_broker_answers(service_url, min(ANSWER_TIMEOUT_S, max(1.0, remaining)))
    log.debug("event=broker_answers url=%s seconds=%.2f client_log=%s", service_url, time.monotonic() - t0,
              client_log_path())
    return quiet_client(service_url, operation_timeout_s=max(5, int(limit)))
