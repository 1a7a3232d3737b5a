"""The download's small-file lane in worker processes: N processes
(transfer.worker), each with its own store, connection pool and GIL, fetch
whole small files into their `.part` files; the Downloader (the parent)
keeps the listing, the plan, the manifest, the group commit and the renames.

- Workers start with the 'forkserver' context where the platform has it,
  else 'spawn' (never 'fork': the parent has threads). The store's recipe,
  secret included, reaches a worker as its first message over its pipe:
  never argv or environment.
- Files go out in batches (`BATCH`, or whatever a page leaves) to the worker
  with the fewest in flight; at most `2 x threads + BATCH` files per worker
  are in flight (`submit` blocks, after sending what waits, until a batch's
  worth came back).
- A worker that dies (killed, crashed) while it holds files is one clear
  DataError; `close(kill=True)` stops every worker before the Downloader
  drops the `.part` files, so nothing writes after the clean-up.

Threads: one collector thread (`lane-collect`) receives every worker's
results and hands each to `on_result(job, result)` or, on a death,
`on_dead(error)`; `submit`, `flush` and `close` run on the caller's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from datamount import errors
from datamount.errors import DataError, StorageError
from datamount.storage.base import ReadableStore
from datamount.transfer import worker
from datamount.transfer.progress import human
from datamount.transfer.worker import Result, Setup

if TYPE_CHECKING:  # multiprocessing is imported once a lane starts: a download
    # without worker processes (the default) does not pay for it
    from multiprocessing.connection import Connection

log = logging.getLogger("datamount.transfer.lane")

BATCH = 16  # files per message to a worker
STOP_TIMEOUT = 30.0  # seconds a worker gets to finish and exit after `close`


def start_method() -> str:
    import multiprocessing

    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def fork_context() -> Any:
    """The multiprocessing context worker processes start from (this lane's
    and the mount's, read/fetchlane.py); pair each start with `use_fork_server`."""
    import multiprocessing

    ctx = multiprocessing.get_context(start_method())
    if start_method() == "forkserver":
        # Each worker forked from the server runs the parent's main script
        # again (multiprocessing prepares it so); with datamount's modules
        # imported once in the server that costs nothing per worker.
        # Why: docs/design/lane.md ("Fork server preload").
        ctx.set_forkserver_preload(sorted(m for m in sys.modules if m.startswith("datamount")))
    return ctx


def rebuild(error: tuple[str, str, bool, int | None, int | None]) -> BaseException:
    """A worker's `portable` exception as the class it was (where known)."""
    name, message, transient, status, err = error
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, StorageError):
        return cls(message, transient=transient, status=status, err=err)
    if name == "OSError":
        return OSError(err or 0, message)
    return DataError(message, transient=transient)


class _Proc:
    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.inflight: dict[int, Any] = {}  # task index -> the Downloader's job
        self.waiting: list[tuple[int, str, int, str, str]] = []  # Tasks not yet sent
        self.open = True  # its pipe still delivers
        self.usage: dict[str, float] = {"cpu": 0.0, "rss_mib": 0.0}  # once it has finished


class ProcessLane:
    def __init__(
        self,
        processes: int,
        setup: Setup,
        on_result: Callable[[Any, Result], None],
        on_dead: Callable[[BaseException], None],
    ) -> None:
        self.on_result = on_result
        self.on_dead = on_dead
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        # Files in flight: enough that batches fill (a worker's threads busy,
        # a batch queued behind them); `submit` waits, once they are all out,
        # until a batch's worth came back (so batches stay batches).
        self._cap = processes * (2 * setup.threads + BATCH)
        self._free = self._cap
        self._refill = min(BATCH * processes, self._cap // 2)
        self._next = 0
        self._stopping = False
        self._killing = False
        self._closed = False
        self.error: BaseException | None = None  # a worker's death
        ctx = fork_context()
        self.procs: list[_Proc] = []
        use_fork_server()
        try:
            for n in range(processes):
                process, conn = spawn_worker(ctx, worker.main, f"datamount-download-{n}", setup)
                self.procs.append(_Proc(process, conn))
        except BaseException:
            self.close(kill=True)
            raise
        self._collector = threading.Thread(target=self._collect, name="lane-collect", daemon=True)
        self._collector.start()

    @property
    def pids(self) -> list[int]:
        return [p.process.pid for p in self.procs]

    @property
    def usage(self) -> list[dict[str, float]]:
        """Each worker's CPU seconds and peak RSS in MiB (after a `close`
        that let them finish)."""
        return [p.usage for p in self.procs]

    # -- the caller's thread ------------------------------------------------

    def submit(self, job: Any, key: str, size: int, etag: str, part: str) -> None:
        with self._lock:
            full_up = self._free == 0
        if full_up:
            self.flush()  # what waits must go out before we wait for room
            with self._room:
                while self._free < self._refill and self.error is None:
                    self._room.wait(0.5)
        with self._lock:
            live = [p for p in self.procs if p.open]
            if self.error is not None or not live:
                raise self.error or DataError("no download worker process is running")
            self._free -= 1
            proc = min(live, key=lambda p: len(p.inflight) + len(p.waiting))
            index = self._next
            self._next += 1
            proc.inflight[index] = job
            proc.waiting.append((index, key, size, etag, part))  # a Task, as a plain tuple
            full = len(proc.waiting) >= BATCH
        if full:
            self._send(proc)

    def flush(self) -> None:
        for proc in self.procs:
            self._send(proc)

    def _send(self, proc: _Proc) -> None:
        with self._lock:
            tasks, proc.waiting = proc.waiting, []
        if tasks and proc.open:
            with contextlib.suppress(OSError):  # its pipe is gone: the collector reports it
                proc.conn.send(tasks)

    def close(self, *, kill: bool = False) -> None:
        """Finish (each worker ends after the tasks it has) or, with `kill`,
        stop every worker now; returns once none runs."""
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._killing = kill
        for proc in self.procs:
            if kill:
                kill_worker(proc.process)
            elif proc.open:
                self._send(proc)
                with contextlib.suppress(OSError):
                    proc.conn.send(None)
        join_workers([p.process for p in self.procs], None if kill else STOP_TIMEOUT)
        collector = getattr(self, "_collector", None)
        if collector is not None and collector is not threading.current_thread():
            collector.join()
        for proc in self.procs:
            proc.conn.close()
        release_fork_server()

    # -- the collector thread -----------------------------------------------

    def _collect(self) -> None:
        collect(self.procs, self._receive)

    def _receive(self, proc: _Proc) -> None:
        try:
            batch: list[tuple[Any, ...]] | dict[str, float] = proc.conn.recv()
        except (EOFError, OSError):
            proc.open = False
            self._ended(proc)
            return
        if isinstance(batch, dict):  # its last message
            proc.usage = batch
            return
        results = [Result._make(r) for r in batch]
        with self._room:
            jobs = [proc.inflight.pop(result.seq) for result in results]
            self._free += len(results)
            self._room.notify()
        for job, result in zip(jobs, results, strict=True):
            try:
                self.on_result(job, result)
            except BaseException as exc:  # the Downloader handles its own; be safe
                self.on_dead(exc)

    def _ended(self, proc: _Proc) -> None:
        with self._lock:
            lost = len(proc.inflight)  # the waiting tasks are in it too
            self._free += lost
            self._room.notify()
            proc.inflight.clear()
            proc.waiting.clear()  # their jobs stay with the Downloader, which drops them
        if self._killing or (lost == 0 and self._stopping):
            return
        proc.process.join(5.0)
        code = proc.process.exitcode
        how = (
            f"was killed by signal {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        err = DataError(
            f"download worker process {proc.process.pid} {how} with {lost} file(s) in flight; "
            "the download stopped (no partial file was kept under a final name)"
        )
        self.error = err
        self.on_dead(err)


class OnDemand:
    """A download's hold on its lane (the Downloader's side): which files go
    to worker processes, the lane started on the first of them, its end.
    Its lines go to the Downloader's `log`."""

    def __init__(
        self, store: ReadableStore, processes: int, max_size: int, log: logging.Logger
    ) -> None:
        self.processes = processes
        self.max_size = max_size  # files of one range that a group commit takes
        self.recipe = store.recipe() if processes > 1 else None
        self.lane: ProcessLane | None = None
        self._store = store
        self._log = log
        self._lock = threading.Lock()

    def describe(self) -> str:
        """Where a download's small files go, for its start line."""
        if self.processes <= 1:
            return "in-process (DATAMOUNT_DOWNLOAD_PROCESSES=1)"
        if self.recipe is None:
            return f"in-process: {self._store!r} cannot be opened in a worker process"
        return f"files up to {human(self.max_size)} in {self.processes} worker processes"

    def takes(self, size: int) -> bool:
        return self.recipe is not None and 0 < size <= self.max_size and self._store.supports_ranges

    def get(
        self,
        setup: Callable[[Any], Setup],
        on_result: Callable[[Any, Result], None],
        on_dead: Callable[[BaseException], None],
    ) -> ProcessLane:
        """The lane, started on the first call (`setup(recipe)`: its workers'
        Setup); one DataError where the OS refuses the processes."""
        with self._lock:
            if self.lane is None:
                try:
                    self.lane = ProcessLane(self.processes, setup(self.recipe), on_result, on_dead)
                except OSError as exc:  # fork / pipe limits
                    raise DataError(f"cannot start the download worker processes: {exc}") from None
                self._log.info("download worker processes started: pids %s", self.lane.pids)
            return self.lane

    def close(self, *, kill: bool) -> None:
        """Stop the lane (if started; `kill`: now) and log what its workers used."""
        if self.lane is None:
            return
        self.lane.close(kill=kill)
        own = resource.getrusage(resource.RUSAGE_SELF)
        self._log.info(
            "download worker processes done: CPU s %s, peak RSS MiB %s (this "
            "process %.2f s in all)",
            " ".join(f"{u['cpu']:.2f}" for u in self.lane.usage),
            " ".join(f"{u['rss_mib']:.0f}" for u in self.lane.usage),
            own.ru_utime + own.ru_stime,
        )


def spawn_worker(ctx: Any, target: Callable[[Any], None], name: str, setup: Any) -> tuple[Any, Any]:
    """A daemon worker process of `ctx` running `target(its pipe end)`, sent
    `setup` over the pipe (the only way a secret reaches it): (process, our end)."""
    mine, theirs = ctx.Pipe(duplex=True)
    process = ctx.Process(target=target, args=(theirs,), name=name, daemon=True)
    process.start()
    theirs.close()
    mine.send(setup)
    return process, mine


def collect(procs: Sequence[Any], receive: Callable[[Any], None]) -> None:
    """A lane's collector loop (this one's and read/fetchlane.py's): `receive(proc)`
    for each worker whose pipe (`proc.conn`) has a message, until no worker's
    pipe delivers (`proc.open`, which `receive` clears at its end)."""
    from multiprocessing.connection import wait as connection_wait

    while True:
        live = [p for p in procs if p.open]
        if not live:
            return
        ready = connection_wait([p.conn for p in live])
        for proc in live:
            if proc.conn in ready:
                receive(proc)


def join_workers(processes: Sequence[Any], timeout: float | None) -> None:
    """Wait up to `timeout` for each worker to exit (None: as long as it
    takes), then SIGKILL and reap whichever still runs."""
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            kill_worker(process)
            process.join()


def kill_worker(process: Any) -> None:
    """SIGKILL a worker process that still runs."""
    if process.is_alive() and process.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


_servers = 0  # lanes using the fork server
_servers_lock = threading.Lock()


def use_fork_server() -> None:
    """A lane starts using the fork server (see `release_fork_server`)."""
    global _servers
    with _servers_lock:
        _servers += 1


def release_fork_server() -> None:
    """The last lane of the process stops the fork server (it would linger
    until this process exits); the next lane starts a new one."""
    global _servers
    with _servers_lock:
        _servers -= 1
        if _servers == 0 and start_method() == "forkserver":
            from multiprocessing import forkserver

            stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's own, for its tests
            if stop is not None:
                with contextlib.suppress(OSError):
                    stop()
