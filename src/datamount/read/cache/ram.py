"""The RAM tier: an LRU of blocks bounded in bytes (DATASET_MOUNT_MEMORY_CACHE_SIZE).

The bound is the sum of `len(data)` of the blocks held; the per-entry overhead
(~200 bytes of dict node and key per block, 0.01% of a 2 MiB block) is not
counted. A capacity of 0 disables the tier (it stores nothing); a block larger
than the capacity is not stored, rather than emptying the whole tier for it.
Values are immutable `bytes`, handed out without copying.

Counting: this tier counts only what it alone sees, `ram_evictions`. Hits and
misses are counted by the cache that asks the question (tiered.py), so a RAM
miss followed by a disk hit is never also counted as a miss.

Thread-safe: one lock around an OrderedDict; no I/O and no threads of its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from datamount.read.blocks import BlockData, BlockKey
from datamount.read.stats import MountStats


class MemoryCache:
    def __init__(self, capacity_bytes: int, stats: MountStats | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must not be negative, not {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._stats = stats
        self._lock = threading.Lock()
        self._blocks: OrderedDict[BlockKey, BlockData] = OrderedDict()  # least recent first
        self._used = 0
        self._closed = False

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def get(self, key: BlockKey) -> BlockData | None:
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            return data

    def put(self, key: BlockKey, data: BlockData) -> None:
        size = len(data)
        if size > self.capacity_bytes:  # also covers capacity 0: the tier is off
            return
        evicted = 0
        with self._lock:
            if self._closed:
                return
            old = self._blocks.pop(key, None)
            if old is not None:
                self._used -= len(old)
            while self._blocks and self._used + size > self.capacity_bytes:
                _, victim = self._blocks.popitem(last=False)
                self._used -= len(victim)
                evicted += 1
            self._blocks[key] = data
            self._used += size
        if evicted and self._stats is not None:
            self._stats.add(ram_evictions=evicted)

    def contains(self, key: BlockKey) -> bool:
        with self._lock:
            return key in self._blocks  # a probe: does not refresh the LRU position

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._blocks.clear()
            self._used = 0
