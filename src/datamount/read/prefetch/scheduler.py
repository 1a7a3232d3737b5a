"""A two-lane thread pool: demand work always goes before prefetch work.

Workers take the oldest demand job first and a prefetch job only when no
demand job waits (blobfuse2's component/block_cache/threadpool.go priority
lane). A running storage request cannot be pre-empted, so with two or more
workers one of them never starts prefetch work: a demand read finds a free
worker even when every other worker is busy prefetching.

Prefetch work is cheap to drop: its queue is bounded (the oldest job is
dropped when a new one does not fit), a queued job can be cancelled, and a
queued prefetch job can be promoted to the demand lane when a reader starts
waiting for it. A job that never runs has its `on_drop` called exactly once,
outside the pool's lock, so its owner can release what it holds. A ticket
lets go of its job and on_drop once it ran or was dropped (they often refer
back to it: a cycle would keep their data until the cyclic GC). `close()`
drops every queued job, lets running ones finish, and joins the workers.

Threads: `threads` daemon workers; `submit`, `Ticket.cancel` and
`Ticket.promote` from any thread.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger("datamount.prefetch")

# Queued prefetch jobs beyond this are dropped, oldest first. The fetcher's
# memory budget keeps the queue far shorter (budget / block size, 32-64 with
# the defaults); this only bounds a caller without one.
MAX_QUEUED_PREFETCH = 1024


class SchedulerClosed(RuntimeError):
    pass


class _State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    DROPPED = "dropped"


class Ticket:
    """One submitted job. Its state changes under the scheduler's lock."""

    __slots__ = ("_scheduler", "fn", "on_drop", "demand", "state", "ran_as_prefetch")

    def __init__(
        self,
        scheduler: Scheduler,
        fn: Callable[[], None],
        on_drop: Callable[[], None] | None,
        demand: bool,
    ) -> None:
        self._scheduler = scheduler
        self.fn = fn
        self.on_drop = on_drop
        self.demand = demand
        self.state = _State.QUEUED
        self.ran_as_prefetch = False

    def cancel(self) -> bool:
        """Drop the job if it has not started (its on_drop runs); True if dropped."""
        return self._scheduler._cancel(self)

    def promote(self) -> bool:
        """Move a queued prefetch job to the demand lane. False only when the
        job was dropped (it will never run); True when it is queued on the
        demand lane, running or done."""
        return self._scheduler._promote(self)

    @property
    def dropped(self) -> bool:
        return self.state is _State.DROPPED


class Scheduler:
    def __init__(
        self,
        threads: int,
        *,
        max_queued_prefetch: int = MAX_QUEUED_PREFETCH,
        name: str = "datamount-read",
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.threads = threads
        self.max_queued_prefetch = max(1, max_queued_prefetch)
        # One worker is held back for demand reads (see the module docstring).
        self.prefetch_workers = threads - 1 if threads > 1 else 1
        self._cond = threading.Condition(threading.Lock())
        self._demand: deque[Ticket] = deque()
        self._prefetch: deque[Ticket] = deque()
        self._running_prefetch = 0
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for worker in self._workers:
            worker.start()

    def submit(
        self,
        fn: Callable[[], None],
        *,
        demand: bool,
        on_drop: Callable[[], None] | None = None,
    ) -> Ticket:
        """Queue `fn` on the demand or the prefetch lane. Raises SchedulerClosed
        after close(). Submitting a prefetch job to a full queue drops the
        oldest queued prefetch job (its on_drop runs in this thread)."""
        ticket = Ticket(self, fn, on_drop, demand)
        dropped: Ticket | None = None
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the read scheduler is closed")
            if demand:
                self._demand.append(ticket)
            else:
                if len(self._prefetch) >= self.max_queued_prefetch:
                    dropped = self._prefetch.popleft()
                    dropped.state = _State.DROPPED
                self._prefetch.append(ticket)
            self._cond.notify()
        if dropped is not None:
            _run_on_drop(dropped)
        return ticket

    def queued(self) -> tuple[int, int]:
        """(demand, prefetch) jobs waiting for a worker."""
        with self._cond:
            return len(self._demand), len(self._prefetch)

    def close(self, timeout: float | None = 5.0) -> None:
        """Drop every queued job, stop the workers once their current job ends."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            dropped = [*self._demand, *self._prefetch]
            self._demand.clear()
            self._prefetch.clear()
            for ticket in dropped:
                ticket.state = _State.DROPPED
            self._cond.notify_all()
        for ticket in dropped:
            _run_on_drop(ticket)
        current = threading.current_thread()
        for worker in self._workers:
            if worker is not current:
                worker.join(timeout)

    # -- tickets -----------------------------------------------------------

    def _cancel(self, ticket: Ticket) -> bool:
        with self._cond:
            if ticket.state is not _State.QUEUED:
                return False
            (self._demand if ticket.demand else self._prefetch).remove(ticket)
            ticket.state = _State.DROPPED
        _run_on_drop(ticket)
        return True

    def _promote(self, ticket: Ticket) -> bool:
        with self._cond:
            if ticket.state is _State.DROPPED:
                return False
            if ticket.state is _State.QUEUED and not ticket.demand:
                self._prefetch.remove(ticket)
                ticket.demand = True
                self._demand.append(ticket)
                self._cond.notify()
            return True

    # -- workers -----------------------------------------------------------

    def _next(self) -> Ticket | None:
        """The next job for a worker (None: closed). Called with the lock held."""
        while True:
            if self._closed:
                return None
            if self._demand:
                ticket = self._demand.popleft()
                break
            if self._prefetch and self._running_prefetch < self.prefetch_workers:
                ticket = self._prefetch.popleft()
                ticket.ran_as_prefetch = True
                self._running_prefetch += 1
                break
            self._cond.wait()
        ticket.state = _State.RUNNING
        return ticket

    def _work(self) -> None:
        ticket: Ticket | None = None
        freed = False
        while True:
            with self._cond:
                if ticket is not None:  # the job just run: done, and its slot free
                    ticket.state = _State.DONE
                    _release(ticket)
                    freed = ticket.ran_as_prefetch
                    if freed:
                        self._running_prefetch -= 1
                ticket = self._next()
                # This worker takes the next job itself; another one is woken only
                # when a queued prefetch job can use the slot this one freed and
                # this worker went for a demand job (one wake-up, and only then:
                # each wake-up of a waiting thread is GIL-held time, issue 16).
                if freed and ticket is not None and not ticket.ran_as_prefetch and self._prefetch:
                    self._cond.notify()
                freed = False
            if ticket is None:
                return
            fn = ticket.fn
            try:
                fn()
            except BaseException:  # a job owns its errors; never lose a worker
                log.exception("read job failed")
            finally:
                del fn


def _release(ticket: Ticket) -> None:
    """A job that ran or was dropped lets go of its callables: they usually
    reference what refers back to the ticket (a fetcher's flights hold their
    ticket), and a cycle would keep their data alive until the cyclic GC."""
    ticket.fn = _nothing
    ticket.on_drop = None


def _nothing() -> None:
    pass


def _run_on_drop(ticket: Ticket) -> None:
    on_drop = ticket.on_drop
    _release(ticket)
    if on_drop is None:
        return
    try:
        on_drop()
    except BaseException:
        log.exception("dropping a read job failed")
