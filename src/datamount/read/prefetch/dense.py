"""When random reads of one file become dense: pure logic.

`DensePolicy.on_read(first, last)` sees the blocks of each random read of
one object version (reads the handle's PrefetchPolicy does not count as a
sequential stream) and answers the blocks to fill in the background now:
blocks never touched nor handed out before, ascending. Sequential readers
never get here, and files that do not fit the cache (`fits=False`) are never
filled.

The rule is an incremental ski-rental one, with one invariant: the blocks
touched or filled never exceed 2 × the distinct blocks touched (FACTOR), so
whenever the reader stops it has cost at most 2 × the distinct blocks it
touched (the sparse-reader bound), exactly, not only at a decision point:

- until the distinct blocks touched reach START_SHARE of the file's blocks
  the file stays on demand: a sparse reader (200 random 64 KiB preads over
  1 GiB of 2 MiB blocks touch ~172 of 512 blocks, 34 %) never pays for a
  block it did not read;
- from there on, every answer fills as many blocks as the invariant allows,
  in multiples of `run` blocks (one ranged GET each; the tail of the file
  may be shorter). The allowance starts at START_SHARE of the file at once
  and then grows by one block per demand miss and by two per first read of
  a filled block, so a dense reader's hits pay for the fill: the fill runs
  ahead of the reader at the storage's speed instead of waiting for half
  the file to be paid on demand.

Measured on the 2,000 seeded 64 KiB preads over 1 GiB (benchmarks/mount.py
workload 3; a simulation of the same reads): the fill at half the blocks
(the earlier rule) left 256 demand misses, serial in one reader thread;
this rule leaves ~205, and the fill starts ~100 reads earlier.

No threads, no I/O, no locks: the caller serialises calls.
"""

from __future__ import annotations

import math

# Stay on demand until the distinct blocks touched are this share of the file's
# blocks (a sparse reader touching a third of the blocks is never filled).
START_SHARE = 0.375
# ...and at least this many: a file of a few blocks is cheap on demand.
MIN_TOUCHED = 4
# Blocks touched or filled <= FACTOR x blocks touched, at every moment.
FACTOR = 2

# Per-block state: touched by a read, handed out to the fill, or both.
_TOUCHED, _FILLED = 1, 2


class DensePolicy:
    def __init__(
        self,
        block_count: int,
        *,
        fits: bool,
        start_share: float = START_SHARE,
        min_touched: int = MIN_TOUCHED,
        run: int = 1,
    ) -> None:
        if block_count < 0 or not 0.0 < start_share <= 1.0 or min_touched < 1 or run < 1:
            raise ValueError(
                "need block_count >= 0, 0 < start_share <= 1, min_touched >= 1, run >= 1"
            )
        self.block_count = block_count
        self.fits = fits
        self.run = run
        self.threshold = max(min_touched, math.ceil(block_count * start_share))
        # One byte per block, only for a file that may be filled (it fits the
        # cache: 1 GiB of 2 MiB blocks is 512 bytes).
        self._state = bytearray(block_count if fits else 0)
        self._touched = 0  # blocks with _TOUCHED
        self._covered = 0  # blocks touched or filled
        self._cursor = 0  # no block below it is left to hand out
        self.filled_count = 0  # blocks handed out to the fill
        self.done = not fits or self.threshold > block_count

    @property
    def touched(self) -> int:
        """Distinct blocks random reads touched so far."""
        return self._touched

    @property
    def started(self) -> bool:
        """Some blocks were handed out to the fill."""
        return self.filled_count > 0

    def stop(self) -> None:
        """No more fill for this file (a fill fetch failed)."""
        self.done = True
        self._state = bytearray()

    def on_read(self, first: int, last: int) -> list[int]:
        """A random read of blocks [first, last]: the blocks to fill now
        (ascending; each block at most once per policy)."""
        if self.done:
            return []
        state = self._state
        for index in range(max(0, first), min(last, self.block_count - 1) + 1):
            was = state[index]
            if not was & _TOUCHED:
                state[index] = was | _TOUCHED
                self._touched += 1
                self._covered += not was
        if self._touched < self.threshold:
            return []
        room = FACTOR * self._touched - self._covered
        left = self.block_count - self._covered
        if room < min(self.run, left):
            return []
        take = left if left <= room else room - room % self.run
        rest: list[int] = []
        index = self._cursor
        while len(rest) < take:
            if not state[index]:
                state[index] = _FILLED
                rest.append(index)
            index += 1
        self._cursor = index
        self._covered += take
        self.filled_count += take
        if self._covered == self.block_count:
            self.done = True
            self._state = bytearray()  # no longer needed
        return rest
