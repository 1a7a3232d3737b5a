"""The mount's fetch lane in worker processes (DATAMOUNT_MOUNT_PROCESSES): N
processes (read/fetchworker.py), each with its own store, pool and GIL, make
the block fetcher's requests (a small file, or a run of blocks) and write
their block files; the daemon keeps FUSE, the caches, prefetch, single
flight, the budget and part reads. Why: docs/design/lane.md ("Why a lane at all").

- `read_into(obj, offset, buffers)` is a blocking call of a fetch thread (for
  a request of at most `slab_size` bytes: one block, or `run_blocks`): it
  takes a free slab of one shared memory map, sends the task to the slab's
  worker, waits, and copies the slab into the blocks' buffers (read/copy.py,
  without the GIL). Each worker has `threads` slabs: never more tasks than threads.
- With the disk tier on, the worker also writes each block's file (whole
  under its final name or not at all) into room the DiskCache reserved
  (`write_elsewhere`), indexed before the call returns, so the fetcher's
  cache put queues no write.
- The shared memory (/dev/shm, else the temp folder) is unlinked once every
  worker has mapped it: nothing is left behind, whatever ends the daemon.
- Workers start from `transfer.processlane.fork_context`; the store's recipe,
  secret included, reaches a worker over its pipe only.
- A worker that dies takes no more tasks; its calls in flight go to another
  worker, or, with none left, fail with LaneUnavailable (the fetcher then
  reads in-process). Errors keep their class (VersionChanged is ESTALE).

Threads: one collector thread (`mount-lane-collect`) receives every worker's
results and wakes the callers; `read_into` runs on the callers' threads. The
lane's Condition guards the slabs and calls; a worker's send lock its pipe.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from datamount.read import fetchworker
from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.disk import DiskCache
from datamount.read.copy import copy_into
from datamount.read.fetchworker import LaneSetup
from datamount.storage.base import StoreRecipe
from datamount.transfer.processlane import (
    collect,
    fork_context,
    join_workers,
    kill_worker,
    rebuild,
    release_fork_server,
    spawn_worker,
    use_fork_server,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger("datamount.read.lane")

READY_TIMEOUT = 60.0  # seconds a new worker gets to map the slabs and open its store
STOP_TIMEOUT = 10.0  # seconds a worker gets to finish and exit after `close`


class LaneUnavailable(Exception):
    """The lane cannot take (or finish) this call: read in-process instead."""


@dataclass(eq=False)
class _Call:
    event: threading.Event = field(default_factory=threading.Event)
    got: int = 0
    error: tuple[str, str, bool, int | None, int | None] | None = None
    file_sizes: tuple[int, ...] = ()  # of each block file its worker wrote (0: none)
    lost: bool = False  # its worker died before answering (it is sent again)


class _Proc:
    def __init__(self, process: Any, conn: Connection, slabs: list[int]) -> None:
        self.process = process
        self.conn = conn
        self.free = slabs  # its slabs not in use
        self.calls: dict[int, _Call] = {}
        self.send_lock = threading.Lock()  # Connection.send is not thread-safe
        self.open = True  # its pipe still delivers (the collector clears it)
        self.broken = False  # a send to it failed: it takes no more tasks


class MountLane:
    def __init__(
        self,
        recipe: StoreRecipe,
        processes: int,
        threads: int,
        block_size: int,
        disk: DiskCache | None = None,
        *,
        run_blocks: int = 1,
    ) -> None:
        """`run_blocks`: the most blocks of `block_size` bytes one request
        takes (each slab holds that many)."""
        if processes < 1 or threads < 1 or block_size < 1 or run_blocks < 1:
            raise ValueError("need processes, threads, block_size and run_blocks >= 1")
        self.block_size = block_size
        slab_size = self.slab_size = block_size * run_blocks
        self.disk = disk
        self._cond = threading.Condition(threading.Lock())
        self._seq = 0
        self._closed = False
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="datamount-lane-", dir=folder)
        try:
            os.ftruncate(fd, processes * threads * slab_size)
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self._view = memoryview(self._map)
        self.procs: list[_Proc] = []
        ctx = fork_context()
        use_fork_server()
        try:
            root = os.fspath(disk.root) if disk is not None else None
            setup = LaneSetup(recipe, threads, path, slab_size, root)
            for n in range(processes):
                process, conn = spawn_worker(ctx, fetchworker.main, f"datamount-lane-{n}", setup)
                slabs = list(range(n * threads, (n + 1) * threads))
                self.procs.append(_Proc(process, conn, slabs))
            for proc in self.procs:
                try:
                    said = proc.conn.recv() if proc.conn.poll(READY_TIMEOUT) else "no answer"
                except (EOFError, OSError):
                    said = "it ended"
                if said != "ready":
                    raise OSError(f"mount worker process {proc.process.pid} did not start: {said}")
        except BaseException:
            self._stop(kill=True)
            self._view.release()
            self._map.close()
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)  # every worker mapped it (or none will)
        self._collector = threading.Thread(
            target=self._collect, name="mount-lane-collect", daemon=True
        )
        self._collector.start()

    @property
    def pids(self) -> list[int]:
        return [p.process.pid for p in self.procs]

    def takes(self, length: int) -> bool:
        """A request of `length` bytes fits a slab (and a worker runs)."""
        return 0 < length <= self.slab_size and not self._closed

    def read_into(self, obj: ObjectId, offset: int, buffers: list[memoryview]) -> int:
        """`store.read_into_views` of `obj` (pinned to its etag) from `offset`,
        which starts a block, into `buffers`, one per block, in a worker process
        (which also writes their block files, see above): the bytes read.
        LaneUnavailable when no worker can take it (or its worker died)."""
        disk = self.disk
        first = offset // self.block_size
        # (block index, (file name, bytes reserved)) of each block the disk has room for
        rooms: list[tuple[int, tuple[str, int]]] = []
        if disk is not None:
            for i, buffer in enumerate(buffers, first):
                room = disk.write_elsewhere(BlockKey(obj, i), len(buffer))
                if room is not None:
                    rooms.append((i, room))
        files = [(i, room[0]) for i, room in rooms]
        blocks = (obj.store, obj.size, self.block_size, files) if files else None
        call = _Call()
        try:
            return self._call(obj, offset, buffers, blocks, call)
        finally:
            if disk is not None:
                sizes = call.file_sizes or (0,) * len(rooms)  # the worker's, in that order
                for (i, room), size in zip(rooms, sizes, strict=True):
                    disk.written_elsewhere(BlockKey(obj, i), *room, size)

    def _call(
        self,
        obj: ObjectId,
        offset: int,
        buffers: list[memoryview],
        blocks: tuple[str, int, int, list[tuple[int, str]]] | None,
        call: _Call,
    ) -> int:
        length = sum(len(buffer) for buffer in buffers)
        while True:  # a worker that dies with the task: another one reads it
            with self._cond:
                while True:
                    live = [p for p in self.procs if p.open and not p.broken]
                    if self._closed or not live:
                        raise LaneUnavailable
                    proc = max(live, key=lambda p: len(p.free))
                    if proc.free:
                        break
                    self._cond.wait()
                slab = proc.free.pop()
                seq = self._seq = self._seq + 1
                proc.calls[seq] = call
            try:
                try:
                    with proc.send_lock:
                        proc.conn.send((seq, obj.key, offset, length, obj.etag, slab, blocks))
                except (OSError, ValueError):  # it died: the collector reports it
                    with self._cond:
                        proc.broken = True
                    continue
                call.event.wait()
                if call.lost:
                    call.event.clear()
                    call.lost = False
                    continue
                if call.error is not None:
                    raise rebuild(call.error)
                pos, end = slab * self.slab_size, slab * self.slab_size + call.got
                for buffer in buffers:  # a short read fills the first ones only
                    n = min(len(buffer), end - pos)
                    if n <= 0:
                        break
                    copy_into(buffer[:n], self._view[pos : pos + n])
                    pos += n
                return call.got
            finally:
                with self._cond:
                    proc.calls.pop(seq, None)
                    if proc.open and not proc.broken:
                        proc.free.append(slab)
                    self._cond.notify()

    def close(self) -> None:
        """Every worker finishes what it has and exits (killed after
        STOP_TIMEOUT); the callers still waiting get LaneUnavailable."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._stop(kill=False)
        self._collector.join(STOP_TIMEOUT)
        for proc in self.procs:
            proc.conn.close()
        with contextlib.suppress(BufferError):  # a caller still copying keeps it mapped
            self._view.release()
            self._map.close()

    def _stop(self, *, kill: bool) -> None:
        for proc in self.procs:
            if kill:
                kill_worker(proc.process)
            else:
                with contextlib.suppress(OSError, ValueError), proc.send_lock:
                    proc.conn.send(None)
        join_workers([p.process for p in self.procs], None if kill else STOP_TIMEOUT)
        release_fork_server()

    # -- the collector thread -----------------------------------------------

    def _collect(self) -> None:
        collect(self.procs, self._receive)

    def _receive(self, proc: _Proc) -> None:
        try:
            batch: list[fetchworker.Outcome] = proc.conn.recv()
        except (EOFError, OSError):
            self._ended(proc)
            return
        with self._cond:
            calls = [(proc.calls.get(outcome[0]), outcome) for outcome in batch]
        for call, (_, got, error, file_sizes) in calls:
            if call is not None:
                call.got, call.error, call.file_sizes = got, error, file_sizes
                call.event.set()

    def _ended(self, proc: _Proc) -> None:
        with self._cond:
            proc.open = False
            lost = list(proc.calls.values())
            self._cond.notify_all()
        for call in lost:
            call.lost = True
            call.event.set()
        if not self._closed:
            proc.process.join(5.0)
            log.warning(
                "mount worker process %s ended (exit code %s) with %d file(s) in flight: "
                "they and the next go to the other workers, or are read in the daemon",
                proc.process.pid, proc.process.exitcode, len(lost),
            )  # fmt: skip
