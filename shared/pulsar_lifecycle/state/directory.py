"""The embedded state backend: one file per key in a directory, written atomically.

Each write goes to a temporary file with checked writes (durable.atomic_write), is fsynced,
renamed over the old one and the directory is fsynced, so a SIGKILL at any moment leaves
either the old or the new value, never a torn one. A write that cannot be made durable
(ENOSPC, EROFS, ...) raises durable.DurableWriteError naming the file and the errno.
"""
from __future__ import annotations

import hashlib
import threading
import urllib.parse
from pathlib import Path
from typing import Optional

from ..durable import NAME_MAX, atomic_write, fsync_dir
from .base import StateError, table_namespace

__all__ = ["DirectoryStateStore", "atomic_write"]  # atomic_write: kept importable from here


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
        name = {"": "%00", ".": "%2E", "..": "%2E%2E"}.get(name, name)
        if len(name) <= NAME_MAX:  # quote() output is ASCII: characters are bytes
            return name
        # Longer names (long producer and topic names in dedup snapshot keys) would fail with
        # ENAMETOOLONG: keep a readable prefix and make the rest a digest of the whole key. Names
        # that fit are unchanged, so stores written before keep their files; a hashed name is
        # always longer than NAME_MAX - 1 - 64 chars of prefix and cannot equal a quoted short key
        # unless that key contains this very digest.
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return f"{name[:NAME_MAX - 1 - len(digest)]}~{digest}"

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
            removed = False
            for p in (self._value_path(key), self._counter_path(key)):
                try:
                    p.unlink()
                    removed = True
                except FileNotFoundError:
                    pass
            if removed:  # a deletion must survive a crash like a write does
                fsync_dir(self._value_path(key).parent)
                fsync_dir(self._counter_path(key).parent)

    def close(self) -> None:
        pass
