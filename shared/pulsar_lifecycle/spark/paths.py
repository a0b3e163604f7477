"""The paths a Spark job takes, fixed on the driver before any task sees them.

Executors do not share the driver's working directory: on a cluster (and on `local-cluster`,
whose executors are separate JVMs) each runs in a work directory of its own, so a relative
path names a different file on every executor, and a plain absolute path means the cluster's
default filesystem (HDFS on YARN), not the driver's disk. So every path is resolved once, on
the driver: a path without a scheme (or a `file:` URL) becomes `file:///<absolute path>`, and
URLs with another scheme (`hdfs://`, `s3a://`, `bk://`, ...) are kept as given.

A local path only helps executors that run on this machine (local masters) or that mount the
same filesystem at the same path. `require_reachable` refuses, before any work, a local path
that the executors of a remote master cannot reach: one on a filesystem that is not a network
filesystem (`--shared-fs` vouches for one this module does not recognise).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

from .errors import SparkJobError

__all__ = ["JobPath", "file_url", "filesystem_of", "is_same_host_master", "require_reachable", "resolve",
           "resolve_all", "resolve_store"]

# Filesystem types (as /proc/self/mountinfo names them) that every node of a cluster can mount
# at the same path.
SHARED_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph-fuse", "lustre", "glusterfs", "fuse.glusterfs",
    "gpfs", "beegfs", "afs", "ocfs2", "gfs2", "orangefs", "pvfs2", "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse",
    "fuse.sshfs", "fuse.alluxio-fuse", "fuse.weka", "wekafs",
})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


@dataclass(frozen=True)
class JobPath:
    """One path as given and as every task sees it.

    Attributes:
        given: the text the user typed.
        url: what Spark and the tasks get: `file:///<absolute path>` or the URL as given.
        local: the absolute path on this machine for a local path, None for other URLs.
    """

    given: str
    url: str
    local: Optional[Path]

    def __str__(self) -> str:
        return self.url


def file_url(path: os.PathLike | str) -> str:
    """`file:///<absolute path>` of a local path (relative ones against this process's directory)."""
    return "file://" + str(Path(os.path.abspath(os.path.expanduser(os.fspath(path)))))


def resolve(text: str) -> JobPath:
    """`text` resolved on the driver: a local path (or `file:` URL) made absolute, other URLs as given."""
    m = _SCHEME.match(text)
    if m and len(m.group(1)) > 1:  # one letter: a Windows drive, not a scheme
        if m.group(1).lower() != "file":
            return JobPath(text, text, None)
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise SparkJobError(f"{text}: a file: URL names a path of this machine (file:///path), not host "
                                f"{parsed.netloc!r}")
        raw = parsed.path or "."
    else:
        raw = text
    local = Path(os.path.abspath(os.path.expanduser(raw)))
    return JobPath(text, "file://" + str(local), local)


def resolve_all(texts: Iterable[str]) -> List[JobPath]:
    """resolve() of each."""
    return [resolve(t) for t in texts]


def resolve_store(text: str) -> JobPath:
    """A snapshot store URL: `bk://...` as given, a directory or `file:` URL made absolute."""
    path = resolve(text)
    if path.local is None and not text.startswith("bk://"):
        raise SparkJobError(f"snapshot store {text!r}: use a directory path, file:///path or "
                            "bk://host:port/tenant/namespace/name")
    return path


def is_same_host_master(master: str) -> bool:
    """True when every executor of `master` runs on this machine: `local`, `local[N]`,
    `local-cluster[...]`, or a standalone master on a loopback address (its workers must be here)."""
    m = master.strip()
    if m == "local" or m.startswith(("local[", "local-cluster[")):
        return True
    if m.startswith("spark://"):
        hosts = [h.strip() for h in m[len("spark://"):].split(",") if h.strip()]
        return bool(hosts) and all(h.startswith(_LOOPBACK) for h in hosts)
    return False


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> List[Tuple[str, str]]:
    """(mount point, filesystem type) of this process's mounts."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        out.append((_unescape(fields[4]), right.split()[0]))
    return out


def filesystem_of(path: Path) -> Tuple[str, str]:
    """(filesystem type, mount point) holding `path` (or its nearest existing parent);
    ("unknown", "/") when the mount table cannot be read."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    real = os.path.realpath(probe)
    best, fstype = "", "unknown"
    for point, kind in _mounts():
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, kind
    return fstype, best or "/"


URL_HINT = "an hdfs:// or s3a:// URL"
STORE_HINT = "the writer's BookKeeper table service, bk://host:4181/tenant/namespace/name"


def require_reachable(master: str, paths: Sequence[Tuple[str, JobPath]], shared_fs: bool = False,
                      hint: str = URL_HINT) -> None:
    """Refuse, before any task runs, a local path the executors of `master` cannot reach.

    `paths` are (what it is, e.g. "--store", path) pairs of paths the executors read or write.
    Same-host masters reach every local path; other masters only those on a network filesystem
    (SHARED_FS_TYPES), or any when `shared_fs` (the operator vouches that the filesystem is
    mounted at the same path on every node). `hint` names the other kind of shared storage."""
    if shared_fs or is_same_host_master(master):
        return
    for what, path in paths:
        if path.local is None:
            continue
        fstype, point = filesystem_of(path.local)
        if fstype in SHARED_FS_TYPES:
            continue
        raise SparkJobError(
            f"{what} {path.given} is {path.local} on this machine's {fstype} filesystem ({point}): the executors "
            f"of {master} cannot reach it; use shared storage (a directory on a filesystem every node mounts at "
            f"the same path, such as NFS, or {hint}), or pass --shared-fs if this filesystem is mounted at the "
            f"same path on every node")
