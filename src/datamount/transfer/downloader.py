"""The Downloader: copy a file or a folder tree from a store to local disk in
parallel, at the storage limit, without ever leaving a partial file under its
final name.

- Parallel over files and over fixed ranges of large files: every file is
  written into one pre-sized hidden `.<name>.part` beside its final path with
  positional writes (transfer.partfile), then size-checked, made durable
  (small files in groups: one syncfs of the destination for many files) and
  atomically renamed (transfer.landing).
- The listing streams: the first page's downloads start while later pages are
  still being listed; each page is planned (transfer.copyplan: resume skips, one
  object per local path, the free-space check) before any of its files starts.
- Every range is pinned to the etag seen at listing time; a blob changed
  mid-download restarts that file from its new version (never stitched).
- Completed files are recorded in the resume manifest; a re-run skips them.
- Small files (up to BEHIND_MAX) are fetched whole into a slab and written
  by a writer thread (transfer.behind), so a wait on the local disk holds no
  GET back.
- Memory: one `range_size` buffer per fetch thread, the slabs (`4 × threads`
  of at most BEHIND_MAX), at most `2 × threads` queued tasks — never
  proportional to the data.
- With `processes` > 1, files of one range go to worker processes
  (transfer.processlane, docs/design/lane.md) that write their `.part`; this
  process still lists, plans, commits, renames and records them.

Threads: `threads` workers (transfer.tasks) fetch; `threads / 4` (at
least 2) writers write small files and finish them; the calling thread lists
and schedules; with processes, the lane's collector thread finishes their files.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount.errors import VersionChanged
from datamount.storage.base import ReadableStore
from datamount.transfer import landing
from datamount.transfer.behind import Slabs
from datamount.transfer.copyplan import Plan, span_ranges
from datamount.transfer.durable import GroupSync
from datamount.transfer.landing import Job, Landing
from datamount.transfer.manifest import Manifest
from datamount.transfer.partfile import (
    Buffers,
    DirectIO,
    Folders,
    PartFile,
    as_data_error,
    changed,
    local_errors,
    read_range,
    read_span,
)
from datamount.transfer.processlane import OnDemand, ProcessLane, rebuild
from datamount.transfer.progress import Progress, human
from datamount.transfer.source import SourceFile, folder_pages, single_file
from datamount.transfer.tasks import Gate, Tasks
from datamount.transfer.worker import Result, Setup

log = logging.getLogger("datamount.transfer.download")

# 8 MiB ranges: large enough that the per-request cost is a small share of a
# range, small enough that the threads' buffers stay small (threads x range).
# Why 8 MiB: docs/design/download.md ("Range size").
RANGE_SIZE = 8 << 20
# The most range buffers (one per thread) a download sizes its threads up to
# on a slow link (storage.latency): 32 threads of RANGE_SIZE.
IN_FLIGHT_BUFFERS = 256 << 20
MAX_RESTARTS = 3  # a blob rewritten more often than this during one download fails
# Write-behind (transfer.behind): files up to this size are fetched whole into a
# slab and written by a writer thread, so a wait on the disk holds no GET back;
# slabs per fetch thread; one writer thread per four fetch threads (at least 2).
BEHIND_MAX = 1 << 20
BEHIND_SLABS_PER_THREAD = 4


@dataclass(frozen=True)
class DownloadOptions:
    threads: int = 8
    range_size: int = RANGE_SIZE
    reserved_free_disk_space: int = 150 << 20
    overwrite: bool = False
    max_restarts: int = MAX_RESTARTS
    fsync: bool = True  # False: rename without fsync (process-crash safe, not power-loss safe)
    direct_io: bool = True  # O_DIRECT for aligned ranges of big files (transfer.partfile)
    manifest_dir: Path | None = None  # None: the resume manifest lives in the destination
    processes: int = 1  # > 1: the small-file lane in that many processes (transfer.processlane)


@dataclass
class DownloadResult:
    path: Path  # the downloaded file (uri_file) or the destination folder
    files: int
    bytes: int
    skipped_files: int
    skipped_bytes: int
    restarts: int
    seconds: float


class Downloader:
    def __init__(
        self, store: ReadableStore, options: DownloadOptions, progress: Progress | None = None
    ) -> None:
        self.store = store
        self.options = options
        self.progress = progress or Progress("download")
        self._buffers = Buffers(options.range_size)
        self._slots = Gate(options.threads * 2)
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._folders = Folders()
        self._folders_seen: set[str] = set()  # the folders of files started, as text
        self._planned: set[str] = set()  # every local path planned (transfer.copyplan)
        self._land = Landing(self.progress, fsync=options.fsync)
        self._restarts = 0
        self._direct = DirectIO(options.direct_io, log)
        self._behind_max = min(BEHIND_MAX, options.range_size)
        self._slabs = Slabs(options.threads * BEHIND_SLABS_PER_THREAD, self._behind_max)
        lane_max = min(options.range_size, landing.GROUP_COMMIT_MAX_FILE)
        self._offload = OnDemand(store, options.processes, lane_max, log)

    # -- entry point -------------------------------------------------------

    def download(self, key: str, dest: Path, *, is_file: bool, source_id: str) -> DownloadResult:
        """Copy object `key` (is_file) or the folder `key` into `dest`."""
        the_file = single_file(self.store, key) if is_file else None
        pages = iter([[the_file]]) if the_file else folder_pages(self.store, key)
        result = self.copy(pages, dest, source_id=source_id)
        if the_file is not None:
            result.path = dest / the_file.rel
        return result

    def copy(
        self, pages: Iterable[list[SourceFile]], dest: Path, *, source_id: str
    ) -> DownloadResult:
        """Copy every file of `pages` (pages of a listing, or any list the
        caller made: e.g. an evaluated MLTable) to `dest / file.rel`."""
        started = time.monotonic()
        self._offload.lane = None  # a lane serves one copy; started on its first small file
        manifest = Manifest(dest, source_id, self.options.manifest_dir)
        if not self.options.overwrite:
            with local_errors(f"cannot read the resume manifest {manifest.path}"):
                manifest.load()
        self._sync = GroupSync(dest)
        self._land.begin(manifest, self._sync)
        plan = Plan(
            dest, manifest, self.progress, self._planned,
            overwrite=self.options.overwrite, reserve=self.options.reserved_free_disk_space,
        )  # fmt: skip
        log.info(
            "download %s -> %s: %d threads, %s ranges, %s free beyond the reserve, %s",
            source_id,
            dest,
            self.options.threads,
            human(self.options.range_size),
            human(max(plan.budget, 0)),
            self._offload.describe(),
        )
        manifest_open = False
        try:
            with (
                Tasks(self._writer_count(), "dl-write") as writers,
                Tasks(self.options.threads, "download") as pool,
            ):  # the fetch pool stops first: its last files still go to the writers
                self._pool, self._writers = pool, writers
                try:
                    for page in pages:
                        todo = plan.page(page)
                        if todo and not manifest_open:  # the first write into DEST
                            self._folders.ensure(dest)
                            with local_errors(f"cannot write the resume manifest {manifest.path}"):
                                manifest.open()
                            if self.options.fsync:
                                self._sync.open()
                            manifest_open = True
                        for src in todo:
                            if self._cancel.is_set():
                                break
                            self._start(src, dest)
                        if self._lane is not None:
                            self._lane.flush()
                        if self._cancel.is_set():
                            break
                except BaseException as exc:
                    self._fail(exc)
                self.progress.listing_done = True
                self._land.wait_idle(self._cancel)
            if self._error is None:
                self._folders.ensure(dest)  # an empty folder is a result too
        finally:
            self._offload.close(kill=self._cancel.is_set())  # no worker writes after this
            self._land.cleanup()  # may still record committed files
            manifest.close()
            self._sync.close()
        if self._error is not None:
            raise as_data_error(self._error, dest)
        return DownloadResult(
            path=dest,
            files=self.progress.files,
            bytes=self.progress.bytes,
            skipped_files=self.progress.skipped_files,
            skipped_bytes=self.progress.skipped_bytes,
            restarts=self._restarts,
            seconds=time.monotonic() - started,
        )

    # -- scheduling (calling thread) --------------------------------------

    def _start(self, src: SourceFile, dest: Path) -> None:
        final = dest / src.rel
        # Strings, not Paths, per file. Why: docs/design/download.md
        # ("Threads and gates on SimpleQueue").
        folder, sep, name = str(final).rpartition(os.sep)
        if folder not in self._folders_seen:
            self._folders.ensure(final.parent)
            self._folders_seen.add(folder)
        job = Job(src, final, PartFile(f"{folder}{sep}.{name}.part"))
        self._land.add(job)
        if self._offload.takes(src.size):
            lane = self._offload.get(self._setup, self._lane_done, self._fail)
            lane.submit(job, src.key, src.size, src.etag, str(job.part.path))
            return
        if not self._behind(src.size):  # a small file's .part: made by its writer
            job.part.open(src.size, self._direct, ranges=self.store.supports_ranges)
        if src.size == 0:
            self._land.finish(job)
            return
        self._schedule(job, slots=True)

    def _behind(self, size: int) -> bool:
        """Whether a file of `size` is fetched whole and written behind."""
        return 0 < size <= self._behind_max and self.store.supports_ranges

    def _schedule(self, job: Job, *, slots: bool) -> None:
        if not self.store.supports_ranges:  # a server without ranges: one GET
            with job.lock:
                job.pending = 1
            if slots:
                self._slots.take()
            self._pool.submit(self._fetch, job, 0, -1, slots)
            return
        size = job.src.size
        if self._behind(size):  # a small file: one GET, written behind
            with job.lock:
                job.pending = 1
            if slots:
                self._slots.take()
            self._pool.submit(self._fetch_whole, job, slots)
            return
        step = self.options.range_size * span_ranges(
            size, self.options.range_size, self.options.threads
        )
        ranges = [(off, min(step, size - off)) for off in range(0, size, step)]
        with job.lock:
            job.pending = len(ranges)
        for offset, length in ranges:
            if slots:
                self._slots.take()
            self._pool.submit(self._fetch, job, offset, length, slots)

    # -- workers ----------------------------------------------------------

    def _fetch(self, job: Job, offset: int, length: int, slot: bool) -> None:
        """One span (transfer.copyplan.span_ranges) into the .part, piece by
        piece; `length` -1: the whole file in one GET, written as it arrives
        (no buffer of its size: a store without ranges)."""
        try:
            if self._cancel.is_set() or job.stale:
                return
            if length < 0:
                length = self.store.stream_into(job.src.key, job.part.fd, etag=job.src.etag)
                self._landed(job, length)
            elif length <= self.options.range_size:  # one range: one read_into
                view = self._buffers.get()[:length]
                read_range(self.store, job.src.key, offset, view, job.src.etag)
                self._write(job, view, offset)
            else:  # a span of ranges: each piece written as it arrives
                sink = functools.partial(self._write, job)
                buffer = self._buffers.get()
                read_span(self.store, job.src.key, offset, length, buffer, sink, job.src.etag)
        except VersionChanged:
            job.stale = True
        except BaseException as exc:
            self._fail(exc)
        finally:
            if slot:
                self._slots.give()
            self._range_done(job)

    def _fetch_whole(self, job: Job, slot: bool) -> None:
        """A small file in one GET into a slab, handed to a writer thread
        (`_write_behind`): this thread's next GET does not wait for the disk."""
        handed = False
        try:
            if self._cancel.is_set() or job.stale:
                return
            slab = self._slabs.take()
            try:
                read_range(self.store, job.src.key, 0, slab[: job.src.size], job.src.etag)
                self._writers.submit(self._write_behind, job, slab)
                handed = True
            finally:
                if not handed:
                    self._slabs.give(slab)
        except VersionChanged:
            job.stale = True
        except BaseException as exc:
            self._fail(exc)
        finally:
            if slot:
                self._slots.give()
            if not handed:
                self._range_done(job)

    def _write_behind(self, job: Job, slab: memoryview) -> None:
        """A writer thread: the fetched file into its .part (created now: a
        create that waits on the disk holds back neither the GETs nor the
        calling thread's scheduling), then its finish (size check, group
        commit, rename) as the last range of any file."""
        try:
            if not self._cancel.is_set():
                if job.part.fd < 0:  # created here, off the calling thread
                    job.part.open(job.src.size, self._direct)
                self._write(job, slab[: job.src.size], 0)
        except BaseException as exc:
            self._fail(exc)
        finally:
            self._slabs.give(slab)
            self._range_done(job)

    def _writer_count(self) -> int:
        return max(2, self.options.threads // 4)

    def _write(self, job: Job, view: memoryview, offset: int) -> None:
        job.part.write(view, offset)
        self._landed(job, len(view))

    def _landed(self, job: Job, n: int) -> None:
        with job.lock:
            job.written += n
        self.progress.add_bytes(n)

    def _range_done(self, job: Job) -> None:
        with job.lock:
            job.pending -= 1
            last = job.pending == 0
        if not last:
            return
        try:
            if self._cancel.is_set():
                self._land.drop(job)
            elif job.stale:
                self._restart(job)
            else:
                self._land.finish(job)
        except BaseException as exc:
            self._fail(exc)
            self._land.drop(job)

    def _restart(self, job: Job) -> None:
        job.restarts += 1
        self._restarts += 1
        info = changed(self.store, job.src.key, job.restarts, self.options.max_restarts)
        log.warning(
            "%s changed during the download (etag %s -> %s): restarting the file",
            job.src.key,
            job.src.etag,
            info.etag,
        )
        self.progress.unbytes(job.written)
        job.src = SourceFile(job.src.key, job.src.rel, info.size, info.etag)
        job.written, job.stale = 0, False
        job.part.open(info.size, self._direct, ranges=self.store.supports_ranges)  # truncates
        if info.size == 0:
            self._land.finish(job)
        else:
            self._schedule(job, slots=False)  # from a worker: must not wait for a slot

    # -- the small-file lane in worker processes (transfer.processlane) ------

    @property
    def _lane(self) -> ProcessLane | None:
        return self._offload.lane

    def _setup(self, recipe: Any) -> Setup:
        n = self.options.processes
        return Setup(
            recipe, max(1, -(-self.options.threads // n)), self.options.range_size,
            self._direct.enabled, self.options.fsync, self._sync.dev, self.options.max_restarts,
        )  # fmt: skip

    def _lane_done(self, job: Job, result: Result) -> None:
        """A worker's report on one file (the collector thread): its `.part`
        is complete and size-checked, or the error that stopped it."""
        try:
            stats = self.store.retry_stats()
            if result.retries and stats is not None:
                stats.add(retries=result.retries)
            if result.error is not None:
                raise rebuild(result.error)
            if result.restarts:
                self._restarts += result.restarts
                job.src = SourceFile(job.src.key, job.src.rel, result.size, result.etag)
            job.dev, job.written = result.dev, result.size
            self.progress.add_bytes(result.size)
            if self._cancel.is_set():
                self._land.drop(job)
            elif not self.options.fsync or result.durable:
                self._land.publish(job)
            else:
                self._land.join(job)  # made durable by the group's syncfs
        except BaseException as exc:
            self._fail(exc)
            self._land.drop(job)

    def _fail(self, exc: BaseException) -> None:
        with self._error_lock:
            if self._error is None:
                self._error = exc
                log.error("download failed: %s", exc or type(exc).__name__)
        self._cancel.set()
