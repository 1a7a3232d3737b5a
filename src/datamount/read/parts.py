"""Part reads: a random read that misses fetches only the bytes it needs.

A random read (one its handle's PrefetchPolicy does not count as a
sequential stream) of a block in no cache tier and not in flight would cost
a whole-block GET: 2 MiB for a 64 KiB pread. When the file's DensePolicy
grants it (read/prefetch/dense.py:
the bytes stay within its sparse bound), the read fetches only its own
range, rounded out to PART_ALIGN (a page) within the block: one ranged GET pinned to
the etag like every block fetch, on the scheduler's demand lane, answered
from those bytes and not cached (a partial block is no block: the cache
tiers, the single flight and the fill deal in whole blocks only; the
kernel's page cache keeps the pages read). A read of the block once the
fill has it comes from the cache as before. Counters (MountStats): misses,
fetch_requests, bytes_fetched, fetch_us, part_reads.

A read of one block whose part is granted reads it on the reader's own
thread (`read_part_into`), straight into the reader's buffer when the part
is the read's range (the kernel's page-aligned reads: the common case):
no hand-off to a worker and back (a queue, a wake, a GIL hand-off each
way), no buffer of its own, no copy (docs/design/ro_mount.md, "Part
reads"). A read over two blocks still fetches its parts in parallel on the workers
(`fetch_part`).

Threads: both are called from a reader's thread; `read_part_into` runs its
GET there, `fetch_part`'s GET runs on the fetcher's scheduler workers.
"""

from __future__ import annotations

import errno
import time
from concurrent.futures import Future
from functools import partial

from datamount.budget import DEMAND
from datamount.errors import StorageError
from datamount.read.blocks import BlockData, BlockKey
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.scheduler import SchedulerClosed

# A part read covers its range rounded out to this many bytes (within the
# block): a page. Why 4 KiB: docs/design/ro_mount.md ("Part reads").
PART_ALIGN = 4096
# ...and only in blocks larger than this: a GET of a small block costs about
# what a part of it does (the per-request cost dominates), and the block is
# then cached. Why: docs/design/ro_mount.md ("Run size").
PART_MIN_BLOCK = 256 * 1024


def part_span(lo: int, hi: int, block_len: int, align: int) -> tuple[int, int]:
    """[lo, hi) of a block of `block_len` bytes, rounded out to `align`."""
    return lo - lo % align, min(block_len, -(-hi // align) * align)


def fetch_part(fetcher: BlockFetcher, key: BlockKey, lo: int, hi: int) -> Future[BlockData]:
    """A Future of bytes [lo, hi) of block `key` (offsets within the block),
    fetched in one ranged GET on the demand lane; nothing is cached."""
    future: Future[BlockData] = Future()
    size = hi - lo
    fetcher.stats.add(misses=1)
    fetcher.budget.reserve(DEMAND, size)  # its bytes, until delivered
    job = partial(_fetch, fetcher, key, lo, size, future)
    try:
        fetcher.scheduler.submit(job, demand=True, on_drop=partial(_dropped, fetcher, size, future))
    except SchedulerClosed:
        _dropped(fetcher, size, future)
    return future


def read_part_into(fetcher: BlockFetcher, key: BlockKey, lo: int, hi: int, view: memoryview) -> int:
    """Bytes [lo, hi) of block `key` (offsets within the block) fetched in
    one ranged GET on this thread, into `view` (at least hi - lo bytes: the
    reader's buffer, held by the caller, so no budget is taken); the count."""
    if fetcher.closed:
        raise OSError(errno.EIO, "part read cancelled: the read scheduler is closed")
    fetcher.stats.add(misses=1)
    return _get(fetcher, key, lo, view[: hi - lo])


def _fetch(
    fetcher: BlockFetcher, key: BlockKey, lo: int, size: int, future: Future[BlockData]
) -> None:
    try:
        buf = bytearray(size)
        _get(fetcher, key, lo, memoryview(buf))
    except BaseException as exc:
        fetcher.budget.release(DEMAND, size)
        future.set_exception(exc)
        return
    fetcher.budget.release(DEMAND, size)
    future.set_result(bytes(buf))


def _get(fetcher: BlockFetcher, key: BlockKey, lo: int, view: memoryview) -> int:
    """The one GET of a part: all of `view`, from byte `lo` of the block."""
    size = len(view)
    started = time.monotonic()
    got = fetcher.store.read_into(
        key.obj.key, key.index * fetcher.block_size + lo, view, etag=key.obj.etag
    )
    took = time.monotonic() - started
    if got != size:
        raise StorageError(
            f"{key.obj.key}: short read of block {key.index} bytes {lo}-{lo + size} "
            f"({got} of {size} bytes)"
        )
    if fetcher.stats.on_read is not None:
        fetcher.stats.on_read(took)
    fetcher.stats.add(fetch_us=int(took * 1e6), fetch_requests=1, bytes_fetched=size, part_reads=1)
    return size


def _dropped(fetcher: BlockFetcher, size: int, future: Future[BlockData]) -> None:
    fetcher.budget.release(DEMAND, size)
    future.set_exception(OSError(errno.EIO, "part read cancelled: the read scheduler is closed"))
