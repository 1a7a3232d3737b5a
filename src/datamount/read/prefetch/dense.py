"""When random reads of one file become dense: pure logic.

`DensePolicy.on_read(first, last)` sees the blocks of each random read of
one object version (reads the handle's PrefetchPolicy does not count as a
sequential stream) and answers, once, the blocks to fill in the background:
every block not yet touched. Sequential readers never get here, and files
that do not fit the cache (`fits=False`) are never filled.

The rule is a ski-rental one: fill once the distinct blocks touched reach
FILL_SHARE of the file's blocks. Filling then fetches at most as many blocks
again as the reader has already paid for on demand, so a reader that stops
right after the decision costs at most 2 × the distinct blocks it touched
(the sparse-reader bound), and a dense reader (2,000 random 64 KiB preads
over 512 blocks of 2 MiB: half the blocks are touched after ~355 reads) gets
the rest of the file in parallel 8 MiB ranges instead of one 2 MiB request
per miss. A sparse reader (200 preads over the same file touches ~165
blocks, 32 %) stays on demand.

No threads, no I/O, no locks: the caller serialises calls.
"""

from __future__ import annotations

import math

# Fill once the distinct blocks touched are this share of the file's blocks:
# at 1/2 the fill costs at most what the demand reads already cost (above).
FILL_SHARE = 0.5
# ...and at least this many: a file of a few blocks is cheap on demand.
MIN_TOUCHED = 4


class DensePolicy:
    def __init__(
        self,
        block_count: int,
        *,
        fits: bool,
        share: float = FILL_SHARE,
        min_touched: int = MIN_TOUCHED,
    ) -> None:
        if block_count < 0 or not 0.0 < share <= 1.0 or min_touched < 1:
            raise ValueError("need block_count >= 0, 0 < share <= 1, min_touched >= 1")
        self.block_count = block_count
        self.fits = fits
        self.threshold = max(min_touched, math.ceil(block_count * share))
        # One byte per block, only for a file that may be filled (it fits the
        # cache: 1 GiB of 2 MiB blocks is 512 bytes).
        self._touched = bytearray(block_count if fits else 0)
        self._count = 0
        self.filled = False

    @property
    def touched(self) -> int:
        """Distinct blocks random reads touched so far."""
        return self._count

    def on_read(self, first: int, last: int) -> list[int]:
        """A random read of blocks [first, last]: the blocks to fill now
        (ascending), non-empty at most once per policy."""
        if self.filled or not self.fits:
            return []
        last = min(last, self.block_count - 1)
        for index in range(max(0, first), last + 1):
            if not self._touched[index]:
                self._touched[index] = 1
                self._count += 1
        if self._count < self.threshold or self.threshold > self.block_count:
            return []
        self.filled = True
        rest = [i for i in range(self.block_count) if not self._touched[i]]
        self._touched = bytearray()  # no longer needed
        return rest
