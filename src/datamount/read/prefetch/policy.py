"""The adaptive prefetch window of one open handle: pure logic.

`PrefetchPolicy.on_read(first, last)` sees the blocks of each demand read and
answers which blocks to prefetch now. Sequential access grows the window
(doubling from 1, per block the reader advances) up to `max_window`
(DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT); a random jump drops it to 0, so a
random reader pays only for the blocks it touches. The kernel's readahead is
served by several FUSE threads, so reads of one sequential stream arrive a
little out of order: a read that lands inside the recent window (up to
`max(slack, window)` blocks behind the furthest block read, up to the
furthest block already prefetched, and, once the stream is sequential, up to
`slack` blocks beyond that; `slack` is `reorder_slack(block_size)`,
REORDER_SLACK_BYTES in blocks, at most REORDER_SLACK) still belongs to the
stream; it
grows the window only if it moves the stream forward. A block is
returned at most once per stream (a stream ends at a random jump; the
fetcher ignores a prefetch of a block it holds or is fetching, so a new
stream over old ground costs no request); `retract` hands back blocks the
fetcher could not take (memory budget spent) so a later read offers them
again. Once the window is at least `batch` blocks, blocks are handed out
only `batch` at a time (or the rest of the file): the fetcher sends
consecutive blocks as one request, and a full window that advanced by one
block would otherwise yield one-block requests (the per-request cost, not
the bytes, bounds the throughput of small ranges).

No threads, no I/O, no locks: the caller (one handle) serialises calls.
"""

from __future__ import annotations

# Reads this many bytes behind the furthest block read (or past what was
# prefetched) still belong to the stream while its window is small: libfuse
# serves the kernel's readahead (4 MiB on our mounts) with up to 12
# background requests of <= 1 MiB, so the requests of two readahead windows,
# 8 MiB, arrive in any order: 4 blocks of the default 2 MiB, 1 of 8 MiB.
REORDER_SLACK_BYTES = 8 << 20
# ...but never more than this many blocks: with a wider tolerance the random
# reads of a small-block mount that land near each other merge into false
# streams and prefetch (tests/test_reader.py's random reads, 1 KiB blocks
# over a 512 KiB file: an 8 MiB slack prefetched far more than the 4 blocks
# it allows). This is also the slack of the default 2 MiB blocks.
REORDER_SLACK = 4


def reorder_slack(block_size: int) -> int:
    """REORDER_SLACK_BYTES in blocks of `block_size`, from 1 to REORDER_SLACK."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    return max(1, min(REORDER_SLACK, -(-REORDER_SLACK_BYTES // block_size)))


class PrefetchPolicy:
    def __init__(
        self, block_count: int, max_window: int, batch: int = 1, *, slack: int = REORDER_SLACK
    ) -> None:
        if block_count < 0 or max_window < 0 or batch < 1 or slack < 0:
            raise ValueError("block_count, max_window and slack must not be negative, batch >= 1")
        self.block_count = block_count
        self.max_window = max_window
        self.batch = batch
        self.slack = slack  # blocks: reorder_slack(block_size)
        self._window = 0
        self._hi = -1  # furthest block read in this stream; -1: nothing read yet
        self._issued = 0  # blocks below this were read or returned in this stream

    @property
    def window(self) -> int:
        """Blocks currently kept ahead of the furthest block read."""
        return self._window

    def on_read(self, first: int, last: int) -> list[int]:
        """A demand read of blocks [first, last]: the blocks to prefetch now,
        nearest first. Never a block beyond EOF, never one already returned in
        this stream, never one of the read itself."""
        last = min(last, self.block_count - 1)
        if first < 0 or first > last:
            return []
        if not self._in_stream(first):
            self._window = 0
            self._hi = last
            self._issued = last + 1
            return []
        if last > self._hi:  # the stream advanced: widen the window
            self._window = min(self.max_window, max(1, self._window * 2))
            self._hi = last
        else:  # `max_window` may have shrunk (a share of a budget other streams need)
            self._window = min(self._window, self.max_window)
        self._issued = max(self._issued, last + 1)
        end = min(self._hi + 1 + self._window, self.block_count)
        if self._issued >= end:
            return []
        if end < self.block_count and end - self._issued < min(self.batch, self._window):
            return []  # wait until a whole batch is due
        ahead = list(range(self._issued, end))
        self._issued = end
        return ahead

    def retract(self, block: int) -> None:
        """`block` and every block returned after it were not fetched: offer
        them again on the next sequential read."""
        self._issued = max(min(self._issued, block), self._hi + 1)

    def issued(self, block: int) -> bool:
        """`block` was returned by this stream as a prefetch not yet read."""
        return self._hi < block < self._issued

    def takes(self, first: int, *, near: bool = False) -> bool:
        """A read from block `first` continues this stream (the reordering
        slack included); `near`: only a read at most `slack` blocks behind the
        furthest block read or in the block after it, not anywhere in the
        window behind it or the blocks ahead."""
        if near:
            return self._hi - self.slack <= first <= self._hi + 1
        return self._in_stream(first)

    def _in_stream(self, first: int) -> bool:
        if self._hi < 0:
            # The first read of a handle: a read from the start of the file is
            # the start of a scan (cat, dd, decoders); anywhere else, wait and see.
            return first == 0
        back = max(self.slack, self._window)
        # A stream already judged sequential also tolerates reads that overtake
        # what it prefetched; a new (or random) stream must continue exactly.
        ahead = self.slack if self._window else 0
        return self._hi - back <= first <= max(self._hi + 1, self._issued) + ahead
