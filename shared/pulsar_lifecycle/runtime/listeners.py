"""Who listens on a local TCP port: read from /proc, no external tool.

A port that is taken is named with the process holding it, so an operator can stop it or pick
another port at once. /proc/net/tcp and tcp6 list the listening sockets (state 0A) with their
socket inodes; the process whose /proc/<pid>/fd has a link to `socket:[inode]` holds it.
Processes of other users cannot be looked into: then the holder is unknown.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Set, Tuple

__all__ = ["PortHolder", "port_holder"]

_LISTEN = "0A"


@dataclass(frozen=True)
class PortHolder:
    """The process that listens on a port."""

    pid: int
    argv: Tuple[str, ...]  # its command line (empty when it cannot be read)

    @property
    def command(self) -> str:
        """The command line, arguments joined by spaces, shortened to 200 characters."""
        text = " ".join(self.argv)
        return text if len(text) <= 200 else text[:197] + "..."

    def describe(self) -> str:
        """`process 1234 (command line)`, as error messages name it."""
        return f"process {self.pid} ({self.command})" if self.argv else f"process {self.pid}"


def _listening_inodes(port: int, proc: Path) -> Set[str]:
    inodes: Set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = fields[1].rsplit(":", 1)[-1]
            try:
                if int(local_port, 16) == port and fields[9] != "0":
                    inodes.add(fields[9])
            except ValueError:
                continue
    return inodes


def _pids(proc: Path) -> Iterator[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def _argv(pid: int, proc: Path) -> Tuple[str, ...]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def port_holder(port: int, proc: Path = Path("/proc")) -> Optional[PortHolder]:
    """The process listening on TCP `port` (any local address), or None when no listener of it
    can be seen (none, another user's process, or no /proc)."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in _pids(proc):
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in targets:
                    return PortHolder(pid, _argv(pid, proc))
            except OSError:
                continue
    return None
