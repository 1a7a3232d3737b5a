"""Open files that outlive their name (rw_mount): before this mount deletes or
replaces a stored blob version that handles still read (unlink, rename over
it, rename of it), the version is copied to an anonymous local file in the
staging folder and those handles read the copy from then on — as on a local
filesystem, where an open file keeps its bytes until the last close
(`tempfile`, and a checkpoint reader while the writer does rename(tmp, name)).

The name side: libfuse hides such a file (HIDDEN below); `is_hidden`,
`open_as` and `rename_open` are what the filesystem asks of that.

One job: make and serve those copies. `keep_readers(files, ...)` gives the
handles a mount is about to orphan their copies (one per version, shared);
`keep(handle, attrs, directory)` copies
one version through the handle that pinned it (its blocks may be cached) into
an O_TMPFILE file (nothing is left behind by a crash); `KeptCopy.view()` gives
each handle of that version its own `KeptView`, which closes the handle it
replaced when it is closed; the copy's file closes with its last view.

Threads: any FUSE thread. A copy's reference count is under its lock; reads
are positional on a shared fd.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from datamount.errors import os_error
from datamount.fs.handles import OpenFile
from datamount.fs.namespace import Attrs
from datamount.read.reader import ReadHandle

CHUNK = 8 << 20
# The FUSE layer (fs._lowlevel, as libfuse's high-level API without
# hard_remove) renames an open file that is unlinked or renamed over to
# .fuse_hidden<node><n> in its folder, and unlinks that name after the last
# release: the filesystem takes the rename as the unlink it is, and the open
# files answer to the hidden name meanwhile (fstat: nlink 0).
HIDDEN = ".fuse_hidden"

log = logging.getLogger("datamount.fs.kept")


def is_hidden(path: str) -> bool:
    return path.rpartition("/")[2].startswith(HIDDEN)


def open_as(files: Iterable[OpenFile], path: str) -> OpenFile:
    """The open file libfuse keeps under the hidden name `path` (ENOENT: none)."""
    for file in files:
        if file.path == path:
            return file
    raise os_error(errno.ENOENT, path)


def rename_open(files: Iterable[OpenFile], old: str, new: str) -> None:
    """The open files of `old` answer to `new` from now on."""
    for file in files:
        if file.path == old:
            file.path = new


def keep_readers(
    files: Iterable[OpenFile],
    directory: Path,
    room: Callable[[int], None],
) -> int:
    """Before this mount deletes or replaces the blob versions that
    `files` read: each of those handles reads a local copy from now on, one copy
    per version. `room(size)` raises ENOSPC when the staging disk cannot hold a
    copy. Returns how many handles were kept; a version that cannot be copied is
    logged, and its handles' next reads are ESTALE, as with any vanished version."""
    versions: dict[tuple[str, str], list[OpenFile]] = {}
    for file in files:
        if file.obj is not None and not isinstance(file.handle, KeptView):
            versions.setdefault((file.obj.key, file.obj.etag), []).append(file)
    kept = 0
    for (key, etag), group in versions.items():
        size = group[0].obj.size  # type: ignore[union-attr]
        attrs = Attrs(is_dir=False, size=size, mtime=group[0].mtime, key=key, etag=etag)
        try:
            room(size)
            copy = keep(group[0].handle, attrs, directory)
        except OSError as exc:
            log.warning(
                "%s is open for reading and this mount deletes or replaces it; no local "
                "copy could be kept (%s): its open handles' next reads are ESTALE", key, exc,
            )  # fmt: skip
            continue
        for file in group:
            file.handle = copy.view(file.handle)
        kept += len(group)
        log.info("%s: %d open handle(s) read a local copy of %d bytes", key, len(group), size)
    return kept


class KeptCopy:
    """A local copy of one blob version, shared by the handles that read it."""

    def __init__(self, fd: int, attrs: Attrs) -> None:
        self.fd = fd
        self.attrs = attrs
        self._lock = threading.Lock()
        self._views = 0

    def view(self, replaced: ReadHandle) -> KeptView:
        with self._lock:
            self._views += 1
        return KeptView(self, replaced)

    def _release(self) -> None:
        with self._lock:
            self._views -= 1
            last = self._views == 0
        if last:
            os.close(self.fd)


class KeptView:
    """One handle's `ReadHandle` over a KeptCopy."""

    def __init__(self, copy: KeptCopy, replaced: ReadHandle) -> None:
        self.copy = copy
        self.attrs = copy.attrs
        self._replaced: ReadHandle | None = replaced
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.copy.fd, size, offset)

    def read_into(self, offset: int, view: memoryview) -> int:
        return os.preadv(self.copy.fd, [view], offset)

    def close(self) -> None:
        with self._lock:
            replaced, self._replaced = self._replaced, None
        if replaced is not None:
            replaced.close()
            self.copy._release()


def keep(handle: ReadHandle, attrs: Attrs, directory: Path) -> KeptCopy:
    """Copy the version `handle` reads (`attrs.size` bytes) to an anonymous file
    in `directory`. Raises OSError (ESTALE when the version is already gone,
    ENOSPC when the disk fills); nothing is left behind then."""
    fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        buffer = memoryview(bytearray(min(CHUNK, max(attrs.size, 1))))
        offset = 0
        while offset < attrs.size:
            n = handle.read_into(offset, buffer[: min(len(buffer), attrs.size - offset)])
            if n <= 0:
                raise os_error(errno.EIO, f"{attrs.key}: ended at {offset} of {attrs.size} bytes")
            written = 0
            while written < n:
                written += os.pwrite(fd, buffer[written:n], offset + written)
            offset += n
    except BaseException:
        os.close(fd)
        raise
    return KeptCopy(fd, attrs)
