"""runtime/connect.py: the CONNECT probe that tells a broker from a port that never answers."""
from __future__ import annotations

import socket
import struct
import threading
from typing import Callable, Iterator

import pytest

from pulsar_lifecycle.runtime.broker import BrokerError
from pulsar_lifecycle.runtime.connect import answer_type, check_broker_answers, connect_frame, server_version
from pulsar_lifecycle.runtime.localrun import runs_apache_pulsar


def connected_frame() -> bytes:
    command = b"\x08\x03\x1a\x04\x0a\x02ok"  # BaseCommand{type=CONNECTED, connected{server_version="ok"}}
    return struct.pack(">II", 4 + len(command), len(command)) + command


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    socks = []

    def start(handle: Callable[[socket.socket], None]) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        socks.append(sock)

        def serve() -> None:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            handle(conn)
        threading.Thread(target=serve, daemon=True).start()
        return f"pulsar://127.0.0.1:{sock.getsockname()[1]}"
    yield start
    for s in socks:
        s.close()


def test_the_frames():
    assert answer_type(connect_frame()) == 2
    assert answer_type(connected_frame()) == 3
    assert answer_type(b"HTTP/1.1 400 Bad Request\r\n") is None


def test_a_broker_that_answers(server):
    def answer(conn: socket.socket) -> None:
        conn.recv(256)
        conn.sendall(connected_frame())
    assert check_broker_answers(server(answer), 5) == "ok"  # its CONNECTED's server_version


def test_the_server_version_tells_apache_pulsar_from_pulsar_lite():
    def connected(version: bytes) -> bytes:  # BaseCommand{type=CONNECTED, connected{server_version, protocol 19}}
        inner = b"\x0a" + bytes([len(version)]) + version + b"\x10\x13"
        command = b"\x08\x03\x1a" + bytes([len(inner)]) + inner
        return struct.pack(">II", 4 + len(command), len(command)) + command

    assert server_version(connected(b"Pulsar Server4.0.0")) == "Pulsar Server4.0.0"
    assert server_version(connect_frame()) is None  # not a CONNECTED
    assert server_version(b"HTTP/1.1 400 Bad Request\r\n") is None
    # Apache Pulsar (its Commands.newConnectedCommand: "Pulsar Server" + the version) needs no
    # consumer-id skip; pulsar-lite and an unknown answer keep it. A remote URL with no answer
    # known falls back to /proc, which cannot tell a remote broker: the skip stays.
    assert runs_apache_pulsar("pulsar://broker.example.com:6650", "Pulsar Server4.0.0")
    assert not runs_apache_pulsar("pulsar://127.0.0.1:6650", "Pulsar-Lite-0.1.0")
    assert not runs_apache_pulsar("pulsar://broker.example.com:6650", None)


@pytest.mark.parametrize("handle, needle", [
    (lambda conn: None, "did not answer"),  # holds the connection, says nothing
    (lambda conn: conn.close(), "closed the connection"),
    (lambda conn: (conn.recv(256), conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")), "not the Pulsar binary protocol"),
])
def test_a_port_that_is_no_broker(server, handle, needle):
    held = []
    url = server(lambda conn: (held.append(conn), handle(conn)))
    with pytest.raises(BrokerError) as err:
        check_broker_answers(url, 0.5)
    assert needle in str(err.value) and url in str(err.value)
