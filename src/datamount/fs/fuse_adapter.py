"""The thin FUSE adapter: mfusepy (libfuse 3) in front of `fs.ops.ReadOnlyFS`.

One job: translate FUSE callbacks into ReadOnlyFS calls, and every failure
into an errno through one funnel (`_funnel`): an OSError keeps its errno, any
other exception is logged with its traceback and becomes EIO — the daemon
never crashes on a bad request. The only module that imports mfusepy.

Kernel-facing choices (see `run`; why each: docs/design/ro_mount.md, "What
the kernel is told"):
- read-only (`ro`) unless the filesystem has a write side (`fs.writes`);
- for the mounting user only, or `allow_other` with `default_permissions`
  (`fs.access`);
  multithreaded (libfuse's worker pool, `max_threads`);
- attr / entry / negative timeouts equal the attribute cache TTL (none set:
  a year, i.e. never), so the kernel caches no longer than the daemon does;
- `keep_cache` on an open whose pinned version is the one the previous open
  saw; an open that pins a version the namespace saw change drops the
  kernel's attributes of that path first (`fuse_invalidate_path`);
- reads up to 1 MiB (libfuse 3 sizes max_pages from max_write);
- no FLUSH on a read-only mount (`_not_served`: ENOSYS once, then none);
- readdirplus: entries carry their full attributes (`_Fuse.readdir_fuse_3`
  fills the whole stat; mfusepy 3.1 only the mode).

Threads: libfuse's workers call in concurrently, each keeping its Python
thread state (`_keep_thread_state`); `run` blocks its calling thread until
the filesystem is unmounted or `stop_loop` is called. No lock of its own.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

# mfusepy prefers libfuse2 when both are installed (fsspec's FUSE needs it):
# ask for libfuse3 by name, unless the user chose a library explicitly.
if not os.environ.get("FUSE_LIBRARY_PATH"):
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

import mfusepy  # noqa: E402

from datamount.fs import funnel
from datamount.fs.funnel import errno_of
from datamount.fs.ops import ReadOnlyFS

log = logging.getLogger("datamount.fuse")

NEVER_SECONDS = 365 * 24 * 3600.0  # "never expires" for the kernel's caches
MAX_IO = 1024 * 1024  # FUSE_MAX_MAX_PAGES (256) x 4 KiB: the largest FUSE request
FUSE_READDIR_PLUS = 1  # enum fuse_readdir_flags
FUSE_FILL_DIR_PLUS = 2  # enum fuse_fill_dir_flags
WAKE_SIGNAL = signal.SIGUSR1  # interrupts libfuse's loop thread after fuse_exit
F = TypeVar("F", bound=Callable[..., Any])


class MountFailed(RuntimeError):
    """libfuse could not mount or run the filesystem (its message is in the log)."""


def _to_errno(op: str, exc: BaseException) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(errno_of(op, exc))


# libfuse's worker threads (idents) whose Python thread state is kept (_keep_thread_state).
_kept: set[int] = set()


def _keep_thread_state(ident: int) -> None:
    """Keep this libfuse worker thread's Python thread state from one callback
    to the next. A ctypes callback on a thread Python did not start creates a
    thread state (and its first 16 KiB frame stack, one mmap) on entry and
    deletes it (one munmap) on return: per callback, with the GIL held. One
    more PyGILState_Ensure, never released, keeps the state's count above
    zero, so the callbacks after this one reuse it; each still takes the GIL
    on entry and gives it back on return. libfuse keeps its workers for the
    mount's life (max_idle_threads = max_threads), so a kept state is never
    one of an ended thread until the loop stops. Why: docs/design/ro_mount.md
    ("Kept thread states")."""
    _kept.add(ident)
    ctypes.pythonapi.PyGILState_Ensure()


def _funnel(method: F) -> F:
    """The one errno funnel every callback goes through (and, with metrics
    on, the one place its latency is measured)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Any, *args: Any) -> Any:
        ident = threading.get_ident()
        if ident not in _kept:  # this thread's first callback
            _keep_thread_state(ident)
        observe = funnel.observer
        start = time.perf_counter() if observe is not None else 0.0
        try:
            return method(self, *args)
        except Exception as exc:
            raise _to_errno(name, exc) from None
        finally:
            if observe is not None:
                observe(name, time.perf_counter() - start)

    return call  # type: ignore[return-value]


def _funnel_iter(op: str, items: Iterator[Any]) -> Iterator[Any]:
    """The same funnel for errors raised while a listing streams."""
    try:
        yield from items
    except Exception as exc:
        raise _to_errno(op, exc) from None


def _not_served(*args: Any) -> int:
    """In place of a callback the mount does without: mfusepy leaves it out
    of libfuse's table (libfuse_ignore), so libfuse answers ENOSYS itself."""
    raise mfusepy.FuseOSError(errno.ENOSYS)


_not_served.libfuse_ignore = True  # type: ignore[attr-defined]


class Adapter(mfusepy.Operations):
    """Delegates every callback to ReadOnlyFS. Used with raw_fi=True, so
    `open` can set keep_cache on libfuse's fuse_file_info."""

    use_ns = True  # times in nanoseconds (ReadOnlyFS.stat_dict)

    def __init__(
        self, fs: ReadOnlyFS, *, ttl_seconds: float | None, on_ready: Callable[[], None]
    ) -> None:
        self.fs = fs
        self.timeout = NEVER_SECONDS if ttl_seconds is None else ttl_seconds
        self.on_ready = on_ready
        self._fuse_ptr: int | None = None
        if fs.writes is None:  # nothing to write back at close(2): no FLUSH (see above)
            self.flush = _not_served  # type: ignore[method-assign, assignment]

    # -- lifecycle -------------------------------------------------------------

    def init_with_config(self, conn: Any, config: Any) -> None:
        if config is not None:
            config.attr_timeout = self.timeout
            config.entry_timeout = self.timeout
            config.negative_timeout = self.timeout
            config.kernel_cache = 0  # keep_cache is decided per open (pinned versions)
            config.direct_io = 0
        if conn is not None:
            conn.max_write = MAX_IO  # libfuse derives max_pages (the read size) from it
            log.info(
                "FUSE init: protocol %d.%d, max_readahead %d, max_write %d, max_read %d, "
                "capable 0x%x, want 0x%x, timeouts %.0f s",
                conn.proto_major, conn.proto_minor, conn.max_readahead, conn.max_write,
                conn.max_read, conn.capable, conn.want, self.timeout,
            )  # fmt: skip
        context = mfusepy._libfuse.fuse_get_context()  # NULL outside a FUSE thread
        self._fuse_ptr = context.contents.fuse if context else None
        self.on_ready()

    def stop_loop(self, loop_thread: threading.Thread) -> None:
        """End libfuse's loop from outside a callback (forced unmount): flag the
        session as exited, then interrupt the loop thread's wait with a signal."""
        if self._fuse_ptr is None or loop_thread.ident is None:
            return
        mfusepy._libfuse.fuse_exit(ctypes.c_void_p(self._fuse_ptr))
        signal.pthread_kill(loop_thread.ident, WAKE_SIGNAL)

    def _forget_attrs(self, path: str) -> None:
        """Drop the kernel's attributes (and pages) of `path` before the open
        that pinned a new version returns: its timeout runs from when it last
        asked, which may be after the namespace's entry was filled, and a read
        must not stop at the old size. Safe inside `open`: the opener holds no
        page of the file. Not in the cache, or no libfuse 3.1: nothing to do."""
        invalidate = getattr(mfusepy._libfuse, "fuse_invalidate_path", None)
        if self._fuse_ptr is None or invalidate is None:
            return
        result = invalidate(ctypes.c_void_p(self._fuse_ptr), os.fsencode(path))
        if result not in (0, -errno.ENOENT):
            log.debug("%s: the kernel kept its attributes (%s)", path, result)

    # -- reads -----------------------------------------------------------------

    @_funnel
    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        if fh is not None:  # through an open handle: its path may name another file now
            return self.fs.fgetattr(fh.fh)
        return self.fs.getattr(path)

    @_funnel
    def access(self, path: str, amode: int) -> int:
        self.fs.access(path, amode)
        return 0

    @_funnel
    def statfs(self, path: str) -> dict[str, int]:
        return self.fs.statfs()

    @_funnel
    def opendir(self, path: str) -> int:
        return self.fs.opendir(path)

    @_funnel
    def readdir_with_offset(self, path: str, offset: int, fh: int) -> Iterator[Any]:
        return _funnel_iter("readdir", self.fs.readdir(fh, offset))

    @_funnel
    def releasedir(self, path: str, fh: int) -> int:
        self.fs.releasedir(fh)
        return 0

    @_funnel
    def open(self, path: str, fi: Any) -> int:
        opened = self.fs.open(path, fi.flags)
        if self.fs.kernel_attrs_stale(path):
            self._forget_attrs(path)
        fi.fh = opened.fh
        fi.keep_cache = 1 if opened.keep_cache else 0
        fi.direct_io = 0
        return 0

    @_funnel
    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        return self.fs.read(fi.fh, offset, size)

    @_funnel
    def read_into(self, offset: int, view: memoryview, fi: Any) -> int:
        return self.fs.read_into(fi.fh, offset, view)

    @_funnel
    def release(self, path: str, fi: Any) -> int:
        self.fs.release(fi.fh)
        return 0

    @_funnel
    def flush(self, path: str, fi: Any) -> int:
        self.fs.flush(fi.fh)
        return 0

    @_funnel
    def fsync(self, path: str, datasync: int, fi: Any) -> int:
        self.fs.fsync(fi.fh)
        return 0

    @_funnel
    def readlink(self, path: str) -> str:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)

    # getxattr / listxattr are left out on purpose: libfuse answers ENOSYS once
    # and the kernel stops asking, so the two xattr probes `ls -l` makes per
    # file (ACL, security label) never reach Python.

    # -- writes: WritableFS serves them; ReadOnlyFS answers EROFS, so the rule
    # lives in one place --

    @_funnel
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        opened = self.fs.create(path, mode, fi.flags)
        fi.fh = opened.fh
        fi.keep_cache = 0
        fi.direct_io = 0
        return 0

    @_funnel
    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        return self.fs.write(path, data, offset, fh.fh)

    @_funnel
    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        if fh is not None:  # ftruncate: the handle decides, whatever its name is now
            self.fs.ftruncate(fh.fh, length)
        else:
            self.fs.truncate(path, length)
        return 0

    @_funnel
    def mkdir(self, path: str, mode: int) -> int:
        self.fs.mkdir(path, mode)
        return 0

    @_funnel
    def mknod(self, path: str, mode: int, dev: int) -> int:
        return self.fs.mknod(path)

    @_funnel
    def unlink(self, path: str) -> int:
        self.fs.unlink(path)
        return 0

    @_funnel
    def rmdir(self, path: str) -> int:
        self.fs.rmdir(path)
        return 0

    @_funnel
    def rename(self, old: str, new: str) -> int:
        self.fs.rename(old, new)
        return 0

    @_funnel
    def link(self, target: str, source: str) -> int:
        return self.fs.link(target, source)

    @_funnel
    def symlink(self, target: str, source: str) -> int:
        return self.fs.symlink(target, source)

    # chmod / chown / utimens of an unlinked open file (path None): nothing to do.

    @_funnel
    def chmod(self, path: str | None, mode: int) -> int:
        if path is not None:
            self.fs.chmod(path, mode)
        return 0

    @_funnel
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        if path is not None:
            self.fs.chown(path, uid, gid)
        return 0

    @_funnel
    def utimens(self, path: str | None, times: Any = None) -> int:
        if path is not None:
            self.fs.utimens(path, times)
        return 0

    @_funnel
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        return self.fs.setxattr(path)

    @_funnel
    def removexattr(self, path: str, name: str) -> int:
        return self.fs.removexattr(path)

    @_funnel
    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: Any) -> int:
        return self.fs.fallocate(path)


class _Fuse(mfusepy.FUSE):
    """mfusepy's FUSE with readdirplus: when the kernel asks for it, each entry
    goes out with its full attributes (FUSE_FILL_DIR_PLUS) instead of the mode
    only, so the kernel needs no lookup per entry."""

    def readdir_fuse_3(
        self, path: bytes | None, buf: Any, filler: Any, offset: int, fip: Any, flags: int
    ) -> int:
        plus = bool(flags & FUSE_READDIR_PLUS)
        st = mfusepy.c_stat()
        for name, attrs, next_offset in self.operations.readdir_with_offset(
            None, offset, fip.contents.fh
        ):
            ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
            if plus and name not in (".", ".."):
                mfusepy.set_st_attrs(st, attrs, use_ns=True)
                fill = FUSE_FILL_DIR_PLUS
            else:
                st.st_mode = attrs["st_mode"]
                fill = 0
            if filler(buf, name.encode(self.encoding, self.errors), st, next_offset, fill):
                break  # the kernel's buffer is full; it asks again from next_offset
        return 0

    def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        # mfusepy takes the bytes read() returns and memmoves them into libfuse's
        # buffer: a bytes object per request (1 MiB: an mmap, page faults and an
        # munmap each) and a second copy. Here the block bytes go straight into
        # libfuse's buffer through a writable view of it.
        target = (ctypes.c_char * size).from_address(ctypes.addressof(buf.contents))
        return int(self.operations.read_into(offset, memoryview(target).cast("B"), fip.contents))

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        # mfusepy drops the file handle; ftruncate of an unlinked file needs it.
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.truncate(decoded, length, fip.contents if fip else None)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        # mfusepy drops the flags; RENAME_NOREPLACE / RENAME_EXCHANGE cannot
        # be honoured over copy + delete, so refuse them rather than ignore them.
        if flags:
            return -errno.EINVAL
        return super().rename_fuse_3(old, new, flags)


def run(
    fs: ReadOnlyFS,
    mountpoint: str,
    *,
    ttl_seconds: float | None,
    fsname: str,
    max_threads: int,
    on_ready: Callable[[], None],
    adapter_ready: Callable[[Adapter], None] = lambda a: None,
) -> None:
    """Mount `fs` at `mountpoint` and serve until it is unmounted.

    `on_ready` runs (on a libfuse thread) once the kernel has connected.
    Raises MountFailed when libfuse cannot mount or its loop fails.
    """
    adapter = Adapter(fs, ttl_seconds=ttl_seconds, on_ready=on_ready)
    adapter_ready(adapter)
    writable = fs.writes is not None
    options: dict[str, Any] = {
        "foreground": True,  # the daemon detaches itself (mount.control); libfuse must not fork
        "nothreads": False,
        "ro": not writable,
        "fsname": fsname,
        "subtype": "datamount",
        "max_threads": max_threads,
        # libfuse 3.14 warns about its own default (UINT_MAX) unless this is set.
        "max_idle_threads": max_threads,
    }
    # Only the mounting user, unless fs.access lets others in (then always with
    # default_permissions: the kernel checks the owner and modes, fs.access).
    options.update(fs.permissions.fuse_options())
    # No hard_remove: libfuse turns the unlink of an open file (and a rename
    # over one) into a rename to .fuse_hidden*, which WritableFS takes as the
    # unlink it is (fs.writable: the blob is deleted, nothing is copied) while
    # the name keeps the node reachable, so fstat of the open file still works;
    # libfuse unlinks the hidden name after the last release.
    try:
        _Fuse(adapter, mountpoint, raw_fi=True, **options)
    except RuntimeError as exc:
        raise MountFailed(f"libfuse ended with status {exc}") from None
