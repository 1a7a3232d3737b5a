"""The local-disk side of a download, shared by the Downloader
(transfer.downloader) and its worker processes (transfer.worker): a file's
hidden, pre-sized `.part`, written by position, O_DIRECT where the
filesystem takes it; the ranged fetch into a per-thread buffer; and a
local disk's OSError as one line.

- `PartFile.open` creates (or truncates, for a restart) the `.part` at its
  final size. Files of DIRECT_MIN and more get O_DIRECT: the only descriptor
  when the size is a multiple of ALIGN (every write aligned), else a second
  one for the aligned ranges beside the buffered one.
  Where O_DIRECT is used on a file above ALLOCATE_ABOVE, its blocks are
  allocated up front (`allocate`).
- `DirectIO` is one download's O_DIRECT state: on until a filesystem refuses
  it (tmpfs, some FUSE filesystems), then buffered writes for the rest.
- `Folders` makes the destination's folders; a local disk's OSError becomes
  one line naming the path and the OS reason (`local_error`, `as_data_error`).

Threads: a PartFile belongs to one file in flight (its ranges may be written
from several threads at once: positional writes); `DirectIO` and `Buffers`
are shared by every thread of one download (a Buffers holds one buffer per
thread); `Folders` is used from the Downloader's calling thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from datamount.errors import DataError, StorageError
from datamount.storage.base import ObjectInfo, ReadableStore

# O_DIRECT alignment of offsets, lengths and buffer addresses: the page size
# covers both 512e and 4Kn disks.
ALIGN = 4096
DIRECT_MIN = 64 << 10  # below this, O_DIRECT's uncached write is not worth it
# Files above this (the default range size: smaller ones are one write from
# one thread) get their blocks allocated at open when written with O_DIRECT.
ALLOCATE_ABOVE = 8 << 20


class DirectIO:
    """Whether this download still tries O_DIRECT; `log` (None: silent)
    says once per refusal that writes are buffered from now on."""

    def __init__(self, enabled: bool, log: logging.Logger | None = None) -> None:
        self.enabled = enabled
        self._log = log

    def open(self, path: str | Path, flags: int) -> int:
        """An O_DIRECT descriptor, or -1 (and O_DIRECT off) where refused."""
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644)
        except OSError as exc:  # tmpfs and some FUSE filesystems refuse O_DIRECT
            if self._log is not None:
                self._log.info(
                    "O_DIRECT unavailable in %s (%s): buffered writes",
                    Path(path).parent,
                    exc.strerror,
                )
            self.enabled = False
            return -1


@dataclass(eq=False)
class PartFile:
    """One file's `.part` and its descriptors while it is written."""

    path: Path | str
    fd: int = -1  # buffered, or O_DIRECT when every write of the file is aligned
    dfd: int = -1  # a second, O_DIRECT descriptor for the aligned ranges (else -1)

    def open(self, size: int, direct: DirectIO, *, ranges: bool = True) -> None:
        """Create the pre-sized .part (truncated: a restart starts from
        nothing); big files get O_DIRECT for their aligned ranges (`ranges`:
        the store reads by range, so writes land by position).

        Why O_DIRECT: buffered writes cost far more kernel CPU per GiB
        (docs/design/download.md, "O_DIRECT writes"). Buffers are mmap'd, so
        page aligned; range offsets are multiples of range_size.
        """
        self.close()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        wanted = direct.enabled and size >= DIRECT_MIN and ranges
        uncached = False  # O_DIRECT writes will fill it, from several threads
        if wanted and size % ALIGN == 0:
            self.fd = direct.open(self.path, flags)
            uncached = self.fd >= 0
        if self.fd < 0:
            self.fd = os.open(self.path, flags, 0o644)
            if wanted and direct.enabled:
                self.dfd = direct.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
                uncached = self.dfd >= 0
        # Pre-sized: ranges land by position. O_DIRECT ranges go into blocks
        # allocated now (`allocate`), else the file is sparse until written.
        uncached = uncached and size > ALLOCATE_ABOVE
        if size and not (uncached and allocate(self.fd, size)):
            os.ftruncate(self.fd, size)

    def write(self, view: memoryview, offset: int) -> None:
        aligned = offset % ALIGN == 0 and len(view) % ALIGN == 0
        fd = self.dfd if self.dfd >= 0 and aligned else self.fd
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def check(self, size: int) -> os.stat_result:
        """Its stat once every byte is written; a size other than `size`
        closes it and is a DataError."""
        st = os.fstat(self.fd)
        if st.st_size != size:
            self.close()
            raise DataError(f"{self.path}: size {st.st_size} after download, expected {size}")
        return st

    def close(self) -> None:
        for fd in (self.fd, self.dfd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dfd = -1


@functools.cache
def _fallocate() -> Callable[..., int] | None:
    """libc's fallocate(2) (os has only posix_fallocate, whose fallback
    writes every block); None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library already loaded
        fn = getattr(libc, "fallocate64", None) or libc.fallocate  # a 64-bit off_t
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    fn.restype = ctypes.c_int
    return fn


def allocate(fd: int, size: int) -> bool:
    """Allocate `fd`'s first `size` bytes (size set, blocks reserved,
    reading as zeros); False where the filesystem cannot (the caller
    truncates instead).

    Why: ext4 takes the inode lock exclusively for an O_DIRECT write that
    allocates blocks, so the 8 threads' writes into one sparse file queue
    behind each other; into allocated blocks they run side by side
    (docs/design/download.md, "fallocate before O_DIRECT").
    """
    fn = _fallocate()
    return fn is not None and fn(fd, 0, 0, size) == 0


class Buffers:
    """One reusable buffer of `size` per thread, mmap'd: page-aligned, as
    O_DIRECT needs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._local = threading.local()

    def get(self) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(mmap.mmap(-1, self.size))
        return buf


def read_range(store: ReadableStore, key: str, offset: int, view: memoryview, etag: str) -> None:
    """Fill `view` from `key` at `offset`, pinned to `etag` (VersionChanged
    if the blob changed); a short read is a non-transient StorageError."""
    got = store.read_into(key, offset, view, etag=etag)
    if got != len(view):
        raise StorageError(
            f"{key}: short read at {offset} ({got} of {len(view)} bytes)", transient=False
        )


def read_span(
    store: ReadableStore,
    key: str,
    offset: int,
    length: int,
    buffer: memoryview,
    sink: Callable[[memoryview, int], None],
    etag: str,
) -> None:
    """Bytes [offset, offset+length) of `key` through `buffer` into `sink`
    (ReadableStore.read_span), pinned to `etag`; short is as in `read_range`."""
    got = store.read_span(key, offset, length, buffer, sink, etag=etag)
    if got != length:
        raise StorageError(
            f"{key}: short read at {offset} ({got} of {length} bytes)", transient=False
        )


def changed(store: ReadableStore, key: str, restarts: int, max_restarts: int) -> ObjectInfo:
    """The new version of a blob that changed mid-download, for restart
    number `restarts`; more than `max_restarts` is a DataError."""
    if restarts > max_restarts:
        raise DataError(f"{key}: changed {restarts} times during the download; giving up") from None
    return store.stat(key)


class Folders:
    """The folders a download made (each made once), and why one cannot be."""

    def __init__(self) -> None:
        self._made: set[Path] = set()

    def ensure(self, path: Path) -> None:
        if path not in self._made:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise DataError(
                    f"cannot create folder {path}: a file of the same name is in the way"
                ) from None
            except OSError as exc:
                raise local_error(f"cannot create folder {path}", exc) from None
            self._made.add(path)


def disk_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def existing(path: Path) -> Path:
    """The nearest folder of `path` that exists (itself, if it does)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def local_error(what: str, exc: OSError) -> DataError:
    return DataError(f"{what}: {exc.strerror or exc}")


@contextlib.contextmanager
def local_errors(what: str) -> Iterator[None]:
    """An OSError in the block as `local_error(what, ...)`."""
    try:
        yield
    except OSError as exc:
        raise local_error(what, exc) from None


def as_data_error(exc: BaseException, dest: Path) -> BaseException:
    """A local disk's OSError (a write that hit ENOSPC, a rename on a disk
    remounted read-only) as one line naming the destination (exit 3); the
    .part files are gone by then. Storage errors and the rest stay as they are."""
    if not isinstance(exc, OSError) or isinstance(exc, StorageError):
        return exc
    name = f" ({os.fsdecode(exc.filename)})" if exc.filename is not None else ""
    return local_error(f"download to {dest} failed{name}", exc)
