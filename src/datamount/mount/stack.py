"""A mount's stack, built from its plan alone: store (or, for eval_mount,
the evaluated MLTable's files as one store) → the read path → namespace →
filesystem ops, plus write-back staging under an rw_mount.

The read path, from Settings: BlockFetcher (single flight, two-lane
Scheduler) → TieredCache (RAM LRU ▸ disk blocks) → BlockReader with adaptive
prefetch, or the WholeFileReader over it when
DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED is false. In block mode, the
file-ahead prefetcher (read.ahead) watches the opens and takes loader hints,
and DenseFill (read.densefill) fills files whose random reads became dense.

Threads: owns the threads it starts (scheduler workers, disk-cache writers,
upload workers) and stops them in `Stack.close()`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from datamount.budget import (
    DEMAND,
    DISK_QUEUE,
    INTERPRETER_HEADROOM,
    PREFETCH,
    UPLOAD,
    MemoryBudget,
    cgroup_memory_limit,
    fit_limits,
)
from datamount.fs.access import access_from
from datamount.fs.namespace import Attrs, Namespace
from datamount.fs.ops import ReadOnlyFS
from datamount.mount.plan import MountPlan
from datamount.read.ahead import MAX_LISTING, FileAhead
from datamount.read.blocks import ObjectId
from datamount.read.cache.blockfile import CachedBlocks
from datamount.read.cache.disk import DiskCache
from datamount.read.cache.protocol import BlockCache, NoCache
from datamount.read.cache.ram import MemoryCache
from datamount.read.cache.tiered import TieredCache
from datamount.read.densefill import DenseFill
from datamount.read.fetch import RUN_BYTES, BlockFetcher
from datamount.read.fetchlane import MountLane
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.reader import BlockReader, Reader, ReadHandle
from datamount.read.stats import MountStats
from datamount.read.wholefile import WholeFileReader
from datamount.settings import Settings, storage_level_line
from datamount.storage import store_for
from datamount.storage.base import ObjectStore
from datamount.storage.location import StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.transfer.downloader import DownloadOptions
from datamount.transfer.uploader import BLOCK_SIZE as UPLOAD_BLOCK_SIZE

log = logging.getLogger("datamount.readstack")


class MountReader:
    """The Reader a mount uses, owning everything under it. `budget` is the
    mount's one MemoryBudget: an rw_mount hands it to its WriteBack."""

    def __init__(
        self,
        reader: Reader,
        closers: list[Callable[[], None]],
        budget: MemoryBudget,
        fetcher: BlockFetcher | None = None,
        disk: DiskCache | None = None,
        block_size: int = 0,
    ) -> None:
        self.reader = reader
        self._closers = closers
        self.budget = budget
        self.fetcher = fetcher  # block mode: what the file-ahead prefetcher fetches with
        # block mode with a disk tier (told each block file written), and where
        # it keeps an object's blocks of `block_size` (fs.lowlevel)
        self.disk = disk
        self.blocks_of: Callable[[ObjectId], CachedBlocks | None] | None = (
            None if disk is None else functools.partial(disk.files_of, block_size=block_size)
        )

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
    level_line = storage_level_line(settings)  # DATAMOUNT_STORAGE_LEVEL: the values it set
    if level_line is not None:
        log.info("%s", level_line)
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
    block_mode = settings.block_based_cache_enabled
    lane = start_lane(settings, store, disk) if block_mode else None
    fetcher = BlockFetcher(
        store, cache, settings.read_block_size, scheduler, stats, budget=budget, lane=lane
    )
    dense = DenseFill(fetcher, stats, lambda: cache_capacity(settings)) if block_mode else None
    reader: Reader = BlockReader(
        fetcher, settings.read_block_size, settings.read_buffer_block_count, dense=dense
    )
    mode = "block"
    if not block_mode:
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
    closers = [scheduler.close, cache.close]
    if lane is not None:
        closers.insert(1, lane.close)  # after the scheduler: no fetch calls it any more
    if dense is not None:
        closers.insert(0, dense.close)
    on_disk = disk if block_mode and isinstance(disk, DiskCache) else None
    return MountReader(
        reader, closers, budget, fetcher if block_mode else None, on_disk,
        settings.read_block_size,
    )  # fmt: skip


def start_lane(settings: Settings, store: ObjectStore, disk: BlockCache) -> MountLane | None:
    """DATAMOUNT_MOUNT_PROCESSES > 1: the worker processes that make the
    block fetches (read/fetchlane.py), or None (with the reason in the log)."""
    processes = settings.mount_processes
    if processes <= 1:
        return None
    recipe = store.recipe()
    if recipe is None:
        log.info("blocks fetched in the daemon: %r cannot be opened in a worker process", store)
        return None
    threads = max(2, settings.read_threads // processes)
    block_size = settings.read_block_size
    run_blocks = max(1, RUN_BYTES // block_size)  # a slab holds the fetcher's longest request
    try:
        on_disk = disk if isinstance(disk, DiskCache) else None
        lane = MountLane(recipe, processes, threads, block_size, on_disk, run_blocks=run_blocks)
    except OSError as exc:  # fork / pipe / shared memory limits: the daemon reads them
        log.warning("blocks fetched in the daemon: cannot start worker processes: %s", exc)
        return None
    log.info(
        "blocks (requests up to %d B) fetched by %d worker processes of %d threads: pids %s",
        lane.slab_size, processes, threads, " ".join(map(str, lane.pids)),
    )  # fmt: skip
    return lane


def cache_capacity(settings: Settings) -> int:
    """The bytes the block cache can hold now: the RAM tier plus what the
    disk tier may take of its filesystem (DenseFill's "fits the cache")."""
    total = settings.memory_cache_size
    if settings.block_file_cache_enabled:
        st = os.statvfs(settings.cache_dir)
        total += settings.cache_limit(st.f_bavail * st.f_frsize, 0)
    return total


def memory_budget(
    settings: Settings, *, uploads: bool, cgroup: tuple[int, Path] | None | bool = True
) -> MemoryBudget:
    """The mount's one MemoryBudget: each area the bound its consumer had on
    its own, so the total is their sum (64 + 512 + 128 = 704 MiB by default
    with 8 upload threads). The RAM tier is not in it. Under a cgroup memory
    limit (`cgroup`: True reads this process's, or give (bytes, file), or
    None) the areas shrink so that budget + RAM tier + INTERPRETER_HEADROOM
    fit it, each keeping one block."""
    limits = _budget_limits(settings, uploads=uploads)
    found = cgroup_memory_limit() if cgroup is True else cgroup or None
    total = sum(limits.values())
    if found is None:
        log.info("no cgroup memory limit: the budget is %s", _mib(total))
        return MemoryBudget(limits)
    ceiling, source = found
    room = ceiling - settings.memory_cache_size - INTERPRETER_HEADROOM
    floors = {PREFETCH: settings.read_block_size, DISK_QUEUE: settings.read_block_size,
              UPLOAD: UPLOAD_BLOCK_SIZE}  # fmt: skip
    fitted = fit_limits(limits, room, floors)
    fitted_total = sum(fitted.values())
    if fitted_total < total:
        log.info(
            "budget %s instead of %s: %s limits memory to %s (minus the RAM tier %s "
            "and %s for the interpreter)",
            _mib(fitted_total), _mib(total), source, _mib(ceiling),
            _mib(settings.memory_cache_size), _mib(INTERPRETER_HEADROOM),
        )  # fmt: skip
        if fitted_total > room:
            log.warning(
                "the cgroup memory limit %s (%s) is below what one block per area and the "
                "RAM tier need: lower DATASET_MOUNT_MEMORY_CACHE_SIZE (now %s)",
                _mib(ceiling), source, _mib(settings.memory_cache_size),
            )  # fmt: skip
    else:
        log.info("budget %s fits the cgroup memory limit %s (%s)", _mib(total),
                 _mib(ceiling), source)  # fmt: skip
    return MemoryBudget(fitted)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def _budget_limits(settings: Settings, *, uploads: bool) -> dict[str, int]:
    return {
        # A full prefetch window of blocks (32 x 2 MiB = 64 MiB by default).
        PREFETCH: max(1, settings.read_buffer_block_count) * settings.read_block_size,
        DEMAND: 0,
        DISK_QUEUE: settings.block_file_cache_max_queue_size
        if settings.block_file_cache_enabled
        else 0,
        # WriteBack's upload_budget: 2 x upload threads x 8 MiB blocks.
        UPLOAD: 2 * settings.downloader_threads * UPLOAD_BLOCK_SIZE if uploads else 0,
    }


# Attributes of an rw_mount expire after 2 s when DATASET_MOUNT_ATTRIBUTE_CACHE_TTL
# is unset: other writers' changes show up soon; a mount's own writes
# invalidate its caches at once.
RW_ATTRIBUTE_TTL_MS = 2000


def attribute_ttl(settings: Settings) -> float | None:
    """DATASET_MOUNT_ATTRIBUTE_CACHE_TTL in seconds; None = never expires."""
    ms = settings.attribute_cache_ttl_ms
    return None if ms is None else ms / 1000.0


def staging_folder(settings: Settings, location: StorageLocation) -> Path:
    """Where an rw_mount of `location` stages writes: a new mount of the same
    output with the same cache re-uploads what a previous one could not."""
    digest = hashlib.sha256(location.uri().encode()).hexdigest()[:24]
    return settings.cache_dir / "staging" / digest


@dataclass
class Stack:
    """What a mount daemon serves, and everything to close after it."""

    fs: ReadOnlyFS
    stats: MountStats
    retry: RetryPolicy
    cleanup: contextlib.ExitStack
    budget: MemoryBudget | None = None  # the mount's one memory budget (metrics)
    store: ObjectStore | None = None  # the metrics hook onto its responses
    ahead: FileAhead | None = None  # the file-ahead prefetcher (block mode): hints go to it

    def close(self) -> None:
        self.cleanup.close()


def build(plan: MountPlan) -> Stack:
    """The stack of `plan`: ro_mount, eval_mount or rw_mount."""
    settings = plan.settings
    location = plan.location
    retry = RetryPolicy.from_settings(settings)
    cleanup = contextlib.ExitStack()
    try:
        root: str | None = None
        store: ObjectStore
        if plan.mode == "eval_mount":
            from datamount.mltable import evalmode  # numpy, pyarrow: only when used

            store = evalmode.listing_store(
                plan.eval_files, plan.eval_text, lambda loc: store_for(settings, loc, retry)
            )
            root = ""  # the eval layout: <account>/<container>/<path>, MLTable
        else:
            store = store_for(settings, location, retry)
        cleanup.callback(store.close)
        stats = MountStats()
        writable = plan.staging is not None
        reader = build_reader(settings, store, stats, cache_key=location.uri(), uploads=writable)
        cleanup.callback(reader.close)
        namespace = Namespace(
            store,
            root if root is not None else "" if plan.is_file else location.key,
            file_key=location.key if plan.is_file else None,
            ttl=attribute_ttl(settings),
        )
        fs = _writable(plan, store, reader, namespace) if writable else None
        if fs is None:
            fs = ReadOnlyFS(namespace, reader, store_id=location.store_root,
                            access=access_from(settings, writable=False))  # fmt: skip
            fs.cached_blocks, fs.block_size = reader.blocks_of, settings.read_block_size
        cleanup.callback(fs.close)
        ahead = file_ahead(reader, stats, namespace, location.store_root)
        if ahead is not None:
            fs.on_open = ahead.opened
            if reader.disk is not None and fs.writes is None:
                # prefetched small files open natively (fs.ops.prefetched)
                ahead.on_cached = fs.prefetched
                reader.disk.on_written = ahead.written
            cleanup.callback(ahead.close)  # before the reader and fs: ExitStack is LIFO
    except BaseException:
        cleanup.close()
        raise
    return Stack(fs, stats, retry, cleanup, budget=reader.budget, store=store, ahead=ahead)


def file_ahead(
    reader: MountReader, stats: MountStats, namespace: Namespace, store_id: str
) -> FileAhead | None:
    """Block mode: whole files fetched ahead of the reader, in the folder's
    listing order or a loader's hinted order (read.ahead)."""
    if reader.fetcher is None:
        return None  # whole-file mode downloads each file at its open anyway

    def version(attrs: Attrs) -> ObjectId:
        return ObjectId(store_id, attrs.key, attrs.etag, attrs.size)

    def resolve(rel: str) -> ObjectId | None:
        try:
            attrs = namespace.getattr("/" + rel)
        except FileNotFoundError:
            return None
        return None if attrs.is_dir else version(attrs)

    def listing(folder: str) -> list[str]:
        # The attributes stay in the namespace's cache: the plan's files resolve there.
        entries = itertools.islice(namespace.list_dir("/" + folder), MAX_LISTING)
        return [name for name, a in entries if not a.is_dir]

    on_disk = reader.disk.contains if reader.disk is not None else None
    ahead = FileAhead(reader.fetcher, stats, resolve, listing, on_disk=on_disk)
    log.info(
        "file-ahead prefetch: up to %d files, %s ahead (folder order and loader hints)",
        ahead.plan.max_files, _mib(ahead.plan.max_bytes),
    )  # fmt: skip
    return ahead


def _writable(
    plan: MountPlan, store: ObjectStore, reader: MountReader, namespace: Namespace
) -> ReadOnlyFS:
    """rw_mount: the read-only stack plus write-back staging (fs.writable,
    write.writeback); re-uploads what a previous mount left staged."""
    from datamount.fs.writable import WritableFS  # rw only: ro daemons start faster
    from datamount.write.writeback import WriteBack, WriteBackOptions

    settings = plan.settings
    assert plan.staging is not None
    writeback = WriteBack(
        store,
        plan.staging,
        WriteBackOptions(
            threads=settings.downloader_threads,
            reserved_free_disk_space=settings.reserved_free_disk_space,
        ),
        budget=reader.budget,  # the upload buffers draw from the mount's one budget
    )
    fs = WritableFS(namespace, reader, writeback, store_id=plan.location.store_root,
                    access=access_from(settings, writable=True))  # fmt: skip
    log.info(
        "rw_mount %s at %s: staging in %s, attribute TTL %s s, upload blocks of %d B, "
        "%d upload threads",
        plan.location.uri(), plan.mountpoint, plan.staging, attribute_ttl(settings),
        writeback.options.block_size, writeback.options.threads,
    )  # fmt: skip
    recovered = fs.start_recovery()
    if recovered:
        log.info("re-uploading %d files a previous mount left staged", recovered)
    return fs
