"""Read-only filesystem operations in plain Python: what the FUSE adapter calls.

One job: turn path and handle operations into Namespace lookups and Reader
reads, raising `OSError` with the errno the caller should see. No FUSE import,
so every operation is testable without a kernel (tests/test_fs_ops.py).

Consistency (docs/semantics.md, "objects are identified by (location, etag)"):
`open` pins the handle to the version it saw (an `ObjectId`: key, etag,
size) and every read of that handle asks the Reader for that version only.
A blob overwritten or deleted while a handle is open is never served as a
mix: the handle's next read that reaches storage fails with ESTALE, and the
name's cached attributes are dropped so that the next `open` pins the new
version. When an `open` pins a version other than the one the namespace saw
before, `kernel_attrs_stale` tells the adapter to drop the kernel's
attributes of that path. `keep_cache` only when the version is the one the
previous open of that blob saw: warm re-reads never enter Python, and a
changed file never shows stale pages.

Everything that would write (write, create, mkdir, rename, chmod...) is EROFS.
Owner, group and modes are the mount's `fs.access.Access` (the kernel checks
them when the mount lets other users in: `default_permissions`).

`fs.writable.WritableFS` (rw_mount) extends this one through its "hooks"
(`lookup`, `listing`, `handle_of`, `attrs_of`, `let_go`) and adds the write
operations; its `writes` (None here) is what the daemon finishes at unmount.
This module imports nothing of the write path.

Threads: FUSE calls in from many threads at once. Handles are independent
(reads are positional, no shared file position); one lock guards the handle
tables and counters, never held across a storage request.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

from datamount.errors import ObjectNotFound, VersionChanged, os_error
from datamount.fs.access import Access, mount_access
from datamount.fs.handles import DirStream, Opened, OpenFile
from datamount.fs.namespace import Attrs, Namespace
from datamount.read.blocks import ObjectId
from datamount.read.cache.blockfile import CachedBlocks
from datamount.read.reader import Reader, ReadHandle

T = TypeVar("T")

NS = 1_000_000_000
NAME_MAX = 255  # Linux's limit for one path component (blob names may be longer in total)
# Versions remembered for keep_cache (~150 bytes each); a forgotten one only
# costs that file's page cache at its next open.
MAX_VERSIONS = 1_000_000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def read_only(path: str = "") -> OSError:
    return os_error(errno.EROFS, path)


class Unsaved(Protocol):
    """What a mount's writes leave only staged at unmount
    (`write.journal.Leftovers`): true when anything is, one line for the user,
    and the JSON the `unmount` command reads."""

    def __bool__(self) -> bool: ...

    def describe(self, staging: str = "") -> str: ...

    def to_json(self) -> dict[str, list[list[str]]]: ...


class Writes(Protocol):
    """The write side of a filesystem, as the daemon ends it: after the last
    FUSE request, wait (up to `timeout` s) for pending uploads; what is still
    only staged. A read-only filesystem has none (`fs.writes is None`)."""

    def finish_writes(self, timeout: float) -> Unsaved: ...


def is_utf8(path: str) -> bool:
    """False for a name no blob can have: FUSE paths come with surrogateescape,
    so bytes that are not UTF-8 arrive as surrogates."""
    return path.isascii() or not any("\udc80" <= c <= "\udcff" for c in path)


def findable(path: str) -> None:
    """Raise what a lookup of a name no blob can have answers: ENOENT for bytes
    that are not UTF-8, ENAMETOOLONG for a component past NAME_MAX (as a local
    filesystem answers, and as statfs's f_namemax says)."""
    if not is_utf8(path):
        raise os_error(errno.ENOENT)  # no blob name holds these bytes
    if len(path) > NAME_MAX and any(len(part.encode()) > NAME_MAX for part in path.split("/")):
        raise os_error(errno.ENAMETOOLONG, path)


class ReadOnlyFS:
    """The filesystem the FUSE adapter serves. Paths are FUSE paths ('/a/b').
    `fs.writable.WritableFS` extends it for rw_mount (see the hooks)."""

    writes: Writes | None = None  # None: nothing to finish at unmount, mounted `ro`
    # Told the path of every blob opened (after the open succeeded): the
    # file-ahead prefetcher (read.ahead) watches the order of opens. It must
    # not block: it only queues the event.
    on_open: Callable[[str], None] | None = None
    # Block mode with a disk tier: where the blocks of an object version are
    # cached, for the native FUSE loop to read them without Python (fs.lowlevel).
    cached_blocks: Callable[[ObjectId], CachedBlocks | None] | None = None
    block_size = 0  # of those blocks: a file of at most this many bytes is one block
    # What the native FUSE loop served without calling in (fs.lowlevel): its
    # reads are added to `counters()`'s, the rest reported as they are.
    native_counters: Callable[[], dict[str, int]] | None = None
    # Told the path of a file found stale (its version changed in storage):
    # the native loop drops what it knows of it, so the next open asks again.
    on_stale: Callable[[str], None] | None = None
    # Told (path, blocks) of a one-block file the file-ahead prefetch put on
    # disk: the native loop opens it without Python (fs.lowlevel). True: taken.
    native_cached: Callable[[str, CachedBlocks], bool] | None = None

    def __init__(
        self,
        namespace: Namespace,
        reader: Reader,
        *,
        store_id: str,
        access: Access | None = None,
    ) -> None:
        """`access`: the owner and modes shown (fs.access; by default the
        mounting user, files 0444, folders 0555)."""
        self.namespace = namespace
        self.reader = reader
        self.store_id = store_id
        self.permissions = access if access is not None else mount_access(writable=False)
        self._file_mode = stat.S_IFREG | self.permissions.file_mode
        self._dir_mode = stat.S_IFDIR | self.permissions.dir_mode
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._files: dict[int, OpenFile] = {}
        self._dirs: dict[int, DirStream] = {}
        self._versions: dict[str, str] = {}  # blob key -> etag the last open pinned
        self._inflight = 0
        self._counts = {
            "getattrs": 0,  # kernel lookups that reached Python (readdirplus saves them)
            "opens": 0,
            "reads": 0,
            "bytes_read": 0,
            "read_errors": 0,
            "stale_reads": 0,
            "readdirs": 0,  # opendirs
            "readdir_requests": 0,  # listing pages the kernel asked for
        }

    # -- hooks: what a filesystem that also writes (fs.writable) answers otherwise

    def lookup(self, path: str) -> Attrs:
        """The attributes of `path` (FileNotFoundError when there is none)."""
        findable(path)
        return self.namespace.getattr(path)

    def listing(self, path: str) -> Iterable[tuple[str, Attrs]]:
        """The entries of folder `path`, streamed."""
        return self.namespace.list_dir(path)

    def handle_of(self, file: OpenFile) -> ReadHandle:
        """What a read of `file` reads, asked at every read."""
        return file.handle

    def attrs_of(self, file: OpenFile) -> Attrs:
        """The attributes of an open file (fstat; its path may be gone)."""
        return self.lookup(file.path)

    def let_go(self, file: OpenFile) -> None:
        """`file` was released, its last request over: close what it holds."""
        file.handle.close()

    # -- for those hooks: the handle table and the counters ----------------------

    def add_file(self, file: OpenFile, *, counted: bool = True) -> int:
        """Register an open file; its handle id (counted as an open unless
        `counted` is false: a handle for an open counted elsewhere)."""
        with self._lock:
            fh = next(self._ids)
            self._files[fh] = file
            self._counts["opens"] += counted
        return fh

    def opened(self, fh: int) -> OpenFile | None:
        """The open file of `fh`, if it is open."""
        with self._lock:
            return self._files.get(fh)

    def open_files(self) -> list[OpenFile]:
        """Every open file now (a snapshot)."""
        with self._lock:
            return list(self._files.values())

    def count(self, **deltas: int) -> None:
        """Add to the counters `counters()` reports (a new name starts at 0)."""
        with self._lock:
            for name, n in deltas.items():
                self._counts[name] = self._counts.get(name, 0) + n

    # -- attributes ------------------------------------------------------------

    def stat_dict(self, attrs: Attrs) -> dict[str, int]:
        """A stat(2) dict; times in nanoseconds, as the adapter hands them to FUSE."""
        mtime = int(attrs.mtime * NS)
        st = {
            "st_mode": self._dir_mode if attrs.is_dir else self._file_mode,
            "st_nlink": 2 if attrs.is_dir else 1,
            "st_size": attrs.size,
            "st_blocks": (attrs.size + 511) // 512,
            "st_uid": self.permissions.uid,
            "st_gid": self.permissions.gid,
            "st_mtime": mtime,
            "st_ctime": mtime,
            "st_atime": mtime,
        }
        return st

    def getattr(self, path: str) -> dict[str, int]:
        self.count(getattrs=1)
        return self.stat_dict(self.lookup(path))

    def fgetattr(self, fh: int) -> dict[str, int]:
        """Attributes through an open handle (its path may be gone)."""
        file = self.opened(fh)
        if file is None:
            raise os_error(errno.EBADF)
        self.count(getattrs=1)
        return self.stat_dict(self.attrs_of(file))

    def access(self, path: str, mode: int) -> None:
        if mode & os.W_OK and self.writes is None:
            raise read_only(path)
        self.lookup(path)

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
        attrs = self.lookup(path)
        if not attrs.is_dir:
            raise os_error(errno.ENOTDIR, path)
        listing = self.listing(path)
        source = ((name, self.stat_dict(a)) for name, a in listing)
        with self._lock:
            dh = next(self._ids)
            self._dirs[dh] = DirStream(source, self.stat_dict(attrs))
            self._counts["readdirs"] += 1
        return dh

    def readdir(self, dh: int, offset: int) -> Iterator[tuple[str, dict[str, int], int]]:
        """Entries from `offset` on: (name, stat, next offset), '.' and '..' first."""
        with self._lock:
            stream = self._dirs.get(dh)
            self._counts["readdir_requests"] += 1
        if stream is None:
            raise os_error(errno.EBADF)
        return stream.entries(offset)

    def releasedir(self, dh: int) -> None:
        with self._lock:
            self._dirs.pop(dh, None)

    # -- files -----------------------------------------------------------------

    def open(self, path: str, flags: int) -> Opened:
        """Open the blob at `path` for reading, pinned to the version it has now."""
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & _WRITE_FLAGS:
            raise read_only(path)
        findable(path)
        for last in (False, True):
            attrs = self.namespace.getattr(path)
            if attrs.is_dir:
                raise os_error(errno.EISDIR, path)
            obj = ObjectId(self.store_id, attrs.key, attrs.etag, attrs.size)
            try:
                handle = self.reader.open(obj)  # whole-file mode downloads it here
                break
            except (VersionChanged, ObjectNotFound) as exc:
                # The cached version is gone from storage: look the name up
                # again once (attributes that never expire would pin it forever).
                self.namespace.invalidate(path)
                if last:
                    raise os_error(errno.ESTALE, path) from exc
        fh = self.add_file(OpenFile(path, handle, obj, attrs.mtime))
        if self.on_open is not None:
            self.on_open(path)
        with self._lock:
            keep = self._versions.pop(obj.key, None) == obj.etag
            self._versions[obj.key] = obj.etag  # now the newest: dicts keep insertion order
            if len(self._versions) > MAX_VERSIONS:
                del self._versions[next(iter(self._versions))]
        return Opened(fh, keep)

    def open_version(self, path: str, obj: ObjectId) -> int:
        """Open `path` pinned to `obj` exactly, whatever the namespace says now:
        the version the native loop opened the file as, read through Python
        from the first block it cannot serve on. A version gone from storage
        fails its reads with ESTALE, as any pinned handle does."""
        attrs = self.namespace.peek(path)
        mtime = attrs.mtime if attrs is not None and attrs.etag == obj.etag else 0.0
        # The native loop counted this open (native_opens): not a second one.
        return self.add_file(OpenFile(path, self.reader.open(obj), obj, mtime), counted=False)

    def prefetched(self, rel: str, obj: ObjectId) -> None:
        """The file-ahead prefetch put the one block of `obj` (the file at
        mount-relative `rel`) on disk: while the namespace still has that
        version there, the native loop is told where it is, so its next open
        needs no Python."""
        if self.native_cached is None or self.cached_blocks is None:
            return
        path = "/" + rel
        attrs = self.namespace.peek(path)
        if attrs is None or (attrs.key, attrs.etag, attrs.size) != (obj.key, obj.etag, obj.size):
            return
        blocks = self.cached_blocks(obj)
        if blocks is not None:
            self.native_cached(path, blocks)

    def kernel_attrs_stale(self, path: str) -> bool:
        """True (once) when the kernel may hold older attributes of `path` than
        the version its last open pinned (the namespace saw the version change):
        the adapter then drops them before the open returns, so no read is cut
        at the old size."""
        return self.namespace.take_changed(path)

    def read(self, fh: int, offset: int, size: int) -> bytes:
        return self._read(fh, lambda handle: handle.read(offset, size), len)

    def read_into(self, fh: int, offset: int, view: memoryview) -> int:
        """Like read, into `view` (the FUSE request's buffer); the byte count.
        A block-mode handle copies its blocks' bytes straight into it."""
        return self._read(fh, lambda handle: handle.read_into(offset, view), int)

    def _read(self, fh: int, body: Callable[[ReadHandle], T], count: Callable[[T], int]) -> T:
        """Run `body` on what `fh` reads, with the bookkeeping (`count` of its
        result: the bytes read) and error mapping every read shares."""
        with self._lock:
            file = self._files.get(fh)
            if file is None:
                raise os_error(errno.EBADF)
            self._inflight += 1
        done = False
        try:
            result = body(self.handle_of(file))
            done = True
        except OSError as exc:
            if isinstance(exc, VersionChanged | ObjectNotFound) or exc.errno == errno.ESTALE:
                self._stale(file)
                raise os_error(errno.ESTALE, file.path) from exc
            with self._lock:
                self._counts["read_errors"] += 1
            raise
        finally:
            with self._lock:  # one lock hold per read for the bookkeeping
                self._inflight -= 1
                if done:
                    self._counts["reads"] += 1
                    self._counts["bytes_read"] += count(result)
                self._wake_idle()
        return result

    def _wake_idle(self) -> None:
        """_lock held: wake wait_idle once nothing is open or being read."""
        if not self._files and not self._inflight:
            self._idle.notify_all()

    def _stale(self, file: OpenFile) -> None:
        self.namespace.invalidate(file.path)
        if self.on_stale is not None:
            self.on_stale(file.path)
        with self._lock:
            self._counts["stale_reads"] += 1
            obj = file.obj
            if obj is not None and self._versions.get(obj.key) == obj.etag:
                del self._versions[obj.key]

    def flush(self, fh: int) -> None:
        """close(2) of a handle: nothing to write back here."""

    fsync = flush

    def release(self, fh: int) -> None:
        with self._lock:
            file = self._files.pop(fh, None)
            self._wake_idle()
        if file is not None:
            self.let_go(file)

    # -- lifecycle and observability -------------------------------------------

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no file is open and no read is running; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._files or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def counters(self) -> dict[str, int]:
        with self._lock:
            counts = dict(self._counts)
            counts["open_files"] = len(self._files)
            counts["reads_in_flight"] = self._inflight
        counts["metadata_requests"] = self.namespace.requests
        if self.native_counters is not None:
            native = self.native_counters()
            counts["reads"] += native["native_reads"]
            counts["bytes_read"] += native["native_read_bytes"]
            counts["opens"] += native["native_opens"]
            counts.update(native)
        return counts

    def close(self) -> None:
        """The daemon stops: close every handle still open (no `let_go`)."""
        with self._lock:
            files, self._files = list(self._files.values()), {}
            self._dirs.clear()
        for file in files:
            file.handle.close()

    # -- everything that writes: EROFS (fs.writable serves these) -------------

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

    unlink = rmdir = _refuse

    def rename(self, old: str, new: str, *args: object) -> int:
        raise read_only(old)

    # -- what blobs do not have: EROFS on a read-only mount; on a writable one
    # the namespace's own answer (the same for every writable mount) ---------

    def chmod(self, path: str, *_: object) -> int:
        """Accepted and ignored when writable: blobs have no mode or owner, and
        their time is the service's last-modified time."""
        if self.writes is None:
            raise read_only(path)
        self.lookup(path)
        return 0

    chown = utimens = chmod

    def link(self, target: str, source: str) -> int:
        raise self._refusal(errno.EPERM, target)  # no links in a blob namespace

    symlink = link

    def _unsupported(self, path: str, *_: object) -> int:
        # callers fall back (fallocate) or skip (xattrs)
        raise self._refusal(errno.EOPNOTSUPP, path)

    mknod = setxattr = removexattr = fallocate = _unsupported

    def _refusal(self, code: int, path: str) -> OSError:
        return read_only(path) if self.writes is None else os_error(code, path)
