"""Several sequential streams on one open handle: pure logic.

Model loaders (safetensors, mmap, parallel readers) read one open file at
many offsets at once, each thread sequential over its own part. One
PrefetchPolicy per handle would see that as random jumps and reset its
window at every read. `StreamTable` keeps up to `max_streams` policies,
each with its own window (as the kernel keeps readahead state per stream):

- A read goes to the stream that took the previous read if it continues
  it anywhere in its window (the policy's own test, reordering included),
  else to another stream it lands right next to (at most `slack` blocks
  behind where that stream stopped, or the block after).
- A read no stream takes goes to the one *candidate*, today's single
  policy ("wait and see": it resets at each jump); when two reads in a row
  open its window, it becomes a stream. A read that starts exactly where a
  recent untaken read ended (or ends where one started) also starts a
  stream: that is how the second, third... thread of a loader is found
  while the others' reads come in between.
- The table is bounded (the least recently used stream leaves), and a
  stream is dropped once `idle_reads` untaken reads came after its last
  one: a stream that ended, or a false one made by random reads that
  landed side by side, does not linger to catch later random reads.

- The streams of every handle of a mount share its prefetch budget: with a
  `StreamCensus`, each stream's window is at most its fair share of
  `census.blocks` (the prefetch budget in blocks) among the census's
  streams. Without it, the first streams to widen their windows take the
  whole budget and the others fall back to one-block demand reads (the
  per-request cost, not the bytes, bounds those: docs/design/ro_mount.md,
  "Several streams share the prefetch budget").

So one stream behaves as one PrefetchPolicy, and a random reader
prefetches about as little as with one.
`on_read`, `window` and `retract` mean what they mean on PrefetchPolicy;
`window` is that of the stream the last read went to. No threads, no I/O,
no locks: the caller (one handle) serialises calls; the census, shared by
the mount's handles, has its own lock.
"""

from __future__ import annotations

import threading
from collections import deque

from datamount.read.prefetch.policy import REORDER_SLACK, PrefetchPolicy

# Streams per handle: one per thread of a parallel loader reading its own
# part of one file (8 threads is what the model-loading benchmark uses).
MAX_STREAMS = 8


class StreamCensus:
    """The sequential streams of every handle of one mount, and the prefetch
    budget they share, in blocks. Thread-safe."""

    def __init__(self, blocks: int) -> None:
        if blocks < 1:
            raise ValueError("blocks must be >= 1")
        self.blocks = blocks
        self._lock = threading.Lock()
        self.streams = 0

    def add(self, delta: int) -> None:
        if delta:
            with self._lock:
                self.streams += delta

    def share(self) -> int:
        """Blocks one stream may keep ahead: an equal part of the budget."""
        return max(1, self.blocks // max(1, self.streams))


class StreamTable:
    def __init__(
        self,
        block_count: int,
        max_window: int,
        batch: int = 1,
        *,
        slack: int = REORDER_SLACK,
        max_streams: int = MAX_STREAMS,
        idle_reads: int | None = None,
        census: StreamCensus | None = None,
    ) -> None:
        if max_streams < 1:
            raise ValueError("max_streams must be >= 1")
        self.block_count = block_count
        self.max_window = max_window
        self.batch = batch
        self.slack = slack
        self.max_streams = max_streams
        # A file of one block has nothing to prefetch: its reader takes no share.
        self.census = census if block_count > 1 else None
        # Reads no stream took, counted since a stream's last read: a stream
        # outlives this many (only random reads, or new streams, make them).
        self.idle_reads = 2 * max_streams if idle_reads is None else idle_reads
        self._candidate = self._new()
        # Streams with the `_misses` count at the read each last took, most recent first.
        self._streams: list[tuple[PrefetchPolicy, int]] = []
        self._previous: PrefetchPolicy | None = None  # the stream that took the last read
        # Byte spans of the latest reads no stream took: a read that starts
        # where one ended (or ends where one started: two requests of one
        # stream served out of order) continues it.
        self._spans: deque[tuple[int, int, int]] = deque(maxlen=max_streams)
        self._misses = 0  # reads no stream took
        self._window = 0

    def _new(self) -> PrefetchPolicy:
        return PrefetchPolicy(self.block_count, self.max_window, self.batch, slack=self.slack)

    @property
    def window(self) -> int:
        """The window of the stream the last read went to (0: a random read)."""
        return self._window

    @property
    def streams(self) -> int:
        """Streams tracked now (the candidate not counted)."""
        return len(self._streams)

    def on_read(self, first: int, last: int, span: tuple[int, int] | None = None) -> list[int]:
        """A demand read of blocks [first, last] (bytes `span`, [start, end),
        when known): the blocks to prefetch now, nearest first."""
        counted = len(self._streams)
        stream = self._taker(first)
        if stream is None:
            self._misses += 1
            stream = self._candidate
            if self._candidate.takes(first) or span is None:
                pass  # today's single stream: the candidate's own test
            elif (earlier := self._continued(span)) is not None:
                stream = self._new()  # a stream found by its bytes: seeded with its last read
                stream.on_read(earlier, earlier)
            elif span is not None:
                self._spans.append((span[0], span[1], first))
        if self.census is not None:
            stream.max_window = min(self.max_window, self.census.share())
        ahead = stream.on_read(first, last)
        self._window = stream.window
        if stream is self._candidate and self._window:  # two reads in a row
            self._candidate = self._new()
        if stream is not self._candidate:
            self._streams.insert(0, (stream, self._misses))
            del self._streams[self.max_streams :]
            self._previous = stream
        else:
            self._previous = None
        while self._streams and self._misses - self._streams[-1][1] > self.idle_reads:
            self._streams.pop()  # idle: ended, or a false stream of random reads
        if self.census is not None:
            self.census.add(len(self._streams) - counted)
        return ahead

    def close(self) -> None:
        """The handle is closed: its streams leave the census."""
        if self.census is not None:
            self.census.add(-len(self._streams))
        self._streams.clear()

    def _taker(self, first: int) -> PrefetchPolicy | None:
        """The stream that takes a read from block `first`, out of the table.
        Only the stream that took the previous read takes one anywhere in its
        window; the others, only one near where they stopped, so a random
        reader does not feed streams it once made by chance."""
        for i, (stream, _) in enumerate(self._streams):
            if stream.takes(first, near=stream is not self._previous):
                del self._streams[i]
                return stream
        return None

    def _continued(self, span: tuple[int, int]) -> int | None:
        """The first block of a recent unclaimed read that `span` continues
        (that read is claimed), or None."""
        for i, (start, end, block) in enumerate(self._spans):
            if span[0] == end or span[1] == start:
                del self._spans[i]
                return block
        return None

    def retract(self, block: int) -> None:
        """`block` and the blocks returned after it (by the stream that
        returned it) were not fetched: that stream offers them again."""
        for stream, _ in self._streams:
            if stream.issued(block):
                stream.retract(block)
                return
