"""Read-only filesystem operations in plain Python: what the FUSE adapter calls.

One job: turn path and handle operations into Namespace lookups and Reader
reads, raising `OSError` with the errno the caller should see. No FUSE import,
so every operation is testable without a kernel (tests/test_fs_ops.py).

Consistency (DESIGN.md §4, "objects are identified by (location, etag)"):
`open` pins the handle to the version it saw — key, etag and size, an
`ObjectId` — and every read of that handle asks the Reader for that version
only. A blob overwritten (or deleted) while a handle is open is never served as
a mix of old and new bytes: the handle's next read that reaches storage fails
with ESTALE (the NFS answer to "the file you opened is gone"), and the name's
cached attributes are dropped so that the next `open` pins the new version.
Bytes already in the kernel page cache for the pinned version may still be
served: they are the old version, whole. `open` tells the caller whether the
kernel may keep its page cache (`keep_cache`): only when the version is the
one the previous open of that blob saw, so warm re-reads of an unchanged file
never enter Python and a changed one never shows stale pages.

Everything that would write (write, create, mkdir, unlink, rename, truncate,
chmod, utimens, setxattr, ...) fails with EROFS.

Threads: FUSE calls in from many threads at once. Handles are independent
(reads are positional, no shared file position); one lock guards the handle
tables and counters, never held across a storage request.
Imports `fs.namespace`, `reader`, `blocks`, `errors`, `staging` (`Leftovers`).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from datamount.errors import ObjectNotFound, VersionChanged
from datamount.fs.namespace import Attrs, Namespace
from datamount.read.blocks import ObjectId
from datamount.read.reader import Reader, ReadHandle
from datamount.write.journal import Leftovers

T = TypeVar("T")

NS = 1_000_000_000
FILE_MODE = stat.S_IFREG | 0o444
DIR_MODE = stat.S_IFDIR | 0o555
NAME_MAX = 255  # Linux's limit for one path component (blob names may be longer in total)
# Versions remembered for keep_cache (~150 bytes each); a forgotten one only
# costs that file's page cache at its next open.
MAX_VERSIONS = 1_000_000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _error(code: int, path: str = "") -> OSError:
    return OSError(code, os.strerror(code), path) if path else OSError(code, os.strerror(code))


def read_only(path: str = "") -> OSError:
    return _error(errno.EROFS, path)


@dataclass(frozen=True)
class Opened:
    """What `open` returns: the handle id, and whether the kernel may keep the
    pages it cached for this file (the pinned version is the one it saw)."""

    fh: int
    keep_cache: bool


@dataclass
class _File:
    path: str
    obj: ObjectId
    handle: ReadHandle


class _DirStream:
    """One open directory: the entries received so far, and the rest of the
    listing still to come. `entries(offset)` replays what it has and pulls
    further pages only when the caller gets that far, so the first entries
    are served while later pages have not been requested yet."""

    def __init__(self, source: Iterator[tuple[str, dict[str, int]]], dot: dict[str, int]) -> None:
        self._lock = threading.Lock()
        self._seen: list[tuple[str, dict[str, int]]] = [(".", dot), ("..", dot)]
        self._source: Iterator[tuple[str, dict[str, int]]] | None = source
        self._error: OSError | None = None  # a failed page fails every later call too

    def entries(self, offset: int) -> Iterator[tuple[str, dict[str, int], int]]:
        """(name, stat, offset of the next entry) from entry number `offset` on."""
        i = offset
        while True:
            with self._lock:  # one request at a time per directory handle
                if i >= len(self._seen) and self._error is not None:
                    raise self._error
                if i >= len(self._seen) and self._source is not None:
                    try:
                        self._seen.append(next(self._source))
                    except StopIteration:
                        self._source = None
                    except OSError as exc:
                        self._source, self._error = None, exc
                        raise
                if i >= len(self._seen):
                    return
                name, st = self._seen[i]
            # Yield outside the lock: the caller may stop here for good.
            yield name, st, i + 1
            i += 1


class ReadOnlyFS:
    """The filesystem the FUSE adapter serves. Paths are FUSE paths ('/a/b').
    `fs.writable.WritableFS` extends it for rw_mount."""

    writable = False  # the adapter mounts read-only unless this is True

    def __init__(
        self,
        namespace: Namespace,
        reader: Reader,
        *,
        store_id: str,
        uid: int | None = None,
        gid: int | None = None,
    ) -> None:
        self.namespace = namespace
        self.reader = reader
        self.store_id = store_id
        self.uid = os.geteuid() if uid is None else uid
        self.gid = os.getegid() if gid is None else gid
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._files: dict[int, _File] = {}
        self._dirs: dict[int, _DirStream] = {}
        self._versions: dict[str, str] = {}  # blob key -> etag the last open pinned
        self._inflight = 0
        self._counts = {
            "getattrs": 0,  # kernel lookups that reached Python (readdirplus saves them)
            "opens": 0,
            "reads": 0,
            "bytes_read": 0,
            "read_errors": 0,
            "stale_reads": 0,
            "readdirs": 0,
        }

    # -- attributes ------------------------------------------------------------

    def stat_dict(self, attrs: Attrs) -> dict[str, int]:
        """A stat(2) dict; times in nanoseconds, as the adapter hands them to FUSE."""
        mtime = int(attrs.mtime * NS)
        st = {
            "st_mode": DIR_MODE if attrs.is_dir else FILE_MODE,
            "st_nlink": 2 if attrs.is_dir else 1,
            "st_size": attrs.size,
            "st_blocks": (attrs.size + 511) // 512,
            "st_uid": self.uid,
            "st_gid": self.gid,
            "st_mtime": mtime,
            "st_ctime": mtime,
            "st_atime": mtime,
        }
        return st

    def getattr(self, path: str) -> dict[str, int]:
        with self._lock:
            self._counts["getattrs"] += 1
        return self.stat_dict(self.namespace.getattr(path))

    def fgetattr(self, fh: int) -> dict[str, int]:
        """Attributes through an open handle (its path may be gone)."""
        with self._lock:
            file = self._files.get(fh)
        if file is None:
            raise _error(errno.EBADF)
        return self.getattr(file.path)

    def access(self, path: str, mode: int) -> None:
        if mode & os.W_OK:
            raise read_only(path)
        self.namespace.getattr(path)

    def statfs(self) -> dict[str, int]:
        # Nothing to count without listing the whole tree; 0 blocks marks a
        # pseudo filesystem for df. Read-only: no free space.
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": 0,
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": 0,
            "f_ffree": 0,
            "f_namemax": NAME_MAX,
        }

    # -- directories -----------------------------------------------------------

    def opendir(self, path: str) -> int:
        attrs = self.namespace.getattr(path)
        if not attrs.is_dir:
            raise _error(errno.ENOTDIR, path)
        listing = self.namespace.list_dir(path)
        source = ((name, self.stat_dict(a)) for name, a in listing)
        with self._lock:
            dh = next(self._ids)
            self._dirs[dh] = _DirStream(source, self.stat_dict(attrs))
            self._counts["readdirs"] += 1
        return dh

    def readdir(self, dh: int, offset: int) -> Iterator[tuple[str, dict[str, int], int]]:
        """Entries from `offset` on: (name, stat, next offset), '.' and '..' first."""
        with self._lock:
            stream = self._dirs.get(dh)
        if stream is None:
            raise _error(errno.EBADF)
        return stream.entries(offset)

    def releasedir(self, dh: int) -> None:
        with self._lock:
            self._dirs.pop(dh, None)

    # -- files -----------------------------------------------------------------

    def open(self, path: str, flags: int) -> Opened:
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & _WRITE_FLAGS:
            raise read_only(path)
        attrs = self.namespace.getattr(path)
        if attrs.is_dir:
            raise _error(errno.EISDIR, path)
        obj = ObjectId(self.store_id, attrs.key, attrs.etag, attrs.size)
        handle = self.reader.open(obj)
        with self._lock:
            fh = next(self._ids)
            self._files[fh] = _File(path, obj, handle)
            keep = self._versions.pop(obj.key, None) == obj.etag
            self._versions[obj.key] = obj.etag  # now the newest: dicts keep insertion order
            if len(self._versions) > MAX_VERSIONS:
                del self._versions[next(iter(self._versions))]
            self._counts["opens"] += 1
        return Opened(fh, keep)

    def read(self, fh: int, offset: int, size: int) -> bytes:
        return self._read(fh, lambda handle: handle.read(offset, size), len)

    def read_into(self, fh: int, offset: int, view: memoryview) -> int:
        """Like read, into `view` (the FUSE request's buffer); the byte count.
        A handle with its own read_into (block mode) copies straight into it."""
        return self._read(fh, lambda handle: read_into(handle, offset, view), int)

    def _read(self, fh: int, body: Callable[[ReadHandle], T], count: Callable[[T], int]) -> T:
        """Run `body` on the handle of `fh`, with the bookkeeping (`count` of
        its result: the bytes read) and error mapping every read shares."""
        with self._lock:
            file = self._files.get(fh)
            if file is None:
                raise _error(errno.EBADF)
            self._inflight += 1
        try:
            result = body(file.handle)
        except OSError as exc:
            if isinstance(exc, VersionChanged | ObjectNotFound) or exc.errno == errno.ESTALE:
                self._stale(file)
                raise _error(errno.ESTALE, file.path) from exc
            with self._lock:
                self._counts["read_errors"] += 1
            raise
        finally:
            with self._lock:
                self._inflight -= 1
                self._idle.notify_all()
        with self._lock:
            self._counts["reads"] += 1
            self._counts["bytes_read"] += count(result)
        return result

    def _stale(self, file: _File) -> None:
        self.namespace.invalidate(file.path)
        with self._lock:
            self._counts["stale_reads"] += 1
            if self._versions.get(file.obj.key) == file.obj.etag:
                del self._versions[file.obj.key]

    def flush(self, fh: int) -> None:
        """close(2) of a handle: nothing to write back here."""

    fsync = flush

    def release(self, fh: int) -> None:
        with self._lock:
            file = self._files.pop(fh, None)
            self._idle.notify_all()
        if file is not None:
            file.handle.close()

    # -- lifecycle and observability -------------------------------------------

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no file is open and no read is running; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def _busy(self) -> bool:
        """Files open or reads running (under the lock): wait_idle waits on it."""
        return bool(self._files or self._inflight)

    def finish_writes(self, timeout: float) -> Leftovers:
        """At unmount, after the last request: what could not be uploaded
        (nothing here: nothing is ever written)."""
        return Leftovers()

    def counters(self) -> dict[str, int]:
        with self._lock:
            counts = dict(self._counts)
            counts["open_files"] = len(self._files)
            counts["reads_in_flight"] = self._inflight
        counts["metadata_requests"] = self.namespace.requests
        return counts

    def close(self) -> None:
        with self._lock:
            files, self._files = list(self._files.values()), {}
            self._dirs.clear()
        for file in files:
            file.handle.close()

    # -- everything that writes ------------------------------------------------

    def create(self, path: str, mode: int = 0o644, flags: int = os.O_WRONLY) -> Opened:
        raise read_only(path)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        raise read_only(path)

    def truncate(self, path: str, length: int) -> int:
        raise read_only(path)

    def ftruncate(self, fh: int, length: int) -> int:
        raise read_only()

    def mkdir(self, path: str, mode: int = 0o755) -> int:
        raise read_only(path)

    def _refuse(self, path: str, *args: object) -> int:
        raise read_only(path)

    mknod = unlink = rmdir = chmod = chown = utimens = _refuse
    setxattr = removexattr = fallocate = _refuse

    def rename(self, old: str, new: str, *args: object) -> int:
        raise read_only(old)

    def link(self, target: str, source: str) -> int:
        raise read_only(target)

    symlink = link


def read_into(handle: ReadHandle, offset: int, view: memoryview) -> int:
    """`handle`'s read_into where it has one, else its read copied into `view`."""
    fast = getattr(handle, "read_into", None)
    if fast is not None:
        return int(fast(offset, view))
    data = handle.read(offset, len(view))
    view[: len(data)] = data
    return len(data)
