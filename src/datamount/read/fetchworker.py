"""A worker process of the mount's fetch lane (read/fetchlane.py): it makes the
block fetcher's requests (a whole small file, or a run of blocks of a bigger
one), each into the slab of shared memory the parent named, through a store
of its own (its own connection pool, its own GIL), writes their block files
and reports how many bytes it read. It holds no cache and no open file.

Protocol over its one Connection (pickled; secrets cross only here):
  parent -> worker  first a `LaneSetup`; then one task tuple per request
                    (seq, key, offset, length, etag, slab, blocks), `blocks`
                    (store identity, object size, block size, [(block index,
                    block file name)...]) when block files are to be
                    written into `disk_root` (blocks of the request; one not
                    listed is not written);
                    None: finish the tasks received, report them, exit.
  worker -> parent  "ready" once the shared memory is mapped and its store
                    open (else one line saying why, and it exits); then lists of
                    (seq, bytes read, portable error or None, the size of each
                    listed block's file or 0 where none was written).
A closed pipe (the parent died) ends the worker at once.

Threads: `threads` fetch threads (the parent never has more of its slabs
out), one reporter thread (sends what finished, in batches), the main
thread receives tasks.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.blockfile import BlockFiles, encode_header
from datamount.transfer.worker import portable

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

Outcome = tuple[int, int, "tuple[str, str, bool, int | None, int | None] | None", tuple[int, ...]]


@dataclass(frozen=True)
class LaneSetup:
    recipe: Any  # a store recipe: `.open(pool_size)` gives a ReadableStore
    threads: int
    shm_path: str  # the parent's shared slabs (unlinked once every worker mapped it)
    slab_size: int
    disk_root: str | None  # the disk tier's folder (read/cache/disk.py), None: off


def _fetch(
    store: Any, files: BlockFiles | None, view: memoryview, slab_size: int, task: tuple[Any, ...]
) -> Outcome:
    seq, key, offset, length, etag, slab, blocks = task
    try:
        start = slab * slab_size
        got = store.read_into(key, offset, view[start : start + length], etag=etag)
    except BaseException as exc:  # reported: the parent raises it for the reader
        return (seq, 0, portable(exc), ())
    if blocks is None:
        return (seq, got, None, ())
    store_id, obj_size, block_size, listed = blocks
    obj = ObjectId(store_id, key, etag, obj_size)
    sizes = [0] * len(listed)
    if files is not None and got == length:
        for n, (index, name) in enumerate(listed):
            lo = index * block_size
            data = view[start + lo - offset : start + min(lo + block_size, obj_size) - offset]
            with contextlib.suppress(OSError):  # not on disk: the parent's put queues it
                sizes[n] = files.write(name, encode_header(BlockKey(obj, index), data), data)
    return (seq, got, None, tuple(sizes))


def _report(conn: Connection, results: queue.SimpleQueue[Outcome | None]) -> None:
    while True:
        first = results.get()
        if first is None:
            return
        batch = [first]
        with contextlib.suppress(queue.Empty):
            while len(batch) < 64:
                item = results.get_nowait()
                if item is None:
                    results.put(None)
                    break
                batch.append(item)
        try:
            conn.send(batch)
        except (OSError, ValueError):
            os._exit(1)


def main(conn: Connection) -> None:
    """The worker's entry point (started by read/fetchlane.py, 'forkserver' or
    'spawn'): the first message is its LaneSetup. Ctrl-C reaches the whole
    process group: the parent decides (it stops the workers), not the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        setup: LaneSetup = conn.recv()
        fd = os.open(setup.shm_path, os.O_RDWR)
    except (EOFError, OSError):
        return
    try:
        view = memoryview(mmap.mmap(fd, 0))
    finally:
        os.close(fd)
    try:
        store = setup.recipe.open(setup.threads)
        files = BlockFiles(Path(setup.disk_root)) if setup.disk_root is not None else None
    except Exception as exc:  # the parent says it in one line and reads in the daemon
        with contextlib.suppress(OSError, ValueError):
            conn.send(f"{type(exc).__name__}: {exc}")
        return
    results: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
    conn.send("ready")
    reporter = threading.Thread(target=_report, args=(conn, results), name="report", daemon=True)
    reporter.start()
    with ThreadPoolExecutor(setup.threads, thread_name_prefix="fetch") as pool:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                os._exit(1)  # the parent is gone: nothing to report to
            if task is None:
                break
            future = pool.submit(_fetch, store, files, view, setup.slab_size, task)
            future.add_done_callback(lambda f: results.put(f.result()))
    results.put(None)
    reporter.join()
    store.close()
    if files is not None:
        files.close()
