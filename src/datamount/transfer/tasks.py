"""Fire-and-forget worker threads and a counting gate for the download's hot
path, on `queue.SimpleQueue` (a C queue: a put or a get holds the GIL for
one C call; a blocked get waits in C).

Why not ThreadPoolExecutor and threading.BoundedSemaphore: the Downloader
(transfer.downloader) submits two tasks per small file (the fetch, the
write-behind) and takes and gives a slot per file. ThreadPoolExecutor makes
a Future (a Condition) per task and takes and releases its idle semaphore
around each; the semaphores are Python Conditions, whose wait makes a lock
and whose notify walks a deque in Python: a visible share of the GIL per
file (docs/design/download.md, "Threads and gates on SimpleQueue").
Nothing here returns a result: the Downloader's tasks report through
the Landing and its error funnel.

Threads: `Tasks.submit` and `Gate.take`/`give` from any thread; `close`
from the owning thread (a second close does nothing).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

log = logging.getLogger(__name__)

_STOP = None  # the sentinel that ends one worker


class Tasks:
    """`workers` threads running submitted calls in order of submission."""

    def __init__(self, workers: int, name: str) -> None:
        if workers < 1:
            raise ValueError(f"Tasks({workers}): needs at least one worker")
        self._queue: SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = SimpleQueue()
        self._lock = threading.Lock()  # submit against close: no task after the sentinels
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on a worker; after `close`, RuntimeError (as an
        executor that was shut down)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit a task after close")
            self._queue.put((fn, args))

    def close(self) -> None:
        """Let every submitted task run, then stop the workers and wait for them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._queue.put(_STOP)
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> Tasks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        get = self._queue.get
        while (task := get()) is not None:
            fn, args = task
            try:
                fn(*args)
            except BaseException:  # the task's own error funnel failed: keep the worker
                log.exception("download task %s failed", getattr(fn, "__name__", fn))
            del task, fn, args  # no reference to the last task's arguments while idle


class Gate:
    """At most `count` holders at a time: `take` waits while all are out,
    and then until half of them are back (at least one).

    Why the half: the Downloader's calling thread takes a slot per file and
    its fetch threads give them back. Woken at every give, it would be woken
    once per file, and a wake-up costs the giver a futex wake while it holds
    the GIL (docs/design/download.md, "Threads and gates on SimpleQueue"). Woken
    at half, it is woken once per `count / 2` files and schedules that many
    at once; the fetch threads still have `count / 2` files queued or in
    flight meanwhile (count is twice the threads).

    Threads: `take` from any thread (takers queue on a lock: one waits at a
    time), `give` from any thread.
    """

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"Gate({count}): needs at least one slot")
        self._free = count
        self._resume = max(1, count // 2)
        self._lock = threading.Lock()  # guards _free and _waiting
        self._takers = threading.Lock()  # one taker waits at a time
        self._wake = threading.Lock()  # held while nobody is to be woken
        self._wake.acquire()
        self._waiting = False

    def take(self) -> None:
        with self._takers:
            with self._lock:
                if self._free > 0:
                    self._free -= 1
                    return
                self._waiting = True
            self._wake.acquire()  # released by the give that brings _free to _resume
            with self._lock:
                self._free -= 1

    def give(self) -> None:
        with self._lock:
            self._free += 1
            if self._waiting and self._free >= self._resume:
                self._waiting = False
                self._wake.release()

    @property
    def available(self) -> int:
        with self._lock:
            return self._free
