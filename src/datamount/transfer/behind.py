"""Write-behind for small files: the buffers that carry a whole small file
from the thread that fetched it to the thread that writes it.

A download's fetch threads are its GETs in flight. When a fetch thread also
writes its file (an O_DIRECT pwrite, then the group commit's syncfs and
renames), each of those waits on the local disk takes one GET off the wire
(docs/design/download.md, "Write-behind"). So the Downloader
(transfer.downloader) fetches a small file into a `Slabs` buffer and hands it
to a writer thread; the fetch thread starts its next GET at once.

Memory: `count` buffers of `size` bytes, carved out of one anonymous mmap
made on first use (page aligned, as O_DIRECT needs; its pages are touched
only as far as the files written into them reach). A fetch thread waits for
a free buffer when every one is fetched or waiting for the disk: a disk
slower than the network then paces the download, within this bound.

Threads: `take` and `give` from any thread (a C queue: one call each, no
Python condition variable; transfer.tasks says why).
"""

from __future__ import annotations

import mmap
import threading
from queue import SimpleQueue


class Slabs:
    """`count` page-aligned buffers of `size` bytes each."""

    def __init__(self, count: int, size: int) -> None:
        if count < 1 or size < 1:
            raise ValueError(f"Slabs({count}, {size}): needs at least one non-empty buffer")
        self.count = count
        self.size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self._free: SimpleQueue[memoryview] = SimpleQueue()
        self._made = False
        self._make_lock = threading.Lock()

    def take(self) -> memoryview:
        """A free buffer of `size` bytes (waits until one is given back)."""
        if not self._made:
            with self._make_lock:
                if not self._made:
                    region = memoryview(mmap.mmap(-1, self.size * self.count))
                    for i in range(self.count):
                        self._free.put(region[i * self.size : (i + 1) * self.size])
                    self._made = True
        return self._free.get()

    def give(self, buffer: memoryview) -> None:
        """Return a buffer from `take`."""
        self._free.put(buffer)

    @property
    def available(self) -> int:
        """Buffers free now (all of them before the first `take`)."""
        return self._free.qsize() if self._made else self.count
