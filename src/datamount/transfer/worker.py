"""A worker process of the download's small-file lane (transfer.processlane): it
fetches whole small files into their `.part` files through a store of its
own (its own connection pool, its own GIL) and reports each one back. It
never gives a file its final name: the parent checks, commits and renames.

Protocol over its one Connection (pickled; secrets cross only here):
  parent -> worker  first a `Setup`; then lists of `Task`; None: finish
                    the tasks received, report them, exit.
  worker -> parent  lists of `Result` (one per task, in completion order),
                    at the end a dict: its CPU seconds and peak RSS (MiB).
A closed pipe (the parent died) ends the worker at once.

Each file: pre-sized `.part` (transfer.partfile, as the Downloader's), ranges
of `range_size` pinned to the etag, read into a per-thread buffer and written
by position, size-checked. A blob
changed mid-file restarts from its new version (at most `max_restarts`
times). With fsync on, a file on another filesystem than the parent's
group commit covers (`sync_dev`) is fsync'd here.

Threads: `threads` fetch threads, one reporter thread (sends what finished,
in batches), the main thread receives tasks.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from datamount.errors import DataError, StorageError, VersionChanged

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

from datamount.storage.base import StoreRecipe
from datamount.transfer.partfile import Buffers, DirectIO, PartFile, changed, read_range


@dataclass(frozen=True)
class Setup:
    recipe: StoreRecipe  # `.open(pool_size)` gives the store in this process
    threads: int
    range_size: int
    direct_io: bool
    fsync: bool
    sync_dev: int  # st_dev the parent's syncfs covers; -1: none (fsync here)
    max_restarts: int


class Task(NamedTuple):
    """One file to fetch; sent as a plain tuple, cheaper to pickle than a
    dataclass (docs/design/lane.md, "Fork server preload")."""

    seq: int  # the lane's number for the file
    key: str
    size: int
    etag: str
    part: str


class Result(NamedTuple):
    """One file's outcome; sent as a plain tuple (as Task)."""

    seq: int  # the lane's number for the file
    size: int  # of the version written (a restart may change it)
    etag: str
    dev: int
    durable: bool  # fsync'd here
    restarts: int
    retries: int  # this worker's retries since its last batch (first result only)
    error: tuple[str, str, bool, int | None, int | None] | None = None  # see portable()


def portable(exc: BaseException) -> tuple[str, str, bool, int | None, int | None]:
    """An exception as (class name, message, transient, status, errno): the
    storage error classes do not survive pickling (keyword-only fields)."""
    if isinstance(exc, StorageError):
        return (type(exc).__name__, exc.strerror or str(exc), exc.transient, exc.status, exc.errno)
    if isinstance(exc, OSError):
        name = f"{exc.strerror} ({os.fsdecode(exc.filename)})" if exc.filename else exc.strerror
        return ("OSError", name or str(exc), False, None, exc.errno)
    if isinstance(exc, DataError):
        return ("DataError", str(exc), bool(getattr(exc, "transient", False)), None, None)
    return (type(exc).__name__, str(exc) or type(exc).__name__, False, None, None)


class _Worker:
    def __init__(self, conn: Connection, setup: Setup) -> None:
        self.conn = conn
        self.setup = setup
        self.store = setup.recipe.open(setup.threads)
        self.results: queue.SimpleQueue[Result | None] = queue.SimpleQueue()
        self.buffers = Buffers(setup.range_size)
        self.direct = DirectIO(setup.direct_io)  # silent: the parent's log has the line
        self._retries_seen = 0

    def run(self) -> None:
        reporter = threading.Thread(target=self._report, name="report", daemon=True)
        reporter.start()
        with ThreadPoolExecutor(self.setup.threads, thread_name_prefix="fetch") as pool:
            while True:
                try:
                    tasks = self.conn.recv()
                except (EOFError, OSError):
                    os._exit(1)  # the parent is gone: nothing to report to
                if tasks is None:
                    break
                for task in tasks:
                    pool.submit(self._fetch, Task._make(task))
        self.results.put(None)
        reporter.join()
        self.store.close()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(
                {"cpu": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}
            )

    def _report(self) -> None:
        while True:
            first = self.results.get()
            if first is None:
                return
            batch = [first]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 256:
                    item = self.results.get_nowait()
                    if item is None:
                        self.results.put(None)
                        break
                    batch.append(item)
            stats = self.store.retry_stats()
            total = stats.retries if stats is not None else 0
            if total != self._retries_seen:
                batch[0] = batch[0]._replace(retries=total - self._retries_seen)
                self._retries_seen = total
            try:
                self.conn.send([tuple(r) for r in batch])
            except (OSError, ValueError):
                os._exit(1)

    def _fetch(self, task: Task) -> None:
        size, etag, restarts = task.size, task.etag, 0
        try:
            while True:
                try:
                    dev, durable = self._write_file(task, size, etag)
                    break
                except VersionChanged:
                    restarts += 1
                    info = changed(self.store, task.key, restarts, self.setup.max_restarts)
                    size, etag = info.size, info.etag
            self.results.put(Result(task.seq, size, etag, dev, durable, restarts, 0))
        except BaseException as exc:  # reported; the parent fails the download
            self.results.put(Result(task.seq, size, etag, -1, False, restarts, 0, portable(exc)))

    def _write_file(self, task: Task, size: int, etag: str) -> tuple[int, bool]:
        part = PartFile(task.part)
        try:
            part.open(size, self.direct)
            step = self.setup.range_size
            for offset in range(0, size, step):
                view = self.buffers.get()[: min(step, size - offset)]
                read_range(self.store, task.key, offset, view, etag)
                part.write(view, offset)
            st = part.check(size)
            durable = bool(self.setup.fsync and st.st_dev != self.setup.sync_dev)
            if durable:
                os.fsync(part.fd)
            return st.st_dev, durable
        finally:
            part.close()


def main(conn: Connection) -> None:
    """The worker's entry point (started by transfer.processlane, 'forkserver' or
    'spawn'): the first message is its Setup. Ctrl-C reaches the whole
    process group: the parent decides (it stops the workers), not the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        setup = conn.recv()
    except (EOFError, OSError):
        return
    _Worker(conn, setup).run()
