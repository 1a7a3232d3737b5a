"""Making a group of complete files durable before they get their final
names: one `syncfs(2)` of the destination's filesystem for the whole group,
or one `fsync(2)` per file where syncfs cannot stand in for it.

Why: every fsync flushes the disk's write cache (and on ext4 without a
journal also writes the parent folder), one syncfs flushes it once for the
group (docs/design/download.md, "Group commit").

syncfs writes back every dirty page and inode of the filesystem and flushes
the device once: for each file of the group, whose writes all returned
before the call, it gives what that file's fsync gives. Linux reports
write-back errors through syncfs only since 5.8; on older kernels, on a
platform without syncfs, and for a file on another filesystem than the
destination (a folder inside DEST that is a mount point), each file is
fsync'd.

Threads: none of its own; called under the Downloader's commit lock.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = platform.release().split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (IndexError, ValueError):
        return False


@functools.cache
def syncfs() -> Callable[[int], int] | None:
    """libc's syncfs, where it reports write-back errors (Linux >= 5.8);
    None: every file is fsync'd."""
    if not sys.platform.startswith("linux") or not _kernel_at_least(5, 8):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library already loaded
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


class GroupSync:
    """Durability for the files of one destination; `open` before `sync`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fd = -1
        self._dev = -1

    def open(self) -> None:
        if syncfs() is not None and self._fd < 0:
            self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._dev = os.fstat(self._fd).st_dev

    @property
    def dev(self) -> int:
        """The st_dev one syncfs covers; -1 when every file is fsync'd."""
        return self._dev if self._fd >= 0 and syncfs() is not None else -1

    def sync(self, files: Sequence[tuple[int, int]]) -> None:
        """Make durable every file of `files` ((fd, st_dev) pairs) whose
        writes are all done; OSError if any of it could not be written.
        fd -1: a file written by another process (transfer.processlane) on `dev`,
        which the syncfs covers."""
        call = syncfs()
        if self._fd < 0 or call is None:
            for fd, _ in files:
                os.fsync(fd)
            return
        for fd, dev in files:
            if dev != self._dev and fd >= 0:  # another filesystem under DEST
                os.fsync(fd)
        if any(dev == self._dev for _, dev in files) and call(self._fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(self.root))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
