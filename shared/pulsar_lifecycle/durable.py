"""Checked durable writes: every byte written or an error, then fsync of the file and its directory.

`os.write` may write fewer bytes than asked (a nearly full filesystem, a signal) and returns how
many it wrote; ignoring that reports a torn record as durable. Every durable write path of the
package (bucket journal, snapshots, manifest, cursor, the directory state store that holds
function state and dedup snapshots) goes through this module, so a failure to persist is always
a `DurableWriteError` naming the path and the errno, raised before the caller acks anything.

No Pulsar; imports only the package's error root.
"""
from __future__ import annotations

import errno as errno_mod
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Optional, Union

from .exceptions import PulsarLifecycleError

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


class DurableWriteError(OSError, PulsarLifecycleError):
    """Data could not be made durable at `path` (errno says why: ENOSPC, EROFS, EIO, ...).

    A subclass of OSError, so callers that already turn OSError into their own error keep
    working; `str()` names the path, the operation and the errno.
    """

    def __init__(self, err: int, path: PathLike, what: str, detail: str = "") -> None:
        name = errno_mod.errorcode.get(err, str(err))
        text = f"cannot persist {path}: {what} failed: {os.strerror(err)} ({name})"
        if detail:
            text += f"; {detail}"
        super().__init__(err, text, str(path))
        self.path = str(path)
        self.what = what
        self.message = text

    def __str__(self) -> str:
        return self.message


def _fail(exc: OSError, path: PathLike, what: str, detail: str = "") -> DurableWriteError:
    if isinstance(exc, DurableWriteError):
        return exc
    err = DurableWriteError(exc.errno or errno_mod.EIO, path, what, detail)
    log.error("event=durable_write_failed path=%s op=%s errno=%s error=%s", path, what,
              errno_mod.errorcode.get(err.errno or 0, err.errno), err)
    return err


def write_all(fd: int, data: bytes, path: PathLike) -> None:
    """Write all of `data` to `fd`, looping on short writes; a write of 0 bytes is ENOSPC."""
    view = memoryview(data)
    done = 0
    total = len(view)
    while done < total:
        try:
            n = os.write(fd, view[done:])
        except InterruptedError:
            continue
        except OSError as exc:
            raise _fail(exc, path, "write", f"wrote {done} of {total} bytes") from exc
        if n <= 0:
            # A 0-byte write of a non-empty buffer makes no progress: the device is full.
            raise _fail(OSError(errno_mod.ENOSPC, os.strerror(errno_mod.ENOSPC)), path, "write",
                        f"wrote {done} of {total} bytes")
        done += n


def fsync_fd(fd: int, path: PathLike, data_only: bool = False) -> None:
    """fsync (or fdatasync) `fd`; failure is a DurableWriteError naming `path`."""
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    except OSError as exc:
        raise _fail(exc, path, "fdatasync" if data_only else "fsync") from exc


def fsync_dir(path: PathLike) -> None:
    """fsync a directory so a rename or a new file inside it survives a crash."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise _fail(exc, path, "open directory") from exc
    try:
        fsync_fd(fd, path)
    finally:
        os.close(fd)


# Linux's NAME_MAX: one path component of more bytes fails with ENAMETOOLONG.
NAME_MAX = 255


def tmp_name(final_name: str) -> str:
    """The temporary file name a durable write of `final_name` uses, within NAME_MAX.

    The pid and thread id keep concurrent writers apart. A long final name (which itself still
    fits) is replaced by a digest here, so the suffix never pushes the temporary name past the
    limit and a name that fits can always be written.
    """
    suffix = f".{os.getpid()}.{threading.get_ident()}.tmp"
    name = f".{final_name}{suffix}"
    if len(name.encode("utf-8")) <= NAME_MAX:
        return name
    return f".{hashlib.sha256(final_name.encode('utf-8')).hexdigest()[:32]}{suffix}"


def atomic_write(path: PathLike, data: bytes) -> None:
    """Replace `path` with `data` durably: a crash leaves the old or the new content, never a mix.

    tmp file -> write_all -> fsync -> rename -> fsync of the directory. On any failure the
    temporary file is removed (so a full disk is not made fuller) and DurableWriteError raised.
    """
    target = Path(path)
    tmp = target.with_name(tmp_name(target.name))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise _fail(exc, tmp, "create") from exc
    try:
        try:
            write_all(fd, bytes(data), tmp)
            fsync_fd(fd, tmp)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise _fail(exc, target, "rename") from exc
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(target.parent)


def append_durably(fd: int, data: bytes, path: PathLike) -> None:
    """Append `data` to the O_APPEND file `fd` and fdatasync it, all or nothing.

    On failure the file is cut back to its size before the append (ftruncate needs no free
    space), so a later append never follows a torn record; then DurableWriteError is raised.
    """
    try:
        before = os.fstat(fd).st_size
    except OSError as exc:
        raise _fail(exc, path, "stat") from exc
    try:
        write_all(fd, data, path)
        fsync_fd(fd, path, data_only=True)
    except DurableWriteError:
        try:
            os.ftruncate(fd, before)
            os.fsync(fd)
        except OSError as exc:
            # The reader still cuts a torn tail by its checksum, so this only costs that scan.
            log.warning("event=durable_append_rollback_failed path=%s error=%r", path, exc)
        raise


def truncate_durably(path: PathLike, size: int) -> None:
    """Cut `path` to `size` bytes in place and fsync it (needs no free space)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise _fail(exc, path, "open") from exc
    try:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            raise _fail(exc, path, "truncate") from exc
        fsync_fd(fd, path)
    finally:
        os.close(fd)


class DurableFile:
    """A new file written sequentially with checked writes; `commit()` fsyncs and renames it.

    Used for bucket snapshots, which are streamed segment by segment.
    """

    def __init__(self, tmp: PathLike) -> None:
        self.tmp = Path(tmp)
        try:
            self._fd: Optional[int] = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise _fail(exc, self.tmp, "create") from exc
        self.size = 0

    def write(self, data: bytes) -> None:
        """Write all of `data` at the end of the file."""
        if self._fd is None:
            raise DurableWriteError(errno_mod.EBADF, self.tmp, "write", "file already closed")
        write_all(self._fd, data, self.tmp)
        self.size += len(data)

    def commit(self, final: PathLike) -> None:
        """fsync, rename to `final`, fsync the directory."""
        if self._fd is None:
            raise DurableWriteError(errno_mod.EBADF, self.tmp, "commit", "file already closed")
        fd, self._fd = self._fd, None
        try:
            fsync_fd(fd, self.tmp)
        finally:
            os.close(fd)
        try:
            os.replace(self.tmp, final)
        except OSError as exc:
            raise _fail(exc, final, "rename") from exc
        fsync_dir(Path(final).parent)

    def abort(self) -> None:
        """Close and remove the temporary file (best effort, never raises)."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        _unlink_quietly(self.tmp)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # the original error matters more; leave a trace of this one
        log.warning("event=durable_tmp_unlink_failed path=%s error=%r", path, exc)
