"""Per-mount counters (thread-safe), logged at unmount and written to a stats
file every few seconds."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class MountStats:
    ram_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    blocks_fetched: int = 0
    bytes_fetched: int = 0
    fetch_requests: int = 0  # ranged GETs: one per block, or per run of prefetched blocks
    prefetched_blocks: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    ram_evictions: int = 0
    disk_evictions: int = 0
    disk_queue_dropped: int = 0
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name[0] != "_"}
