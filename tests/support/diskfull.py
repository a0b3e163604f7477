"""A nearly full filesystem for tests: a small tmpfs when mounting is permitted (root), else an
in-process injection of ENOSPC into os.write for files under a directory.

`SmallDisk.fill()` takes the free space away, `release()` gives it back. With a real tmpfs
every writer on it (broker store, state, index) sees the full disk; the injected fallback only
reaches writes made through os.write in this process (what pulsar_lifecycle.durable uses).
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Callable, Optional


def try_mount_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a tmpfs of `size_mb` MiB on `path`; False when not permitted here."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or os.environ.get("PL_TEST_NO_TMPFS"):  # the latter tests the fallback
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                         capture_output=True, timeout=20)
    return res.returncode == 0


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


class SmallDisk:
    """A directory whose filesystem can be made (nearly) full and freed again."""

    def __init__(self, path: Path, size_mb: int = 20, monkeypatch=None, leave_bytes: int = 0) -> None:
        self.path = path
        self.mounted = try_mount_tmpfs(path, size_mb)
        self._monkeypatch = monkeypatch
        self._leave = leave_bytes
        self._full = False
        self._real_write: Optional[Callable[[int, bytes], int]] = None
        if not self.mounted:
            if monkeypatch is None:
                raise RuntimeError("cannot mount a tmpfs here and no monkeypatch given for the fallback")
            self._install_injection()

    # -- injected fallback --------------------------------------------------------------------
    def _install_injection(self) -> None:
        real = os.write
        self._real_write = real
        root = str(self.path.resolve())

        shorted: set = set()

        def write(fd: int, data) -> int:
            if self._full:
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    target = ""
                if target.startswith(root):
                    # Like a nearly full disk: one short write (the last free bytes), then ENOSPC.
                    if fd not in shorted and len(data) > 5:
                        shorted.add(fd)
                        return real(fd, bytes(memoryview(data)[:5]))
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            shorted.discard(fd)
            return real(fd, data)

        self._monkeypatch.setattr(os, "write", write)

    # -- control ------------------------------------------------------------------------------
    def fill(self) -> None:
        """Take (nearly) all free space away."""
        self._full = True
        if not self.mounted:
            return
        filler = self.path / ".filler"
        block = b"\0" * (1 << 16)
        with open(filler, "ab", buffering=0) as fh:
            while True:
                st = os.statvfs(self.path)
                free = st.f_bavail * st.f_frsize
                if free <= self._leave:
                    break
                chunk = block if free - self._leave >= len(block) else block[: max(1, free - self._leave)]
                try:
                    fh.write(chunk)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        break
                    raise

    def release(self) -> None:
        """Give the space back."""
        self._full = False
        if self.mounted:
            try:
                (self.path / ".filler").unlink()
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.release()
        if self.mounted:
            umount(self.path)
