"""The disk tier: one self-checking file per block, written in the background.

Layout: `root/ab/<32 hex>.blk`, the hex a BLAKE2b-128 of the block's full
identity (store, key, etag, object size, block index), so blocks of another
etag live under other names. One level of 256 folders, created on first use
(why not two: docs/design/cache.md, "One level of folders"; folders of the
two-level layout found at start are removed). The file format and the
writing of one file live in blockfile.py: a corrupt, truncated,
foreign-version or other-format file is a miss and is removed. No fsync.

Writes never block a reader: `put` appends to a queue bounded in bytes, the
DISK_QUEUE area of the mount's MemoryBudget (budget.py); a block being
written still counts. A full queue, or a full budget, skips the block
(`disk_queue_dropped`). A queued block is served by `get` from the queue.

Invariants: the bytes of every indexed file and of every write in flight are
counted; before each write, past limit(free, used) × prune_threshold the
least-recently-used files go until used + new ≤ limit × prune_target, else
the block is dropped, so the total never exceeds the bound. A final name
never holds a torn block. One process per root.

Restart: `root/tmp` is emptied; a background thread indexes the existing
files (oldest mtime = least recent); `get` reads any file by its path
meanwhile, writers wait for the index. Counts `disk_evictions` and
`disk_queue_dropped` (hits and misses: tiered.py).

Threads: one indexer, `write_threads` writers; `get`/`put` from any thread.
Lock order: the space lock, then the index lock; the queue's Condition, then
the budget. No block is read or written under a lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from datamount.budget import DISK_QUEUE, MemoryBudget
from datamount.private import folders
from datamount.read.blocks import BlockData, BlockKey, ObjectId
from datamount.read.cache import blockfile
from datamount.read.cache.blockfile import (
    SUFFIX,
    TMP_DIR,
    BlockFiles,
    CachedBlocks,
    block_name,
    block_names,
    encode_header,
    header_size,
    identity,
)
from datamount.read.stats import MountStats

log = logging.getLogger("datamount.read.cache.disk")

# Entries inserted per lock hold while indexing, so lookups never wait long.
# Why 4,096: docs/design/cache.md ("Indexing at restart").
_INDEX_CHUNK = 4096
_HEX = frozenset("0123456789abcdef")


def _free_bytes(root: Path) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


class DiskCache:
    def __init__(
        self,
        root: Path,
        *,
        limit: Callable[[int, int], int],
        prune_threshold: float,
        prune_target: float,
        write_threads: int,
        max_queue_bytes: int | None = None,
        budget: MemoryBudget | None = None,
        stats: MountStats | None = None,
        free_bytes: Callable[[], int] | None = None,
    ) -> None:
        """`limit(free_bytes, used_bytes)` is the total the cache may hold
        (settings.cache_limit). The queue draws from `budget`, the mount's
        shared MemoryBudget, or from one of its own of `max_queue_bytes`.
        `free_bytes` overrides os.statvfs(root) (tests simulate a small disk
        with it)."""
        if not 0.0 < prune_target <= prune_threshold <= 1.0:
            raise ValueError("need 0 < prune_target <= prune_threshold <= 1")
        if (budget is None) == (max_queue_bytes is None):
            raise ValueError("give exactly one of max_queue_bytes and budget")
        if max_queue_bytes is not None and max_queue_bytes < 0:
            raise ValueError("need max_queue_bytes >= 0")
        if budget is None:
            budget = MemoryBudget({DISK_QUEUE: max_queue_bytes or 0})
        elif not budget.has(DISK_QUEUE):
            raise ValueError("the memory budget has no disk-queue area")
        if write_threads < 1:
            raise ValueError("need write_threads >= 1")
        self.root = Path(root)
        self._limit = limit
        self._threshold = prune_threshold
        self._target = prune_target
        self.budget = budget
        self._stats = stats
        self._free = free_bytes or (lambda: _free_bytes(self.root))
        self._tmp = self.root / TMP_DIR
        folders(self.root)  # private: datamount.private
        shutil.rmtree(self._tmp, ignore_errors=True)  # leftovers of a killed process
        folders(self._tmp)
        self._files = BlockFiles(self.root)  # closed by close(), after the writers

        self._lock = threading.Lock()  # guards _index, _used, _in_flight
        self._index: OrderedDict[str, int] = OrderedDict()  # name -> file size, LRU first
        self._used = 0  # indexed files + writes in flight
        self._in_flight = 0  # reserved by writers, not yet renamed
        self._space_lock = threading.Lock()  # one writer at a time checks the bound
        queue_lock = threading.RLock()
        self._cond = threading.Condition(queue_lock)  # guards the queue and _closing
        # flush() waits on its own condition: the queue running dry wakes it,
        # not the idle writers (one notify_all per drained queue woke them all).
        self._drained = threading.Condition(queue_lock)
        self._queue: deque[tuple[str, BlockKey]] = deque()
        self._queued: dict[str, BlockData] = {}  # queued or being written
        self._queued_bytes = 0
        self._closing = False
        self._ready = threading.Event()  # the existing files are indexed
        # Told the key of every block file written and indexed (a writer
        # thread, or the fetch lane's caller): read.ahead announces prefetched
        # small files to the native FUSE loop. Must not block.
        self.on_written: Callable[[BlockKey], None] | None = None

        self._threads = [threading.Thread(target=self._index_existing, name="dm-disk-index")]
        self._threads += [
            threading.Thread(target=self._write_loop, name=f"dm-disk-writer-{i}")
            for i in range(write_threads)
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    # --- the BlockCache protocol ---------------------------------------------------

    def files_of(self, obj: ObjectId, block_size: int) -> CachedBlocks | None:
        """Where this tier keeps every block of `obj`, or None unless it holds
        them all: the native FUSE loop reads a whole cached file without
        Python, and leaves any other to Python, whose prefetch must see every
        read (docs/design/ro_mount.md, "The native loop"). The blocks count as
        used now, file by file: the reads that follow do not tell this tier."""
        names = block_names(obj, block_size)
        with self._lock:
            indexed = all(name in self._index for name in names)
            if indexed:
                for name in names:
                    self._index.move_to_end(name)
            ready = self._ready.is_set()
        paths = tuple(map(self._files.path, names))
        if not indexed and (ready or not all(map(os.path.isfile, paths))):
            return None
        return CachedBlocks(block_size, obj.size, *identity(obj), paths)

    def get(self, key: BlockKey) -> BlockData | None:
        name = block_name(key)
        with self._cond:
            queued = self._queued.get(name)
            if self._closing:
                return None
        if queued is not None:
            return queued
        with self._lock:
            if self._ready.is_set() and name not in self._index:
                return None  # once built, the index knows every file: no syscall for a miss
        path = self._files.path(name)
        try:
            found = blockfile.read(path, key)
        except FileNotFoundError:  # removed behind our back: stop counting it
            with self._lock:
                self._used -= self._index.pop(name, 0)
            return None
        except OSError as exc:
            log.warning("disk cache: cannot read %s: %s", path, exc)
            return None
        if found is None:
            log.warning("disk cache: removing invalid block %s", path)
            self._forget(name, path)
            return None
        data, size = found
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
            elif not self._ready.is_set():  # found before the indexer got there
                self._index[name] = size
                self._used += size
        return data

    def put(self, key: BlockKey, data: BlockData) -> None:
        name = block_name(key)
        with self._lock:
            if name in self._index:
                return
        dropped = False
        with self._cond:
            if self._closing or name in self._queued:
                return
            if not self.budget.try_reserve(DISK_QUEUE, len(data)):
                dropped = True
            else:
                self._queue.append((name, key))
                self._queued[name] = data
                self._queued_bytes += len(data)
                self._cond.notify()  # busy writers find it anyway (no waiter: no wake-up)
        if dropped and self._stats is not None:
            self._stats.add(disk_queue_dropped=1)

    def write_elsewhere(self, key: BlockKey, length: int) -> tuple[str, int] | None:
        """Room for a block of `length` bytes that another process writes into
        `root` (read/fetchlane.py's workers, with blockfile.BlockFiles): its file
        name and the bytes reserved for it, or None (not now: the block comes
        through `put` as usual). Answer with `written_elsewhere`."""
        name = block_name(key)
        total = self._files.file_size(header_size(key.obj), length)
        if self._closing or not self._reserve(name, total):
            return None
        return name, total

    def written_elsewhere(self, key: BlockKey, name: str, reserved: int, size: int) -> None:
        """The file of `key`'s `write_elsewhere` block is written (`size`: its
        file's size, as BlockFiles.write returned it) or not (0): indexed, or
        its reservation given back."""
        with self._lock:
            self._in_flight -= reserved
            self._used += size - reserved
            if size:
                self._index[name] = size
        if size:
            self._told(key)

    def contains(self, key: BlockKey) -> bool:
        name = block_name(key)
        with self._cond:
            if name in self._queued:
                return True
        with self._lock:
            if name in self._index:
                return True
        return not self._ready.is_set() and os.path.isfile(self._files.path(name))

    def close(self) -> None:
        """Abandon the queued blocks, let each writer finish the block it is
        writing, and join the threads."""
        with self._cond:
            self._closing = True
            for name, _ in self._queue:
                self._unqueue(name)
            self._queue.clear()
            self._cond.notify_all()
            self._drained.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._files.close()

    # --- extras for the composition root and tests ----------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued block is written or dropped; False on timeout."""
        with self._cond:
            return self._drained.wait_for(lambda: not self._queued, timeout)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the files found at start are indexed."""
        return self._ready.wait(timeout)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    @property
    def queued_bytes(self) -> int:
        with self._cond:
            return self._queued_bytes

    def path_of(self, key: BlockKey) -> Path:
        """Where the block's file is (or would be)."""
        return self._path(block_name(key))

    @property
    def _direct(self) -> bool:
        """Whether big blocks are written with O_DIRECT (False once refused)."""
        return self._files.direct

    def _path(self, name: str) -> Path:
        return Path(self._files.path(name))

    # --- reading ----------------------------------------------------------------------

    def _forget(self, name: str, path: str) -> None:
        """Drop an invalid file from the index and the disk, in one step for pruners."""
        with self._lock:
            self._used -= self._index.pop(name, 0)
            with contextlib.suppress(OSError):
                os.unlink(path)

    # --- writing ----------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or (self._queue and self._ready.is_set()))
                if self._closing:
                    return
                name, key = self._queue.popleft()
                data = self._queued[name]
            try:
                self._write(name, key, data)
            except Exception:  # a writer must survive anything: the block is just not cached
                log.exception("disk cache: writing a block failed")
            finally:
                with self._cond:
                    self._unqueue(name)
                    if not self._queued:  # what flush() waits for
                        self._drained.notify_all()

    def _unqueue(self, name: str) -> None:
        """A queued block is written, dropped or abandoned: give its bytes back. _cond held."""
        size = len(self._queued.pop(name))
        self._queued_bytes -= size
        self.budget.release(DISK_QUEUE, size)

    def _write(self, name: str, key: BlockKey, data: BlockData) -> None:
        header = encode_header(key, data)  # the checksum runs here, off the reader's path
        total = self._files.file_size(len(header), len(data))
        if self._closing or not self._reserve(name, total):
            return
        final = self._files.path(name)
        try:
            size = self._files.write(name, header, data)
        except OSError as exc:
            with self._lock:
                self._used -= total
                self._in_flight -= total
            log.warning("disk cache: cannot write %s: %s", final, exc)
            return
        with self._lock:
            self._in_flight -= total
            self._used += size - total  # where O_DIRECT was refused just now: compact
            self._index[name] = size
        self._told(key)

    def _told(self, key: BlockKey) -> None:
        on_written = self.on_written
        if on_written is None:
            return
        try:
            on_written(key)
        except Exception:  # only an announcement: the block is cached either way
            log.exception("disk cache: announcing a written block failed")

    def _reserve(self, name: str, size: int) -> bool:
        """Make room for `size` bytes (pruning LRU files) and count them as used."""
        with self._space_lock:
            with self._lock:
                if name in self._index:
                    return False
                used, in_flight = self._used, self._in_flight
            try:
                free = max(0, self._free() - in_flight)
            except OSError as exc:
                log.warning("disk cache: statvfs %s: %s", self.root, exc)
                return False
            limit = self._limit(free, used)
            if size > limit:
                return False
            if used + size > limit * self._threshold:
                self._prune(int(limit * self._target) - size)
            with self._lock:
                if self._used + size > limit:
                    return False
                self._used += size
                self._in_flight += size
                return True

    def _prune(self, goal: int) -> None:
        """Delete least-recently-used files until the used bytes are <= goal."""
        evicted = 0
        while True:
            with self._lock:  # one file per hold: readers interleave
                if self._used <= goal or not self._index:
                    break
                name, size = self._index.popitem(last=False)
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._files.path(name))
                except OSError as exc:  # still on disk: keep counting it, stop pruning
                    self._index[name] = size
                    self._index.move_to_end(name, last=False)
                    log.warning("disk cache: cannot prune %s: %s", name, exc)
                    break
                self._used -= size
            evicted += 1
        if evicted and self._stats is not None:
            self._stats.add(disk_evictions=evicted)

    # --- restart --------------------------------------------------------------------

    def _index_existing(self) -> None:
        """Index the files a previous process left, oldest mtime first."""
        found: list[tuple[int, str, int]] = []
        try:
            for top in _subdirs(self.root):
                if self._closing:
                    return
                for leaf in _subdirs(top):  # the two-level layout of earlier versions
                    _remove_old_blocks(leaf, top.name + leaf.name)
                for entry in os.scandir(top):
                    name = entry.name.removesuffix(SUFFIX)
                    if entry.name.endswith(SUFFIX) and _is_block_name(name, top.name):
                        st = entry.stat()
                        found.append((st.st_mtime_ns, name, st.st_size))
        except OSError as exc:
            log.warning("disk cache: indexing %s stopped: %s", self.root, exc)
        finally:
            found.sort(reverse=True)  # newest first: each goes to the front, so oldest ends first
            for start in range(0, len(found), _INDEX_CHUNK):
                with self._lock:
                    for _, name, size in found[start : start + _INDEX_CHUNK]:
                        if name not in self._index:
                            self._index[name] = size
                            self._index.move_to_end(name, last=False)
                            self._used += size
            self._ready.set()
            with self._cond:
                self._cond.notify_all()
            if found:
                log.info("disk cache: reusing %d blocks in %s", len(found), self.root)


def _remove_old_blocks(leaf: Path, prefix: str) -> None:
    """Delete the block files of a two-level layout folder, then the folder if empty."""
    for entry in os.scandir(leaf):
        name = entry.name.removesuffix(SUFFIX)
        if entry.name.endswith(SUFFIX) and len(name) == 32 and name[:4] == prefix:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        leaf.rmdir()


def _subdirs(folder: Path) -> list[Path]:
    return [
        Path(e.path)
        for e in os.scandir(folder)
        if len(e.name) == 2 and _is_hex(e.name) and e.is_dir(follow_symlinks=False)
    ]


def _is_block_name(name: str, prefix: str) -> bool:
    return len(name) == 32 and name[:2] == prefix and _is_hex(name)


def _is_hex(text: str) -> bool:
    return bool(text) and set(text) <= _HEX
