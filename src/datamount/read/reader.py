"""pread-style reads of pinned object versions: the interface the filesystem
ops use, and its two implementations in block mode.

`Reader.open(obj)` returns a handle pinned to `obj` (key + etag + size);
`handle.read(offset, size)` returns bytes (short only at end of file),
`handle.read_into(offset, view)` fills a buffer with them, and both raise
OSError (ESTALE when the version changed, EIO/EACCES...) on failure.
Handles are independent and safe to use from several threads at once: reads
are positional, there is no shared file position.

- `BlockReader`: a read asks the BlockFetcher for all the blocks it covers
  at once (fetched in parallel), tells its handle's StreamTable (one
  PrefetchPolicy per sequential stream) what it read and schedules the
  blocks that stream wants ahead, then waits for its own blocks and
  assembles the bytes. A read outside a sequential stream is
  also reported to the mount's DenseFill (read/densefill.py), which may fill
  the rest of the file and grants its misses part reads (read/parts.py).
  Consistency: every block is keyed by the handle's etag, so a read returns
  bytes of that one version; once the object changes, a read that needs a
  block not yet fetched fails with ESTALE, never a mix of versions.
- `DirectReader`: every read is one ranged request (tests, baselines).

Threads: none of their own; reads run in the caller's thread and wait for the
fetcher's workers, except a random read that is one part read of one block
(read/parts.py `read_part_into`), whose GET runs in the caller's thread.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Protocol

from datamount.read.blocks import BlockData, BlockKey, ObjectId, block_count, blocks_for
from datamount.read.copy import copy_into
from datamount.read.densefill import DenseFill
from datamount.read.fetch import BlockFetcher
from datamount.read.parts import (
    PART_ALIGN,
    PART_MIN_BLOCK,
    fetch_part,
    part_span,
    read_part_into,
)
from datamount.read.prefetch.policy import reorder_slack
from datamount.read.prefetch.streams import MAX_STREAMS, StreamTable
from datamount.storage.base import ObjectStore


class ReadHandle(Protocol):
    """One open, pinned object version. `read` returns the bytes of
    [offset, offset + size) (short only at end of file); `read_into` puts the
    same bytes into `view` (the FUSE request's buffer, read size = len(view))
    and returns how many, so a handle that holds the bytes (block mode) copies
    them straight in, with no bytes object of the read's size."""

    def read(self, offset: int, size: int) -> bytes: ...

    def read_into(self, offset: int, view: memoryview) -> int: ...

    def close(self) -> None: ...


class Reader(Protocol):
    def open(self, obj: ObjectId) -> ReadHandle: ...

    def close(self) -> None: ...


class DirectHandle:
    def __init__(self, store: ObjectStore, obj: ObjectId) -> None:
        self.store = store
        self.obj = obj

    def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.obj.size - offset))
        if size == 0:
            return b""
        return self.store.read(self.obj.key, offset, size, etag=self.obj.etag)

    def read_into(self, offset: int, view: memoryview) -> int:
        data = self.read(offset, len(view))  # the same one request as `read`
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        return None


class DirectReader:
    """Every read is one ranged request: no cache, no prefetch (tests, baselines)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def open(self, obj: ObjectId) -> ReadHandle:
        return DirectHandle(self.store, obj)

    def close(self) -> None:
        return None


class BlockHandle:
    """One open file in block mode, with its own prefetch windows (one per
    sequential stream read through it)."""

    def __init__(
        self,
        fetcher: BlockFetcher,
        obj: ObjectId,
        block_size: int,
        max_window: int,
        dense: DenseFill | None = None,
        part_align: int = 0,
    ) -> None:
        self.fetcher = fetcher
        self._part_align = part_align
        self.obj = obj
        # Without a prefetch window (max_window 0) every read looks random: no fill.
        self._dense = dense if max_window > 0 else None
        self.block_size = block_size
        # Prefetches go out in batches of one request's worth of blocks; each
        # sequential stream on the handle (a parallel loader's threads) has its own window.
        self._policy = StreamTable(
            block_count(obj.size, block_size),
            max_window,
            batch=fetcher.run_blocks,
            slack=reorder_slack(block_size),
            census=fetcher.census,
        )
        self._lock = threading.Lock()  # guards the policy and `_ahead`
        # The latest prefetches of this handle, cancelled at close.
        self._ahead: deque[int] = deque(maxlen=max(1, 2 * max_window * MAX_STREAMS))
        self._closed = False

    def read(self, offset: int, size: int) -> bytes:
        planned = self._parts(offset, size)
        assert not isinstance(planned, int)  # only a read into a buffer is served in place
        parts = list(planned)
        if len(parts) == 1:
            data, lo, hi = parts[0]
            if isinstance(data, memoryview):  # a fetched block's buffer: bytes for the caller
                return bytes(data[lo:hi])
            return data if lo == 0 and hi == len(data) else data[lo:hi]
        return b"".join(memoryview(data)[lo:hi] for data, lo, hi in parts)

    def read_into(self, offset: int, view: memoryview) -> int:
        """Like read, into `view` (the FUSE request's own buffer): each block's
        bytes are copied straight in, with no bytes object of the read's size."""
        planned = self._parts(offset, len(view), view)
        if isinstance(planned, int):  # a part read straight into `view`
            return planned
        pos = 0
        for data, lo, hi in planned:
            copy_into(view[pos : pos + hi - lo], memoryview(data)[lo:hi])
            pos += hi - lo
        return pos

    def _parts(
        self, offset: int, size: int, into: memoryview | None = None
    ) -> Iterator[tuple[BlockData, int, int]] | int:
        """(bytes, start, end) of each block (or part of one) the read covers,
        in order; every fetch and prefetch is scheduled before the first is
        awaited. Or, for a read into `into` that is one part read of one
        block, the bytes put there by that read, on this thread."""
        if offset < 0 or size < 0:
            raise OSError(errno.EINVAL, f"invalid read: offset={offset} size={size}")
        if self._closed:
            raise OSError(errno.EBADF, f"{self.obj.key}: read after close")
        blocks = blocks_for(offset, size, self.obj.size, self.block_size)
        if not blocks:
            return iter(())
        end = offset + min(size, self.obj.size - offset)
        with self._lock:
            ahead = self._policy.on_read(blocks[0], blocks[-1], (offset, end))
            random = self._policy.window == 0
        if random and self._dense is not None:
            # (A random read prefetches nothing: `ahead` is empty, window 0.)
            planned = self._random(blocks, offset, end, into)
            if isinstance(planned, int):
                return planned
            futures = planned
        else:  # demand first: these fetches are queued before the prefetches below
            futures = [(self.fetcher.start(BlockKey(self.obj, i)), 0) for i in blocks]
        self._prefetch(ahead)
        return self._slices(blocks, futures, offset, end)

    def _random(
        self, blocks: Sequence[int], offset: int, end: int, into: memoryview | None
    ) -> list[tuple[Future[BlockData], int]] | int:
        """A random read: reported to the DenseFill, which grants part reads
        (read/parts.py) of the blocks it misses. (future, offset of its first
        byte in the block) per block; or, when the read is one granted part
        that starts where the read does and fits `into`, that part read into
        `into` on this thread: the bytes of the read."""
        assert self._dense is not None
        spans: dict[int, tuple[int, int]] = {}
        if self._part_align:
            for index in blocks:
                base = index * self.block_size
                length = min(self.block_size, self.obj.size - base)
                lo, hi = part_span(
                    max(offset, base) - base, min(end, base + length) - base, length,
                    self._part_align,
                )  # fmt: skip
                if hi - lo < length and not self.fetcher.has(BlockKey(self.obj, index)):
                    spans[index] = (lo, hi)
        want = {i: hi - lo for i, (lo, hi) in spans.items()}
        granted = self._dense.on_random_read(self.obj, blocks[0], blocks[-1], want)
        if into is not None and len(blocks) == 1 and blocks[0] in granted:
            lo, hi = spans[blocks[0]]
            base = blocks[0] * self.block_size
            if base + lo == offset and hi - lo <= len(into):
                read_part_into(self.fetcher, BlockKey(self.obj, blocks[0]), lo, hi, into)
                return end - offset
        futures = []
        for index in blocks:
            key = BlockKey(self.obj, index)
            if index in granted:
                lo, hi = spans[index]
                futures.append((fetch_part(self.fetcher, key, lo, hi), lo))
            else:
                futures.append((self.fetcher.start(key), 0))
        return futures

    def _slices(
        self,
        blocks: Sequence[int],
        futures: list[tuple[Future[BlockData], int]],
        offset: int,
        end: int,
    ) -> Iterator[tuple[BlockData, int, int]]:
        for index, (future, start) in zip(blocks, futures, strict=True):
            data = future.result()
            base = index * self.block_size + start  # the file offset of data[0]
            yield data, max(offset, base) - base, min(end, base + len(data)) - base

    def _prefetch(self, ahead: list[int]) -> None:
        if not ahead:
            return
        taken = self.fetcher.prefetch_many([BlockKey(self.obj, i) for i in ahead])
        with self._lock:
            self._ahead.extend(ahead[:taken])
            if taken < len(ahead):
                # No budget left: the policy offers these blocks again next read.
                self._policy.retract(ahead[taken])

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ahead = list(self._ahead)
            self._policy.close()
        self.fetcher.cancel([BlockKey(self.obj, i) for i in ahead])


class BlockReader:
    """Block mode: reads through the BlockFetcher with adaptive prefetch.

    `max_window` is DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT; `dense`, the
    mount's DenseFill (None: random readers stay on demand, in whole
    blocks); `part_align`, the rounding of a random miss's part read (0:
    whole blocks), used only in blocks larger than `part_min_block`. Closing the
    reader closes its fetcher (the scheduler, cache, store and DenseFill
    belong to the composition root)."""

    def __init__(
        self,
        fetcher: BlockFetcher,
        block_size: int,
        max_window: int,
        *,
        dense: DenseFill | None = None,
        part_align: int = PART_ALIGN,
        part_min_block: int = PART_MIN_BLOCK,
    ) -> None:
        if block_size != fetcher.block_size:
            raise ValueError(
                f"block size {block_size} differs from the fetcher's {fetcher.block_size}"
            )
        self.fetcher = fetcher
        self.block_size = block_size
        self.max_window = max_window
        self.dense = dense
        if part_align < 0:
            raise ValueError("part_align must be >= 0")
        # Blocks of at most part_min_block bytes are always fetched whole.
        self.part_align = part_align if block_size > part_min_block else 0

    def open(self, obj: ObjectId) -> ReadHandle:
        return BlockHandle(
            self.fetcher, obj, self.block_size, self.max_window, self.dense, self.part_align
        )

    def close(self) -> None:
        self.fetcher.close()
