"""Whole-file cache mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false):
`open` waits until the whole file is in the cache folder, reads are
`os.pread` on that local copy.

- One cache file per object version, named by a hash of store + key + etag
  and the size (`<sha256>-<size>`), so a changed blob is a different file and
  a restarted daemon reuses what it finds (a file of the wrong size, or a
  leftover `.part` / `.dl-*`, is removed at start).
- Single flight: the first `open` downloads, a concurrent `open` of the same
  version waits for that download.
- Large files (over one range) download through the transfer engine's
  Downloader, in parallel ranges pinned to the handle's etag, into a private
  folder renamed into place; a file of one range is one `read_into` written
  to a `.part` file and renamed, in the opening thread (no pool per small
  file). Cache files are 0600 and their folders 0700 (datamount.private);
  a large file's download folder is created 0700 before the Downloader
  writes into it (with the umask's modes) and its file is made 0600 before
  the rename. They are not fsync'd: after a crash the size in the name
  finds a truncated file, and the cache can always be refetched.
- Room: the cache holds at most `limit(free_bytes, used_bytes)` bytes
  (`Settings.cache_limit`: DATASET_MOUNT_CACHE_SIZE and
  DATASET_RESERVED_FREE_DISK_SPACE). An open that would pass
  `prune_threshold` of it removes least-recently-used files that no handle
  holds, down to `prune_target`. A file that cannot fit even then (or that
  the Downloader refuses: not enough disk, a name it cannot write) is served
  by `fallback`, the block reader.

Threads: downloads run in the opening thread (plus the Downloader's pool for
large files); one lock guards the index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import re
import shutil
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

from datamount.errors import DatamountError, StorageError, VersionChanged
from datamount.private import FILE_MODE, create, folders
from datamount.read.blocks import ObjectId
from datamount.read.reader import Reader, ReadHandle
from datamount.storage.base import ListPage, ObjectInfo, ReadableStore, paged_listing
from datamount.transfer.downloader import Downloader, DownloadOptions
from datamount.transfer.partfile import disk_free

log = logging.getLogger("datamount.wholefile")

_ENTRY = re.compile(r"^[0-9a-f]{64}-(\d+)$")


def entry_name(obj: ObjectId) -> str:
    digest = hashlib.sha256(f"{obj.store}\0{obj.key}\0{obj.etag}".encode()).hexdigest()
    return f"{digest}-{obj.size}"


class PinnedVersion(ReadableStore):
    """One version of one object as the Downloader sees it: `stat` answers
    the handle's ObjectId instead of asking storage, and every read is pinned
    to its etag, so the download fetches exactly that version; a second `stat`
    means the Downloader saw the object change and wants to restart, which a
    pinned handle must not do. Reads go to `inner`, which stays the caller's
    (close leaves it open)."""

    def __init__(self, inner: ReadableStore, obj: ObjectId) -> None:
        self.inner = inner
        self.obj = obj
        self._stats = 0

    @property
    def supports_ranges(self) -> bool:
        return self.inner.supports_ranges

    def _info(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, self.obj.size, self.obj.etag, None)

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        for _number, page in paged_listing([self._info(self.obj.key)], prefix, delimiter, 1):
            yield page

    def stat(self, key: str) -> ObjectInfo:
        self._stats += 1
        if self._stats > 1:
            raise VersionChanged(f"{key}: changed during its whole-file download", status=412)
        return self._info(key)

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        return self.inner.read(key, offset, length, etag=etag or self.obj.etag)

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        return self.inner.read_into(key, offset, buffer, etag=etag or self.obj.etag)

    def stream_into(self, key: str, fd: int, *, etag: str | None = None) -> int:
        return self.inner.stream_into(key, fd, etag=etag or self.obj.etag)

    def close(self) -> None:
        pass


class WholeFileHandle:
    def __init__(self, owner: WholeFileReader, name: str, fd: int, size: int) -> None:
        self._owner = owner
        self._name = name
        self._fd = fd
        self._size = size
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0:
            raise OSError(errno.EINVAL, f"invalid read: offset={offset} size={size}")
        if self._fd < 0:
            raise OSError(errno.EBADF, "read after close")
        return os.pread(self._fd, max(0, min(size, self._size - offset)), offset)

    def read_into(self, offset: int, view: memoryview) -> int:
        if offset < 0:
            raise OSError(errno.EINVAL, f"invalid read: offset={offset} size={len(view)}")
        if self._fd < 0:
            raise OSError(errno.EBADF, "read after close")
        size = max(0, min(len(view), self._size - offset))
        return os.preadv(self._fd, [view[:size]], offset) if size else 0

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
            self._owner._unpin(self._name)


class WholeFileReader:
    def __init__(
        self,
        store: ReadableStore,
        cache_dir: Path,
        options: DownloadOptions,
        limit: Callable[[int, int], int],
        fallback: Reader,
        *,
        prune_threshold: float = 1.0,
        prune_target: float = 0.7,
    ) -> None:
        self.store = store
        self.cache_dir = cache_dir
        # A private folder per download: nothing to resume. No fsync: a cache
        # file only has to be whole, which the size in its name checks.
        self.options = dataclasses.replace(options, overwrite=True, max_restarts=1, fsync=False)
        self.limit = limit
        self.fallback = fallback
        self.prune_threshold = prune_threshold
        self.prune_target = prune_target
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()  # complete files, LRU first
        self._pins: Counter[str] = Counter()
        self._downloads: dict[str, Future[bool]] = {}
        self._pending = 0  # bytes of downloads in progress
        self._used = 0  # bytes of complete files + downloads in progress
        self._closed = False
        folders(cache_dir)
        self._scan()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    def open(self, obj: ObjectId) -> ReadHandle:
        name = entry_name(obj)
        path = self.cache_dir / name
        while True:
            with self._lock:
                if self._closed:
                    raise OSError(errno.EIO, "the whole-file reader is closed")
                if name in self._files:
                    self._pins[name] += 1  # pinned: pruning leaves it alone
                    self._files.move_to_end(name)
                    break
                download = self._downloads.get(name)
                mine = download is None
                if download is None:
                    if not self._admit(obj.size):
                        return self.fallback.open(obj)
                    download = self._downloads[name] = Future()
                    self._used += obj.size
                    self._pending += obj.size
            if mine:
                self._download(obj, name, download)  # indexes and pins the file for us
            # A download's error is every waiter's error.
            if not download.result():
                return self.fallback.open(obj)
            if mine:
                break
            # A waiter pins the file on the next turn (or, if it was pruned
            # meanwhile, downloads it again).
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            self._unpin(name)
            raise
        return WholeFileHandle(self, name, fd, obj.size)

    def close(self) -> None:
        """Stop opening files (cached files stay for the next mount); close
        the fallback reader."""
        with self._lock:
            self._closed = True
        self.fallback.close()

    # -- downloads ---------------------------------------------------------

    def _download(self, obj: ObjectId, name: str, download: Future[bool]) -> None:
        """Fetch `obj` into the cache, then resolve `download` (True: cached,
        False: use the fallback) or fail it with an OSError."""
        ok = False
        try:
            if obj.size <= self.options.range_size:
                self._fetch_small(obj, name)
            else:
                self._fetch_large(obj, name)
            ok = True
        except OSError as exc:
            self._settle(name, obj.size, ok=False)
            download.set_exception(exc)
            return
        except DatamountError as exc:  # not enough disk, an unwritable name...
            log.warning("%s: whole-file cache refused (%s): streaming it instead", obj.key, exc)
        except BaseException as exc:
            self._settle(name, obj.size, ok=False)
            download.set_exception(exc)
            raise
        self._settle(name, obj.size, ok=ok)
        download.set_result(ok)

    def _fetch_small(self, obj: ObjectId, name: str) -> None:
        part = self.cache_dir / f".{name}.part"
        fd = create(part)
        try:
            if obj.size:
                buf = bytearray(obj.size)
                got = self.store.read_into(obj.key, 0, memoryview(buf), etag=obj.etag)
                if got != obj.size:
                    raise StorageError(f"{obj.key}: short read ({got} of {obj.size} bytes)")
                view = memoryview(buf)
                while view:
                    view = view[os.write(fd, view) :]
            os.close(fd)
            fd = -1
            os.replace(part, self.cache_dir / name)
        finally:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    def _fetch_large(self, obj: ObjectId, name: str) -> None:
        folder = self.cache_dir / f".dl-{name}"
        try:
            folders(folder)  # 0700: nobody else reaches the file while it is 0644
            pinned = PinnedVersion(self.store, obj)
            result = Downloader(pinned, self.options).download(
                obj.key, folder, is_file=True, source_id=f"{obj.store}/{obj.key}@{obj.etag}"
            )
            os.chmod(result.path, FILE_MODE)
            os.replace(result.path, self.cache_dir / name)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _settle(self, name: str, size: int, *, ok: bool) -> None:
        with self._lock:
            del self._downloads[name]
            self._pending -= size
            if ok:
                self._files[name] = size
                self._pins[name] += 1  # the opener's pin
            else:
                self._used -= size

    # -- room (lock held) -------------------------------------------------

    def _admit(self, size: int) -> bool:
        """Make room for `size` more bytes; False when the file cannot fit."""
        # Downloads in progress have not written their bytes yet: count them as
        # not free, or the limit would promise the same room twice.
        free = max(0, disk_free(self.cache_dir) - self._pending)
        limit = self.limit(free, self._used)
        if self._used + size <= self.prune_threshold * limit:
            return True
        prunable = sum(n for f, n in self._files.items() if not self._pins[f])
        if self._used - prunable + size > limit:
            return False
        target = self.prune_target * limit
        for victim, n in list(self._files.items()):
            if self._used + size <= target:
                break
            if self._pins[victim]:
                continue
            with contextlib.suppress(FileNotFoundError):
                (self.cache_dir / victim).unlink()
            del self._files[victim]
            self._used -= n
        return self._used + size <= limit

    def _unpin(self, name: str) -> None:
        with self._lock:
            self._pins[name] -= 1
            if self._pins[name] <= 0:
                del self._pins[name]

    def _scan(self) -> None:
        """Index the files an earlier run left (LRU by mtime); remove partial ones."""
        found = []
        for entry in os.scandir(self.cache_dir):
            if entry.name.startswith(".dl-") and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                continue
            if entry.name.startswith(".") and entry.name.endswith(".part"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                continue
            match = _ENTRY.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            if st.st_size != int(match.group(1)):  # truncated by a crash
                os.unlink(entry.path)
                continue
            found.append((st.st_mtime, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._files[name] = size
            self._used += size
