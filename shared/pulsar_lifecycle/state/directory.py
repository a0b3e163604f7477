"""The embedded state backend: one file per key in a directory, written atomically.

Each write goes to a temporary file, is fsynced, renamed over the old one and the
directory is fsynced, so a SIGKILL at any moment leaves either the old or the new
value, never a torn one.
"""
from __future__ import annotations

import os
import threading
import urllib.parse
from pathlib import Path
from typing import Optional

from .base import StateError, table_namespace


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves the old or the new content."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class DirectoryStateStore:
    """State for one function table kept under `<root>/<tenant_ns>/<table>/`."""

    def __init__(self, root: Path, tenant: str, namespace: str, table: str) -> None:
        self.path = Path(root) / table_namespace(tenant, namespace) / table
        try:
            (self.path / "values").mkdir(parents=True, exist_ok=True)
            (self.path / "counters").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create state directory {self.path}: {exc}") from exc
        self._lock = threading.Lock()

    @staticmethod
    def _name(key: str) -> str:
        # quote() keeps any key (slashes, unicode) a single safe file name.
        name = urllib.parse.quote(key, safe="")
        # "." and ".." would name the directory itself or its parent.
        return {"": "%00", ".": "%2E", "..": "%2E%2E"}.get(name, name)

    def _value_path(self, key: str) -> Path:
        return self.path / "values" / self._name(key)

    def _counter_path(self, key: str) -> Path:
        return self.path / "counters" / self._name(key)

    def put(self, key: str, value: bytes) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8")
        with self._lock:
            atomic_write(self._value_path(key), bytes(value))

    def get(self, key: str) -> Optional[bytes]:
        try:
            return self._value_path(key).read_bytes()
        except FileNotFoundError:
            return None

    def incr(self, key: str, amount: int) -> None:
        with self._lock:
            current = self.get_counter(key) or 0
            atomic_write(self._counter_path(key), str(current + int(amount)).encode())

    def get_counter(self, key: str) -> Optional[int]:
        try:
            return int(self._counter_path(key).read_text())
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        with self._lock:
            for p in (self._value_path(key), self._counter_path(key)):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass

    def close(self) -> None:
        pass
