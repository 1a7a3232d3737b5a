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

log = logging.getLogger("datamount.readstack")


class MountReader:
    """The Reader a mount uses, owning everything under it."""

    def __init__(self, reader: Reader, closers: list[Callable[[], None]]) -> None:
        self.reader = reader
        self._closers = closers

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
    settings: Settings, store: ObjectStore, stats: MountStats, *, cache_key: str
) -> MountReader:
    """`cache_key` names the data (store + path): a remount of the same data
    finds its disk blocks again; another mount never shares the folder."""
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
            max_queue_bytes=settings.block_file_cache_max_queue_size,
            stats=stats,
        )
    cache = TieredCache(ram, disk, stats)
    scheduler = Scheduler(settings.read_threads)
    # One in-flight bound for the whole mount, shared by every open file: a full
    # prefetch window of blocks (32 × 2 MiB = 64 MiB by default).
    budget = max(1, settings.read_buffer_block_count) * settings.read_block_size
    fetcher = BlockFetcher(
        store, cache, settings.read_block_size, scheduler, stats, memory_budget=budget
    )
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
        "RAM tier %d B, disk tier %s, in-flight budget %d B",
        mode,
        settings.read_block_size,
        settings.read_buffer_block_count,
        settings.read_threads,
        settings.memory_cache_size,
        "on" if settings.block_file_cache_enabled else "off",
        budget,
    )
    return MountReader(reader, [scheduler.close, cache.close])
