"""Per-mount counters (thread-safe), logged at unmount and written to a stats
file every few seconds; the metrics endpoint and the diagnosis
(mount.diagnose) read them.

`on_read`, when set (only while a metrics endpoint is on), is called with
the seconds of each ranged storage read: the latency histogram. Unset, the
read path observes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
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
    # Microseconds spent in ranged storage reads, summed over the read threads:
    # its rate is the number of read threads busy (the diagnosis compares it
    # with DATASET_MOUNT_READ_THREADS), over fetch_requests the mean latency.
    fetch_us: int = 0
    # Prefetch offers, and those the full prefetch window (its share of the
    # memory budget) turned away.
    prefetch_offers: int = 0
    prefetch_window_full: int = 0
    # File-ahead prefetch (read/ahead.py): whole files fetched before their
    # open, those then opened, those dropped unopened; files hinted by loaders.
    files_prefetched: int = 0
    files_prefetch_used: int = 0
    files_prefetch_wasted: int = 0
    hinted_files: int = 0
    # Dense fill (read/densefill.py): files whose random reads became dense and
    # were filled in the background, and the blocks fetched by those fills.
    dense_fills: int = 0
    filled_blocks: int = 0
    # Part reads (read/parts.py): random misses that fetched only the bytes
    # they needed (their requests and bytes are in fetch_requests and
    # bytes_fetched too, not in blocks_fetched).
    part_reads: int = 0
    on_read: Callable[[float], None] | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name in _COUNTERS}


_COUNTERS = tuple(f.name for f in fields(MountStats) if f.name[0] != "_" and f.name != "on_read")
