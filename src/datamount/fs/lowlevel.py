"""The FUSE layer: libfuse3's low-level loop in C (`fs._lowlevel`) in front of
`fs.ops.ReadOnlyFS` (ro_mount, eval_mount) or `fs.writable.WritableFS`
(rw_mount).

The native side runs libfuse's multi-threaded loop without the GIL and answers
from its inode table what needs no decision: a lookup or getattr of a name it
holds attributes of (from an earlier lookup, a listing, or the whole folder
a lookup listed), forget, the inode numbers of listings, reads of files the
disk tier holds whole (their block files, checked), and open / release of
one-block files the disk tier holds (the file-ahead prefetch tells it of
those it fetched: `native_cached`; their opens come back in batches to
`fs.on_open`, `_report_opens`). Everything else comes here, one call
per request with the GIL held: `Ops` turns it into a ReadOnlyFS call and
every failure into a negative errno through the funnel (`fs.funnel`); its
answers carry, for one-block cached files, where the block is
(`CachedBlocks`). Why native and what each request costs:
docs/design/ro_mount.md ("The native loop").

Kernel-facing choices (why each: docs/design/ro_mount.md, "What the kernel
is told"): read-only (`ro`) unless the filesystem has a write side
(`fs.writes`); for the mounting user only, or `allow_other` with
`default_permissions` (`fs.access`); attribute / entry / negative timeouts
equal the attribute cache TTL (none set: a year, i.e. never); `keep_cache`
per open; reads and writes up to 1 MiB; no FLUSH on a read-only mount;
readdirplus with full attributes. An inode number names one file for the
mount's life: it follows a rename, and a name that goes leaves it without a
path.

rw_mount: nothing is served natively (writes change what a name holds), so
every request comes here; the native side adds the hidden names of open
files unlinked or renamed over, which `fs.kept` takes as the unlinks they
are.

Threads: libfuse's workers call `Ops` concurrently (each keeps one Python
thread state for its life, made by the native side); `run` blocks its
calling thread until the filesystem is unmounted or `stop_loop` is called.
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from datamount.fs import _lowlevel, funnel
from datamount.fs._lowlevel import Session
from datamount.fs.funnel import errno_of
from datamount.fs.namespace import Attrs
from datamount.fs.ops import ReadOnlyFS
from datamount.read.blocks import ObjectId
from datamount.read.cache.blockfile import CachedBlocks

log = logging.getLogger("datamount.fuse")

NEVER_SECONDS = 365 * 24 * 3600.0  # "never expires" for the kernel's caches
# The kernel's directory entries (fuse_dirent, fuse_direntplus): a header, then
# the name, padded to 8 bytes. A listing call converts no more than fit.
DIRENT, ENTRY_OUT = 24, 128

F = TypeVar("F", bound=Callable[..., Any])
Stat = tuple[int, int, int, int, int, int]  # mode, size, mtime_ns, nlink, uid, gid
# ...and, for a file of one block cached on disk, where: the native loop opens it alone
Entry = tuple[int, int, int, int, int, int, CachedBlocks | None]


class MountFailed(RuntimeError):
    """libfuse could not mount or run the filesystem (its message is in the log)."""


def _answer(method: F) -> F:
    """The errno funnel of every call from the native side: its result, or
    the negative errno of what it raised (and, with metrics on, its latency)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Any, *args: Any) -> Any:
        observe = funnel.observer
        start = time.perf_counter() if observe is not None else 0.0
        try:
            return method(self, *args)
        except Exception as exc:
            return -errno_of(name, exc)
        finally:
            if observe is not None:
                observe(name, time.perf_counter() - start)

    return call  # type: ignore[return-value]


def _stat(st: dict[str, int]) -> Stat:
    return (st["st_mode"], st["st_size"], st["st_mtime"], st["st_nlink"], st["st_uid"],
            st["st_gid"])  # fmt: skip


def _dirent_size(name: bytes, plus: bool) -> int:
    return (DIRENT + (ENTRY_OUT if plus else 0) + len(name) + 7) & ~7


class Ops:
    """What the native loop calls: paths in, a tuple or a negative errno out."""

    def __init__(self, fs: ReadOnlyFS, on_ready: Callable[[], None]) -> None:
        self.fs = fs
        self.on_ready = on_ready
        # rw_mount: nothing served natively (writes change what a name holds)
        self.writable = fs.writes is not None
        # where the disk tier keeps a whole file (None: nowhere the loop reads)
        self._cached = None if self.writable else fs.cached_blocks
        self._lock = threading.Lock()
        self._dirs: dict[int, str] = {}  # open directory handle -> its path
        self._told: set[str] = set()  # folders whose whole listing the native table has

    def _entry(self, attrs: Attrs, st: Stat | None = None) -> Entry:
        """The native table's entry of a name: its stat (`st`, or made from
        `attrs`) and, for a one-block file the disk tier holds, where that
        block is."""
        cached = None
        fs = self.fs
        if self._cached is not None and not attrs.is_dir and attrs.size <= fs.block_size:
            cached = self._cached(ObjectId(fs.store_id, attrs.key, attrs.etag, attrs.size))
        return (*(st or _stat(fs.stat_dict(attrs))), cached)

    def _siblings(self, path: str) -> list[tuple[bytes, Entry, int]] | None:
        """The other entries of `path`'s folder, once, when its listing is
        complete: one lookup fills the native table for the whole folder."""
        if self.writable:
            return None
        folder = posixpath.dirname(path)
        with self._lock:
            if folder in self._told:
                return None
        listing = self.fs.namespace.listed(folder)
        if listing is None:
            return None
        with self._lock:
            if folder in self._told:
                return None
            self._told.add(folder)
        return [(os.fsencode(name), self._entry(a), 0) for name, a in listing.items()]

    def init(self, major: int, minor: int, readahead: int, max_write: int, max_read: int,
             capable: int, want: int, threads: int) -> None:  # fmt: skip
        log.info(
            "FUSE init (native loop, %d threads): protocol %d.%d, max_readahead %d, "
            "max_write %d, max_read %d, capable 0x%x, want 0x%x",
            threads, major, minor, readahead, max_write, max_read, capable, want,
        )  # fmt: skip
        self.on_ready()

    def _path_entry(self, path: str) -> Entry:
        if self.writable:  # (an open file's hidden name: nlink 0)
            return (*_stat(self.fs.getattr(path)), None)
        self.fs.count(getattrs=1)
        return self._entry(self.fs.lookup(path))

    @_answer
    def lookup(self, path: str) -> tuple[Entry, list[tuple[bytes, Entry, int]] | None]:
        """(the entry of `path`, its folder's other entries or None)."""
        return self._path_entry(path), self._siblings(path)

    @_answer
    def getattr(self, path: str) -> Entry:
        return self._path_entry(path)

    @_answer
    def access(self, path: str, mask: int) -> int:
        self.fs.access(path, mask)
        return 0

    @_answer
    def statfs(self) -> tuple[int, ...]:
        st = self.fs.statfs()
        return (st["f_bsize"], st["f_frsize"], st["f_blocks"], st["f_bfree"], st["f_bavail"],
                st["f_files"], st["f_ffree"], st["f_namemax"])  # fmt: skip

    @_answer
    def open(self, path: str, flags: int) -> tuple[int, bool, Stat | None, CachedBlocks | None]:
        """(handle, keep_cache, the new attributes when the open pinned a
        version other than the one the kernel may hold attributes of, where
        the disk tier keeps the pinned version's blocks)."""
        opened = self.fs.open(path, flags)
        changed = None
        if self.fs.kernel_attrs_stale(path):
            changed = _stat(self.fs.stat_dict(self.fs.lookup(path)))
        blocks = None
        file = self.fs.opened(opened.fh)
        if self._cached is not None and file is not None and file.obj is not None:
            blocks = self._cached(file.obj)
        return opened.fh, opened.keep_cache, changed, blocks

    @_answer
    def open_version(self, path: str, store: bytes, key: bytes, etag: bytes, size: int) -> int:
        """A handle of `path` pinned to exactly that version (a file the native
        loop opened, whose next read it cannot serve)."""

        def text(raw: bytes) -> str:
            return raw.decode("utf-8", "surrogatepass")

        obj = ObjectId(text(store), text(key), text(etag), size)
        return self.fs.open_version(path, obj)

    @_answer
    def read_into(self, fh: int, offset: int, view: memoryview) -> int:
        return self.fs.read_into(fh, offset, view)

    @_answer
    def release(self, fh: int) -> int:
        self.fs.release(fh)
        return 0

    # -- names and writes: WritableFS serves them; ReadOnlyFS answers EROFS ----

    @_answer
    def create(self, path: str, mode: int, flags: int) -> tuple[int, Entry]:
        """(the new file's handle, its entry)."""
        fh = self.fs.create(path, mode, flags).fh
        try:
            return fh, self._path_entry(path)
        except BaseException:
            self.fs.release(fh)
            raise

    @_answer
    def write(self, fh: int, data: bytes, offset: int) -> int:
        return self.fs.write("", data, offset, fh)

    @_answer
    def flush(self, fh: int) -> int:
        self.fs.flush(fh)
        return 0

    @_answer
    def fsync(self, fh: int) -> int:
        self.fs.fsync(fh)
        return 0

    @_answer
    def setattr(self, path: str, fh: int, which: int, mode: int, uid: int, gid: int,
                size: int) -> Entry:  # fmt: skip
        """Attributes set (`which`: the FUSE_SET_ATTR_* bits), through the
        open handle `fh` when there is one (0: none); the attributes after."""
        fs = self.fs
        if which & _lowlevel.SET_ATTR_SIZE:
            if fh:  # ftruncate: the handle decides, whatever its name is now
                fs.ftruncate(fh, size)
            else:
                fs.truncate(path, size)
        if which & _lowlevel.SET_ATTR_MODE:
            fs.chmod(path, mode)
        if which & (_lowlevel.SET_ATTR_UID | _lowlevel.SET_ATTR_GID):
            fs.chown(path, uid, gid)
        if which & _lowlevel.SET_ATTR_TIMES:
            fs.utimens(path, None)
        if fh:
            return (*_stat(fs.fgetattr(fh)), None)
        return self._path_entry(path)

    @_answer
    def mkdir(self, path: str, mode: int) -> Entry:
        self.fs.mkdir(path, mode)
        return self._path_entry(path)

    @_answer
    def mknod(self, path: str, mode: int) -> Entry:
        self.fs.mknod(path, mode)
        return self._path_entry(path)

    @_answer
    def link(self, path: str, _: int) -> Entry:
        """A hard or symbolic link named `path` (refused: no links in blobs)."""
        self.fs.link(path, path)
        return self._path_entry(path)

    symlink = link

    @_answer
    def unlink(self, path: str) -> int:
        self.fs.unlink(path)
        return 0

    @_answer
    def rmdir(self, path: str) -> int:
        self.fs.rmdir(path)
        return 0

    @_answer
    def rename(self, old: str, new: str) -> int:
        self.fs.rename(old, new)
        return 0

    @_answer
    def setxattr(self, path: str) -> int:
        return self.fs.setxattr(path)

    @_answer
    def removexattr(self, path: str) -> int:
        return self.fs.removexattr(path)

    @_answer
    def fallocate(self, path: str) -> int:
        return self.fs.fallocate(path)

    # -- folders -------------------------------------------------------------------

    @_answer
    def opendir(self, path: str) -> int:
        dh = self.fs.opendir(path)
        with self._lock:
            self._dirs[dh] = path
        return dh

    @_answer
    def readdir(self, dh: int, offset: int, size: int, plus: bool) -> list[Any]:
        """The entries from `offset` on that fit in `size` bytes of the
        kernel's buffer: (name, attributes, offset of the next)."""
        out: list[Any] = []
        with self._lock:
            folder = self._dirs.get(dh, "")
        join = (folder.rstrip("/") + "/").__add__
        for name, st, next_offset in self.fs.readdir(dh, offset):
            encoded = os.fsencode(name)
            size -= _dirent_size(encoded, plus)
            if size < 0:
                break
            attrs = None if name in (".", "..") else self.fs.namespace.peek(join(name))
            entry = _stat(st) if attrs is None else self._entry(attrs, _stat(st))
            out.append((encoded, entry, next_offset))
        return out

    @_answer
    def releasedir(self, dh: int) -> int:
        with self._lock:
            self._dirs.pop(dh, None)
        self.fs.releasedir(dh)
        return 0


class Loop:
    """The mounted session, for the daemon: `stop_loop` ends it from outside."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def stop_loop(self, loop_thread: threading.Thread) -> None:
        self.session.exit()


def _report_opens(session: Session, on_open: Callable[[str], None]) -> None:
    """The file-ahead prefetcher follows every open: the native loop's opens
    of the files it prefetched come here in batches, one call per batch."""
    while (paths := session.take_opens(1.0)) is not None:
        for path in paths:
            on_open(os.fsdecode(path))


def _options(fs: ReadOnlyFS, fsname: str) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace(",", "\\,")

    options = [f"fsname={escape(fsname)}", "subtype=datamount"]
    if fs.writes is None:
        options.append("ro")
    options += [name for name, on in fs.permissions.fuse_options().items() if on]
    return ",".join(options)


def run(
    fs: ReadOnlyFS,
    mountpoint: str,
    *,
    ttl_seconds: float | None,
    fsname: str,
    max_threads: int,
    on_ready: Callable[[], None],
    adapter_ready: Callable[[Loop], None] = lambda loop: None,
) -> None:
    """Mount `fs` at `mountpoint` and serve until it is unmounted.

    `on_ready` runs (on a libfuse thread) once the kernel has connected.
    Raises MountFailed when libfuse cannot mount or its loop fails.
    """
    timeout = NEVER_SECONDS if ttl_seconds is None else ttl_seconds
    try:
        session = Session(
            Ops(fs, on_ready), mountpoint, _options(fs, fsname), timeout=timeout,
            attr_ttl=float("inf") if ttl_seconds is None else ttl_seconds,
            max_threads=max_threads, writable=fs.writes is not None,
        )  # fmt: skip
    except RuntimeError as exc:
        raise MountFailed(str(exc)) from None
    fs.native_counters = session.counters
    fs.on_stale = lambda path: session.forget(os.fsencode(path))
    reporter = None
    if fs.writes is None:
        fs.native_cached = lambda path, blocks: session.cached(os.fsencode(path), blocks)
        if fs.on_open is not None:
            reporter = threading.Thread(
                target=_report_opens, args=(session, fs.on_open), name="datamount-native-opens",
                daemon=True,
            )  # fmt: skip
            reporter.start()
    adapter_ready(Loop(session))
    try:
        status = session.loop()
    finally:
        fs.native_cached = None
        if reporter is not None:
            session.exit()  # take_opens answers None: the reporter ends
            reporter.join(5.0)
    if status not in (0, None):
        raise MountFailed(f"libfuse ended with status {status}")
