"""Part of the composition root: wires the read path under a mount from
Settings — store → BlockFetcher (single flight, two-lane Scheduler) →
TieredCache (RAM LRU ▸ disk blocks) → BlockReader with adaptive prefetch, or
the WholeFileReader over it when DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED is
false. Called only by `app`; owns the threads it starts (scheduler workers,
disk-cache writers) and stops them in `close()`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from datamount.budget import DEMAND, DISK_QUEUE, PREFETCH, UPLOAD, MemoryBudget
from datamount.read.blocks import ObjectId
from datamount.read.cache.base import BlockCache, NoCache
from datamount.read.cache.disk import DiskCache
from datamount.read.cache.memory import MemoryCache
from datamount.read.cache.tiered import TieredCache
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.reader import BlockReader, Reader, ReadHandle
from datamount.read.stats import MountStats
from datamount.read.wholefile import WholeFileReader
from datamount.settings import Settings
from datamount.storage.base import ObjectStore
from datamount.transfer.download import DownloadOptions
from datamount.transfer.upload import BLOCK_SIZE as UPLOAD_BLOCK_SIZE

log = logging.getLogger("datamount.readstack")


class MountReader:
    """The Reader a mount uses, owning everything under it. `budget` is the
    mount's one MemoryBudget: an rw_mount hands it to its WriteBack."""

    def __init__(
        self, reader: Reader, closers: list[Callable[[], None]], budget: MemoryBudget
    ) -> None:
        self.reader = reader
        self._closers = closers
        self.budget = budget

    def open(self, obj: ObjectId) -> ReadHandle:
        return self.reader.open(obj)

    def close(self) -> None:
        self.reader.close()
        for close in self._closers:
            try:
                close()
            except Exception:  # closing must reach every part
                log.exception("closing the read path")


def build_reader(
    settings: Settings,
    store: ObjectStore,
    stats: MountStats,
    *,
    cache_key: str,
    uploads: bool = False,
) -> MountReader:
    """`cache_key` names the data (store + path): a remount of the same data
    finds its disk blocks again; another mount never shares the folder.
    `uploads`: the budget also holds an rw_mount's upload buffers."""
    budget = memory_budget(settings, uploads=uploads)
    folder = hashlib.sha256(cache_key.encode()).hexdigest()[:24]
    ram: BlockCache = (
        MemoryCache(settings.memory_cache_size, stats)
        if settings.memory_cache_size > 0
        else NoCache()
    )
    disk: BlockCache = NoCache()
    if settings.block_file_cache_enabled:
        disk = DiskCache(
            settings.cache_dir / "blocks" / folder,
            limit=settings.cache_limit,
            prune_threshold=settings.prune_threshold,
            prune_target=settings.prune_target,
            write_threads=settings.block_file_cache_write_threads,
            budget=budget,
            stats=stats,
        )
    cache = TieredCache(ram, disk, stats)
    scheduler = Scheduler(settings.read_threads)
    fetcher = BlockFetcher(store, cache, settings.read_block_size, scheduler, stats, budget=budget)
    reader: Reader = BlockReader(
        fetcher, settings.read_block_size, settings.read_buffer_block_count
    )
    mode = "block"
    if not settings.block_based_cache_enabled:
        options = DownloadOptions(
            threads=settings.downloader_threads,
            reserved_free_disk_space=settings.reserved_free_disk_space,
            fsync=False,  # a cache: entries are size-checked at start instead
        )
        reader = WholeFileReader(
            store,
            settings.cache_dir / "files" / folder,
            options,
            settings.cache_limit,
            fallback=reader,
            prune_threshold=settings.prune_threshold,
            prune_target=settings.prune_target,
        )
        mode = "whole-file"
    log.info(
        "read path: %s mode, block %d B, prefetch window %d blocks, %d read threads, "
        "RAM tier %d B, disk tier %s, memory budget %s",
        mode,
        settings.read_block_size,
        settings.read_buffer_block_count,
        settings.read_threads,
        settings.memory_cache_size,
        "on" if settings.block_file_cache_enabled else "off",
        budget.describe(),
    )
    return MountReader(reader, [scheduler.close, cache.close], budget)


def memory_budget(settings: Settings, *, uploads: bool) -> MemoryBudget:
    """The mount's one MemoryBudget: each area the bound its consumer had on
    its own, so the total is their sum (64 + 512 + 128 = 704 MiB by default
    with 8 upload threads). The RAM tier is not in it."""
    return MemoryBudget(
        {
            # A full prefetch window of blocks (32 x 2 MiB = 64 MiB by default).
            PREFETCH: max(1, settings.read_buffer_block_count) * settings.read_block_size,
            DEMAND: 0,
            DISK_QUEUE: settings.block_file_cache_max_queue_size
            if settings.block_file_cache_enabled
            else 0,
            # WriteBack's upload_budget: 2 x upload threads x 8 MiB blocks.
            UPLOAD: 2 * settings.downloader_threads * UPLOAD_BLOCK_SIZE if uploads else 0,
        }
    )
