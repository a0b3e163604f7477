"""A minimal ZooKeeper client (the jute wire protocol over one socket) for fault injection in tests.

The real Pulsar standalone keeps BookKeeper's ledger metadata in ZooKeeper, one znode per
ledger. A child znode under a ledger's znode makes every delete of that ledger fail (ZooKeeper
refuses to delete a znode that has children): the broker's own delete is then lost, as in the
orphan case PIP-186 is about, until the child is removed again. Only the calls the tests need:
create, delete, exists and get_children, each synchronous, no watches.
"""
from __future__ import annotations

import socket
import struct
from typing import List, Optional, Tuple

_CREATE, _DELETE, _EXISTS, _GET_CHILDREN, _CLOSE = 1, 2, 3, 8, -11
_OPEN_ACL_UNSAFE = (31, "world", "anyone")
NO_NODE = -101


class ZooKeeperError(Exception):
    """A request answered with a ZooKeeper error code."""

    def __init__(self, op: str, path: str, code: int) -> None:
        super().__init__(f"zookeeper {op} {path} failed with error code {code}")
        self.code = code


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack(">i", len(raw)) + raw


def _buffer(b: Optional[bytes]) -> bytes:
    return struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b


class ZooKeeperClient:
    """One session on `host:port`; use as a context manager."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, session_ms: int = 10_000) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._xid = 0
        connect = struct.pack(">iqiq", 0, 0, session_ms, 0) + _buffer(b"\x00" * 16) + b"\x00"
        self._send(connect)
        self._recv()  # ConnectResponse: a session was granted (a refused one closes the socket)

    def _send(self, payload: bytes) -> None:
        self._sock.sendall(struct.pack(">i", len(payload)) + payload)

    def _read_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("zookeeper closed the connection")
            out += chunk
        return out

    def _recv(self) -> bytes:
        (n,) = struct.unpack(">i", self._read_exact(4))
        return self._read_exact(n)

    def _call(self, op: int, body: bytes, what: str, path: str) -> Tuple[int, bytes]:
        self._xid += 1
        self._send(struct.pack(">ii", self._xid, op) + body)
        while True:
            reply = self._recv()
            xid, _zxid, err = struct.unpack(">iqi", reply[:16])
            if xid == self._xid:
                return err, reply[16:]
            # xid -1 (watch events) and -2 (pings) are not ours: skip them.

    def create(self, path: str, data: bytes = b"") -> None:
        """Create a persistent znode (open ACL)."""
        perms, scheme, ident = _OPEN_ACL_UNSAFE
        body = _string(path) + _buffer(data) + struct.pack(">i", 1) + struct.pack(">i", perms)
        body += _string(scheme) + _string(ident) + struct.pack(">i", 0)
        err, _ = self._call(_CREATE, body, "create", path)
        if err:
            raise ZooKeeperError("create", path, err)

    def delete(self, path: str) -> None:
        """Delete a znode (any version)."""
        err, _ = self._call(_DELETE, _string(path) + struct.pack(">i", -1), "delete", path)
        if err:
            raise ZooKeeperError("delete", path, err)

    def exists(self, path: str) -> bool:
        """Whether the znode exists."""
        err, _ = self._call(_EXISTS, _string(path) + b"\x00", "exists", path)
        if err == NO_NODE:
            return False
        if err:
            raise ZooKeeperError("exists", path, err)
        return True

    def get_children(self, path: str) -> List[str]:
        """Names of the znode's children."""
        err, body = self._call(_GET_CHILDREN, _string(path) + b"\x00", "get_children", path)
        if err:
            raise ZooKeeperError("get_children", path, err)
        (count,) = struct.unpack(">i", body[:4])
        names, pos = [], 4
        for _ in range(count):
            (n,) = struct.unpack(">i", body[pos:pos + 4])
            names.append(body[pos + 4:pos + 4 + n].decode("utf-8"))
            pos += 4 + n
        return names

    def close(self) -> None:
        """End the session and close the socket."""
        try:
            self._call(_CLOSE, b"", "close", "")
        except (OSError, ConnectionError):
            pass
        self._sock.close()

    def __enter__(self) -> "ZooKeeperClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ledger_znode(zk: ZooKeeperClient, ledger_id: int, root: str = "/ledgers") -> str:
    """The znode of a ledger's metadata under BookKeeper's hierarchical or long-hierarchical layout."""
    short = f"{ledger_id:010d}"
    long = f"{ledger_id:019d}"
    candidates = [f"{root}/{short[:2]}/{short[2:6]}/L{short[6:]}",
                  f"{root}/{long[:3]}/{long[3:7]}/{long[7:11]}/{long[11:15]}/L{long[15:]}"]
    for path in candidates:
        if zk.exists(path):
            return path
    raise ZooKeeperError("find ledger", f"{ledger_id} (tried {candidates})", NO_NODE)


def established_connections_to(port: int) -> int:
    """TCP connections on this host in state ESTABLISHED whose remote end is `port` (the clients
    of a ZooKeeper listening there), from /proc/net/tcp and /proc/net/tcp6."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count
