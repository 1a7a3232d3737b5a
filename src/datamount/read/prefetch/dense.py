"""When random reads of one file become dense: pure logic.

`DensePolicy.on_read_parts(first, last, want)` sees the blocks of each
random read of one object version and the bytes a part read of each missed
block would fetch (read/parts.py), and answers the misses that may be read
in part and the blocks to fill now: blocks not handed out before and not
fetched whole, ascending (`on_read`: the same for reads of whole blocks).
Files that do not fit the cache (`fits=False`) are never filled.

Invariant, in bytes, at every moment: the bytes spent on the file's random
misses and fill never exceed FACTOR x the distinct blocks touched x the
block size, so whenever the reader stops it has cost at most that. A
block's first part read prepays its whole block, so it is filled for
nothing more. The rule (an incremental ski rental):

- on demand until the distinct blocks touched reach START_SHARE of the file;
- then every answer fills as many blocks as the invariant allows, in
  multiples of `run` blocks (one ranged GET each), so a dense reader's hits
  pay for the fill, which runs ahead of the reader;
- a file read in parts is filled only once its part misses reach its size /
  PART_FILL_BYTES; a miss of a block handed out but not there reads in part.

Why these rules: docs/design/ro_mount.md ("Dense fill").

No threads, no I/O, no locks: the caller serialises calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# Stay on demand until the distinct blocks touched are this share of the file's
# blocks (a sparse reader touching a third of the blocks is never filled).
START_SHARE = 0.375
# ...and at least this many: a file of a few blocks is cheap on demand.
MIN_TOUCHED = 4
# Bytes spent <= FACTOR x blocks touched x block size, at every moment.
FACTOR = 2
# A file read in parts is filled only once its part misses reach its size
# over this many bytes: the reader time of one part miss buys about this much
# fill (ski rental in reader time). Why 512 KiB: docs/design/ro_mount.md
# ("Dense fill").
PART_FILL_BYTES = 512 * 1024

# Per-block state bits: touched by a read; handed out to the fill; fetched
# whole by a read (or cached when read); fetched only in part by a read.
_TOUCHED, _FILLED, _WHOLE, _PART = 1, 2, 4, 8
_COVERED = _FILLED | _WHOLE  # the block is (or will be) in the cache


class DensePolicy:
    def __init__(
        self,
        block_count: int,
        *,
        fits: bool,
        start_share: float = START_SHARE,
        min_touched: int = MIN_TOUCHED,
        run: int = 1,
        block_size: int = 1,
    ) -> None:
        if (
            block_count < 0
            or not 0.0 < start_share <= 1.0
            or min_touched < 1
            or run < 1
            or block_size < 1
        ):
            raise ValueError(
                "need block_count >= 0, 0 < start_share <= 1, min_touched >= 1, run >= 1,"
                " block_size >= 1"
            )
        self.block_count = block_count
        self.fits = fits
        self.run = run
        self.block_size = block_size
        self.threshold = max(min_touched, math.ceil(block_count * start_share))
        # Reads missing in part before a fill (PART_FILL_BYTES), for a file read in parts.
        self.part_threshold = math.ceil(block_count * block_size / PART_FILL_BYTES)
        self._part_misses = 0
        # One byte per block (1 GiB of 2 MiB blocks is 512 bytes): kept while
        # a fill or a part read may still need it.
        self._state = bytearray(block_count)
        self._touched = 0  # blocks with _TOUCHED
        self._covered = 0  # blocks with _FILLED or _WHOLE
        self._fresh = block_count  # blocks in no state at all
        # Bytes spent on this file's random reads and fill, the prepaid whole
        # block of each part-read block included; <= FACTOR x touched x block size.
        self._spent = 0
        self._cursor = 0  # no block below it is left to hand out
        self.filled_count = 0  # blocks handed out to the fill
        self.done = not fits or self.threshold > block_count

    @property
    def touched(self) -> int:
        """Distinct blocks random reads touched so far."""
        return self._touched

    @property
    def spent(self) -> int:
        """Bytes the random reads and the fill of this file cost so far, at
        most (a part-read block counts its bytes plus the whole block)."""
        return self._spent

    @property
    def started(self) -> bool:
        """Some blocks were handed out to the fill."""
        return self.filled_count > 0

    def stop(self) -> None:
        """No more fill for this file (a fill fetch failed): and whole blocks
        again for its random misses."""
        self.done = True
        self._state = bytearray()

    def on_read(self, first: int, last: int) -> list[int]:
        """A random read of blocks [first, last], each fetched whole (or
        already cached): the blocks to fill now (ascending; each block at
        most once per policy)."""
        return self.on_read_parts(first, last, {})[1]

    def on_read_parts(
        self, first: int, last: int, want: Mapping[int, int]
    ) -> tuple[set[int], list[int]]:
        """A random read of blocks [first, last]; `want` maps the blocks it
        misses (in no cache, not in flight) to the bytes a part read of each
        would fetch. Answers the blocks of `want` that may be read in part
        (the others are fetched whole) and the blocks to fill now.

        A block's first part read prepays its whole block (its later fill,
        or the whole fetch of a read of it once the allowance is spent), so
        the invariant holds in bytes whatever the reads: FACTOR x touched x
        block size >= the bytes spent."""
        state = self._state
        granted: set[int] = set()
        if state:
            bs = self.block_size
            for index in range(max(0, first), min(last, self.block_count - 1) + 1):
                was = state[index]
                part = want.get(index)
                if part is not None and not was & _WHOLE:
                    if not was & _TOUCHED:
                        # +FACTOR blocks of allowance for the part and the prepaid
                        # block (a filled one is paid already).
                        self._spent += part + (0 if was & _FILLED else bs)
                        granted.add(index)
                    elif FACTOR * self._touched * bs - self._spent >= part:
                        self._spent += part  # a part again, within the allowance
                        granted.add(index)
                if not was & _TOUCHED:
                    self._touched += 1
                if index in granted:
                    state[index] = was | _TOUCHED | _PART
                    self._fresh -= not was
                    continue
                if not was & _COVERED:  # whole now: the fill has nothing to add
                    self._spent += 0 if was & _PART else bs
                    self._covered += 1
                    self._fresh -= not was
                state[index] = was | _TOUCHED | _WHOLE
        self._part_misses += bool(granted)  # reads that missed in part
        return granted, self._fill()

    def _fill(self) -> list[int]:
        if self.done or self._touched < self.threshold:
            return []
        if 0 < self._part_misses < self.part_threshold:
            return []  # part misses are still cheaper than the fill
        state = self._state
        bs = self.block_size
        # Blocks to pay for (fresh ones) and the free ones (part-read, prepaid).
        affordable = (FACTOR * self._touched * bs - self._spent) // bs
        paid_left = self._fresh
        if paid_left <= affordable:
            take = paid_left
        else:
            take = affordable - affordable % self.run
            if take == 0:
                return []
        rest: list[int] = []
        index = self._cursor
        paid = 0
        # Until `take` paid blocks, then (all paid blocks out) to the end.
        while index < self.block_count and (paid < take or take == paid_left):
            was = state[index]
            if not was & _COVERED:
                state[index] = was | _FILLED
                rest.append(index)
                if not was:
                    paid += 1
            index += 1
        self._cursor = index
        self._covered += len(rest)
        self._fresh -= paid
        self._spent += paid * bs
        self.filled_count += len(rest)
        # Every block handed out: kept for the misses of blocks still on the way.
        self.done = self._covered == self.block_count
        return rest
