"""Bucket snapshot storage in a local directory (the embedded default; see DESIGN §7).

Layout under `root`:
    snapshots/<bucket id, 20 digits>.snap   one file per snapshot (format below)
    next_bucket_id                          durable counter: the last bucket id handed out
    journal.log                             the mutable bucket's journal
    manifest.bin, cursor.bin                replaced atomically (tmp + fsync + rename + dir fsync)

Snapshot file: entries 1..N (segments) then entry 0 (metadata), then the custom metadata as
JSON (bucket key, topic, cursor), then an entry table of (offset u64, length u32, crc32 u32) for
entries 0..N, then a 24-byte trailer (entry count u32, info length u32, info offset u64,
magic b"PLBKSNP1"). It is written to a temporary file, fsynced and renamed into place, so a
snapshot is either complete or absent. Writing the table at the end lets merges stream
segments without knowing their number in advance.

Journal: an 16-byte header (magic b"PLBKJNL1", u64 floor = highest truncated id) then records
(length u32, crc32 u32 of id+payload, id u64, payload). Each append is a checked write (every
byte or an error) + fdatasync; a failed append is cut back off at once (ftruncate needs no free
space) and raises, so the batch it held is never acked. A torn tail (a crash inside an append
that therefore never returned) is cut off in place when the journal is first opened.
Truncation rewrites the remaining records atomically.

Every write goes through pulsar_lifecycle.durable: a full or read-only filesystem is a
StorageError naming the file and the errno, never a silently short file.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import struct
import threading
import zlib
from pathlib import Path
from typing import IO, BinaryIO, Dict, List, Optional, Sequence, Tuple

from ...durable import DurableFile, atomic_write, fsync_dir, fsync_fd, tmp_name, truncate_durably, write_all
from .base import (
    SnapshotNotFoundError,
    StorageError,
    check_bucket_id,
    check_entry_range,
    write_whole,
)

logger = logging.getLogger(__name__)

_SNAP_MAGIC = b"PLBKSNP1"
_TRAILER = struct.Struct("<IIQ8s")
_ENTRY = struct.Struct("<QII")
_JNL_MAGIC = b"PLBKJNL1"
_JNL_HEADER = struct.Struct("<8sQ")
_REC = struct.Struct("<IIQ")
_SNAP_NAME = re.compile(r"^(\d{20})\.snap$")
_MAX_RECORD = 1 << 30


class _DirWriter:
    """Streams one snapshot into a temporary file; finish() renames it into place."""

    def __init__(self, owner: "DirectorySnapshotStorage", bucket_id: int, info: bytes) -> None:
        self.bucket_id = bucket_id
        self._owner = owner
        self._info = info
        self._final = owner._snap_path(bucket_id)
        self._tmp = self._final.with_name(tmp_name(self._final.name))
        self._entries: List[Tuple[int, int, int]] = []  # segments, in order
        self._offset = 0
        try:
            self._fh: Optional[DurableFile] = DurableFile(self._tmp)
        except OSError as exc:
            raise StorageError(f"directory storage {owner.root}: cannot create snapshot {bucket_id}: {exc}") from exc

    def _write(self, data: bytes) -> Tuple[int, int, int]:
        if self._fh is None:
            raise StorageError(f"directory storage {self._owner.root}: snapshot {self.bucket_id} writer is closed")
        self._fh.write(data)
        entry = (self._offset, len(data), zlib.crc32(data))
        self._offset += len(data)
        return entry

    def add_segment(self, data: bytes) -> None:
        try:
            self._entries.append(self._write(bytes(data)))
        except OSError as exc:
            self.abort()
            raise StorageError(f"directory storage {self._owner.root}: writing snapshot {self.bucket_id}: {exc}") from exc

    def finish(self, metadata: bytes) -> int:
        try:
            meta_entry = self._write(bytes(metadata))
            info_offset = self._offset
            table = b"".join(_ENTRY.pack(*e) for e in [meta_entry] + self._entries)
            assert self._fh is not None, "finish() after abort()"
            self._fh.write(self._info + table + _TRAILER.pack(len(self._entries) + 1, len(self._info),
                                                              info_offset, _SNAP_MAGIC))
            fh, self._fh = self._fh, None
            try:
                fh.commit(self._final)
            except BaseException:
                fh.abort()
                raise
        except OSError as exc:
            self.abort()
            raise StorageError(f"directory storage {self._owner.root}: writing snapshot {self.bucket_id}: {exc}") from exc
        return self.bucket_id

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.abort()
            self._fh = None
        else:
            try:
                self._tmp.unlink(missing_ok=True)
            except OSError:
                logger.warning("event=snapshot_tmp_unlink_failed path=%s", self._tmp)


class DirectorySnapshotStorage:
    """BucketSnapshotStorage in a local directory with atomic, fsynced writes."""

    def __init__(self, root: os.PathLike | str) -> None:
        self.root = Path(root)
        self._snap_dir = self.root / "snapshots"
        try:
            self._snap_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create bucket snapshot directory {self.root}: {exc}") from exc
        self._lock = threading.Lock()  # bucket-id counter
        self._jlock = threading.Lock()  # journal: opening, writing, cutting, closing
        self._last_id: Optional[int] = None
        self._jfd: Optional[int] = None
        self._jnext = 1
        self._jfloor = 0
        # Group commit (journal_append): `_jsize` bytes of generation `_jgen` (one per open of the
        # journal) are written, `_jdurable` of them fdatasynced. `_jsync` guards those three and
        # `_jsyncing` (a leader's fdatasync is running); `_jfd_lock` keeps the fd open during it.
        self._jsync = threading.Condition(threading.Lock())
        self._jfd_lock = threading.Lock()
        self._jsyncing = False
        self._jgen = 0
        self._jsize = 0
        self._jdurable = 0
        self._jfailed: Dict[int, BaseException] = {}  # generation -> the error that ended it
        self.journal_fdatasyncs = 0  # how many the appends made (tests, benchmarks)
        self._journal_path = self.root / "journal.log"

    def __repr__(self) -> str:
        return f"DirectorySnapshotStorage({str(self.root)!r})"

    # -- snapshots ----------------------------------------------------------------------------
    def _snap_path(self, bucket_id: int) -> Path:
        return self._snap_dir / f"{bucket_id:020d}.snap"

    def _allocate_id(self, count: int = 1) -> int:
        """Hand out `count` consecutive new ids durably; returns the first."""
        counter = self.root / "next_bucket_id"
        with self._lock:
            if self._last_id is None:
                try:
                    last = int(counter.read_text() or 0)
                except FileNotFoundError:
                    last = 0
                except (OSError, ValueError) as exc:
                    raise StorageError(f"directory storage {self.root}: bad bucket id counter {counter}: {exc}") from exc
                # Never reuse an id even if the counter file was lost.
                existing = self.list_snapshots()
                self._last_id = max([last] + existing)
            last = self._last_id + count
            try:
                atomic_write(counter, str(last).encode())
            except OSError as exc:
                raise StorageError(f"directory storage {self.root}: cannot persist bucket id counter: {exc}") from exc
            self._last_id = last
            return last - count + 1

    def reserve_bucket_ids(self, count: int) -> int:
        """Durably reserve `count` consecutive bucket ids for begin_snapshot(bucket_id=...) (an
        offline seeder writing from several processes); returns the first."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise StorageError(f"directory storage {self.root}: reserve count must be a positive int, got {count!r}")
        return self._allocate_id(count)

    def begin_snapshot(self, bucket_key: str, topic: str, cursor: str, bucket_id: Optional[int] = None) -> _DirWriter:
        """Start a snapshot under a new id, or under `bucket_id` reserved with reserve_bucket_ids."""
        info = json.dumps({"bucket_key": bucket_key, "topic": topic, "cursor": cursor}).encode()
        return _DirWriter(self, self._allocate_id() if bucket_id is None else check_bucket_id(bucket_id), info)

    def create_snapshot(self, metadata: bytes, segments: Sequence[bytes], bucket_key: str,
                        topic: str, cursor: str) -> int:
        return write_whole(self, metadata, segments, bucket_key, topic, cursor)

    def _open_table(self, bucket_id: int) -> Tuple[BinaryIO, List[Tuple[int, int, int]], int, int]:
        check_bucket_id(bucket_id)
        path = self._snap_path(bucket_id)
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"directory storage {self.root}: bucket snapshot {bucket_id} does not exist") from None
        except OSError as exc:
            raise StorageError(f"directory storage {self.root}: cannot open snapshot {bucket_id}: {exc}") from exc
        try:
            size = os.fstat(fh.fileno()).st_size
            if size < _TRAILER.size:
                raise StorageError(f"snapshot file {path} is truncated ({size} bytes)")
            fh.seek(size - _TRAILER.size)
            count, info_len, info_off, magic = _TRAILER.unpack(fh.read(_TRAILER.size))
            table_off = info_off + info_len
            if magic != _SNAP_MAGIC or table_off + count * _ENTRY.size + _TRAILER.size != size:
                raise StorageError(f"snapshot file {path} is not a bucket snapshot (bad trailer)")
            fh.seek(table_off)
            raw = fh.read(count * _ENTRY.size)
            table = [_ENTRY.unpack_from(raw, i * _ENTRY.size) for i in range(count)]
            return fh, table, info_off, info_len
        except BaseException:
            fh.close()
            raise

    def _read_entries(self, bucket_id: int, first: int, last: int) -> List[bytes]:
        fh, table, _, _ = self._open_table(bucket_id)
        with fh:
            if first >= 1:
                check_entry_range(bucket_id, first, last, len(table) - 1)
            out = []
            for i in range(first, last + 1):
                off, length, crc = table[i]
                fh.seek(off)
                data = fh.read(length)
                if len(data) != length or zlib.crc32(data) != crc:
                    raise StorageError(f"directory storage {self.root}: snapshot {bucket_id} entry {i} is corrupt")
                out.append(data)
            return out

    def get_metadata(self, bucket_id: int) -> bytes:
        return self._read_entries(bucket_id, 0, 0)[0]

    def get_segments(self, bucket_id: int, first: int, last: int) -> List[bytes]:
        if not (isinstance(first, int) and first >= 1):
            raise StorageError(f"bucket {bucket_id}: segment entry ids start at 1, got {first!r}")
        return self._read_entries(bucket_id, first, last)

    def get_length(self, bucket_id: int) -> int:
        check_bucket_id(bucket_id)
        try:
            return self._snap_path(bucket_id).stat().st_size
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"directory storage {self.root}: bucket snapshot {bucket_id} does not exist") from None

    def snapshot_info(self, bucket_id: int) -> dict:
        """The custom metadata (bucket_key, topic, cursor) written with the snapshot."""
        fh, _, info_off, info_len = self._open_table(bucket_id)
        with fh:
            fh.seek(info_off)
            return json.loads(fh.read(info_len))

    def delete(self, bucket_id: int) -> None:
        check_bucket_id(bucket_id)
        try:
            self._snap_path(bucket_id).unlink()
            fsync_dir(self._snap_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"directory storage {self.root}: cannot delete snapshot {bucket_id}: {exc}") from exc

    def list_snapshots(self, after_id: int = 0) -> List[int]:
        try:
            names = os.listdir(self._snap_dir)
        except OSError as exc:
            raise StorageError(f"directory storage {self.root}: cannot list snapshots: {exc}") from exc
        ids = []
        for name in names:
            m = _SNAP_NAME.match(name)
            if m and int(m.group(1)) > after_id:
                ids.append(int(m.group(1)))
        return sorted(ids)

    # -- journal ------------------------------------------------------------------------------
    def _scan_journal(self) -> Tuple[int, List[Tuple[int, bytes]], int]:
        """(floor, records, end offset of the last good record)."""
        try:
            data = self._journal_path.read_bytes()
        except FileNotFoundError:
            return 0, [], 0
        if len(data) < _JNL_HEADER.size:
            return 0, [], 0  # a crash while creating the file: nothing was ever appended
        magic, floor = _JNL_HEADER.unpack_from(data, 0)
        if magic != _JNL_MAGIC:
            raise StorageError(f"{self._journal_path} is not a bucket journal (bad magic)")
        records = []
        pos = _JNL_HEADER.size
        while pos + _REC.size <= len(data):
            length, crc, rid = _REC.unpack_from(data, pos)
            start = pos + _REC.size
            end = start + length
            if length > _MAX_RECORD or end > len(data):
                break
            payload = data[start:end]
            if zlib.crc32(payload, zlib.crc32(struct.pack("<Q", rid))) != crc:
                break
            records.append((rid, payload))
            pos = end
        return floor, records, pos

    def _write_journal_file(self, floor: int, records: List[Tuple[int, bytes]]) -> None:
        buf = [_JNL_HEADER.pack(_JNL_MAGIC, floor)]
        for rid, payload in records:
            buf.append(self._pack_record(rid, payload))
        atomic_write(self._journal_path, b"".join(buf))

    @staticmethod
    def _pack_record(rid: int, payload: bytes) -> bytes:
        crc = zlib.crc32(payload, zlib.crc32(struct.pack("<Q", rid)))
        return _REC.pack(len(payload), crc, rid) + payload

    def _open_journal(self) -> int:
        if self._jfd is not None:
            return self._jfd
        floor, records, end = self._scan_journal()
        try:
            if not self._journal_path.exists() or end < _JNL_HEADER.size:
                self._write_journal_file(floor, [])
            elif end < self._journal_path.stat().st_size:
                # Only a crash inside an append leaves this (a failed append is cut back at once);
                # that append never returned, so nothing in the tail was acked.
                logger.warning("event=journal_torn_tail_dropped path=%s records=%d bytes=%d", self._journal_path,
                               len(records), self._journal_path.stat().st_size - end)
                truncate_durably(self._journal_path, end)
            fd = os.open(self._journal_path, os.O_WRONLY | os.O_APPEND)
            try:
                size = os.fstat(fd).st_size  # the header alone for a new journal (`end` was 0)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            raise StorageError(f"directory storage {self.root}: cannot open journal: {exc}") from exc
        with self._jsync:
            # Everything in the file now is durable: it was fsynced by whoever wrote it (the
            # rewrite, the cut-back) or by the appends of the previous generation.
            self._jfd = fd
            self._jgen += 1
            self._jsize = self._jdurable = size
        self._jfloor = floor
        self._jnext = max([floor] + [r for r, _ in records]) + 1
        return fd

    def journal_append(self, record: bytes) -> int:
        """Append one record and return its id once it is durable (group commit).

        The write happens under the journal lock; the fdatasync after it does not. Whoever finds
        no fdatasync running becomes the leader and syncs everything written so far; appends
        written meanwhile wait for it and then share the next one. So N threads appending at once
        pay about one fdatasync per round instead of N, and no append returns (no caller acks)
        before an fdatasync that began after its write has succeeded. A failed fdatasync fails
        every append it covered: the journal is cut back to its durable size and reopened."""
        with self._jlock:
            fd = self._open_journal()
            rid = self._jnext
            packed = self._pack_record(rid, bytes(record))
            gen, start = self._jgen, self._jsize
            try:
                write_all(fd, packed, self._journal_path)
            except OSError as exc:
                self._cut_back_locked(gen, exc)
                raise StorageError(f"directory storage {self.root}: journal append failed: {exc}") from exc
            self._jnext = rid + 1
            end = start + len(packed)
            with self._jsync:
                self._jsize = end
        self._wait_durable(gen, end)
        return rid

    def _wait_durable(self, gen: int, end: int) -> None:
        """Return once byte `end` of generation `gen` is durable, leading an fdatasync when none
        runs; raise StorageError once the generation failed. After a failed fdatasync nobody
        syncs that generation again (a retry may succeed on pages the kernel already dropped)."""
        while True:
            with self._jsync:
                while True:
                    failed = self._jfailed.get(gen)
                    if failed is not None:
                        raise StorageError(f"directory storage {self.root}: journal append failed: {failed}") \
                            from failed
                    if self._jgen != gen or self._jdurable >= end:
                        return  # durable, or closed/rewritten: both fsync what was written
                    if not self._jsyncing:
                        break
                    self._jsync.wait()
                self._jsyncing = True
                target = self._jsize
            error: Optional[BaseException] = None
            try:
                with self._jfd_lock:
                    if self._jgen == gen and self._jfd is not None:
                        fsync_fd(self._jfd, self._journal_path, data_only=True)
                        self.journal_fdatasyncs += 1
            except OSError as exc:
                error = exc
            with self._jsync:
                self._jsyncing = False
                if error is not None:
                    self._jfailed.setdefault(gen, error)
                elif self._jgen == gen:
                    self._jdurable = max(self._jdurable, target)
                self._jsync.notify_all()
            if error is not None:
                with self._jlock:
                    self._cut_back_locked(gen, error)
                raise StorageError(f"directory storage {self.root}: journal append failed: {error}") from error

    def _cut_back_locked(self, gen: int, error: BaseException) -> None:
        """A write or an fdatasync of generation `gen` failed: cut the journal back to what is
        durable (ftruncate needs no free space), close it and fail the generation's waiters; the
        next append reopens it and re-checks the tail."""
        if self._jgen != gen or self._jfd is None:
            return  # another thread already cut this generation back
        with self._jsync:
            durable = self._jdurable
        try:
            os.ftruncate(self._jfd, durable)
            os.fsync(self._jfd)
        except OSError as exc:
            # The reader still cuts a torn tail by its checksum, so this only costs that scan.
            logger.warning("event=journal_cut_back_failed path=%s error=%r", self._journal_path, exc)
        self._close_journal(failed=error)

    def journal_read(self) -> List[Tuple[int, bytes]]:
        with self._jlock:
            self._open_journal()
            _, records, _ = self._scan_journal()
            return records

    def journal_peek(self) -> List[Tuple[int, bytes]]:
        """journal_read without opening the journal for appends: nothing is created or cut off,
        so another process (the running writer) may append meanwhile."""
        floor, records, _ = self._scan_journal()
        return [(rid, payload) for rid, payload in records if rid > floor]

    def journal_truncate(self, upto: int) -> None:
        with self._jlock:
            self._open_journal()
            floor, records, _ = self._scan_journal()
            keep = [(r, p) for r, p in records if r > upto]
            new_floor = max(floor, upto)
            self._close_journal()
            try:
                self._write_journal_file(new_floor, keep)
            except OSError as exc:
                raise StorageError(f"directory storage {self.root}: journal truncate failed: {exc}") from exc
            self._open_journal()

    def _close_journal(self, failed: Optional[BaseException] = None) -> None:
        """Close the journal (under `_jlock`): a new generation starts at the next open. Unless
        the generation `failed`, what its appends wrote is fdatasynced first, so appends still
        waiting for their group return durable."""
        if self._jfd is None:
            return
        with self._jfd_lock:
            with self._jsync:
                pending = self._jsize > self._jdurable
            if failed is None and pending:
                try:
                    fsync_fd(self._jfd, self._journal_path, data_only=True)
                    self.journal_fdatasyncs += 1
                except OSError as exc:
                    failed = exc
            try:
                os.close(self._jfd)
            except OSError:
                pass
            self._jfd = None
            with self._jsync:
                if failed is not None:
                    self._jfailed.setdefault(self._jgen, failed)
                    if len(self._jfailed) > 16:
                        self._jfailed.pop(min(self._jfailed))
                self._jgen += 1
                self._jsync.notify_all()

    # -- manifest / cursor --------------------------------------------------------------------
    def _get(self, name: str) -> Optional[bytes]:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"directory storage {self.root}: cannot read {name}: {exc}") from exc

    def _put(self, name: str, data: bytes) -> None:
        try:
            atomic_write(self.root / name, bytes(data))
        except OSError as exc:
            raise StorageError(f"directory storage {self.root}: cannot write {name}: {exc}") from exc

    def get_manifest(self) -> Optional[bytes]:
        return self._get("manifest.bin")

    def put_manifest(self, data: bytes) -> None:
        self._put("manifest.bin", data)

    def get_cursor(self) -> Optional[bytes]:
        return self._get("cursor.bin")

    def put_cursor(self, data: bytes) -> None:
        self._put("cursor.bin", data)

    def get_index_id(self) -> Optional[str]:
        """The id of the index this store holds (see scheduler/index_identity.py), or None."""
        raw = self._get("index-id")
        return raw.decode("ascii", "replace").strip() if raw is not None else None

    def put_index_id(self, index_id: str) -> None:
        self._put("index-id", index_id.encode("ascii"))

    def describe(self) -> str:
        """Where this store lives, for messages to operators."""
        return f"snapshot directory {self.root.resolve()}"

    def close(self) -> None:
        with self._jlock:
            self._close_journal()


def lock_exclusively(path: Path) -> IO[str]:
    """One writer instance per snapshot directory: two would allocate the same bucket ids."""
    path.mkdir(parents=True, exist_ok=True)
    fh = open(path / "writer.lock", "a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise RuntimeError(f"snapshot directory {path} is in use by another BucketSnapshotWriter instance; "
                           "give each instance its own snapshotDir (or run parallelism 1)") from None
    return fh  # the flock lasts while this file stays open (and ends with the process)
