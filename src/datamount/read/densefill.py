"""Dense fill: when random reads of a file become dense, the rest of the
file is fetched into the block cache in the background.

Every random read of a block-mode handle is reported with `on_random_read`;
one DensePolicy per object version (prefetch/dense.py), shared by every
handle on it, decides when and how much of the file to fill, and grants a
random miss a part read (read/parts.py). A file is a candidate only if it
takes at most FIT_SHARE of the cache (RAM tier + disk tier limit,
`capacity()`): a fill must neither prune its own first blocks nor flush the
whole cache.

A fill goes through `BlockFetcher.fill`: the same single flight, cache and
PREFETCH area as prefetch, in runs of up to RUN_BYTES on the prefetch lane
(demand reads go first; a demand read of a queued fill block promotes it),
as many runs at once as the budget admits. Filled blocks go to the cache and
give their budget back at once; with the disk tier on, a fill waits while
the disk queue has no room for its blocks in flight, so none is dropped on
the way to disk. Blocks handed out are fetched even after their handles
close; a file's fill stops at a failed fetch (ESTALE), a stall or close.
Counters (MountStats): dense_fills, filled_blocks.

Threads: one worker ("datamount-fill") schedules the fills, in the order
the policies answered; `on_random_read` takes a lock briefly and only
queues; a done fetch wakes the worker (a Future callback).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait

from datamount.budget import DISK_QUEUE
from datamount.read.blocks import BlockData, BlockKey, ObjectId, block_count
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.dense import DensePolicy
from datamount.read.stats import MountStats

log = logging.getLogger("datamount.dense")

# A file is filled only if it takes at most this share of the cache (above).
FIT_SHARE = 0.5
# Object versions whose random reads are tracked at once (least recently
# read dropped first): a policy is ~100 bytes plus a byte per block.
MAX_TRACKED = 256
# A fill that cannot start a run (budget or disk queue full, nothing of its
# own in flight to wait for) looks again after this long, and gives up after
# STALLED_SECONDS of that (other readers' unread prefetches hold the budget
# for up to 30 s, cache/held.py's HOLD_SECONDS).
POLL_SECONDS = 0.02
STALLED_SECONDS = 60.0


class DenseFill:
    def __init__(
        self, fetcher: BlockFetcher, stats: MountStats, capacity: Callable[[], int]
    ) -> None:
        """`capacity()`: the bytes the cache can hold (RAM tier + disk tier)."""
        self.fetcher = fetcher
        self.stats = stats
        self._capacity = capacity
        self._policies: OrderedDict[ObjectId, DensePolicy] = OrderedDict()
        self._jobs: deque[tuple[ObjectId, list[int]]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._busy = False
        self._dead: set[ObjectId] = set()  # fills stopped (a fetch failed, stalled)
        self._thread = threading.Thread(target=self._work, name="datamount-fill", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------

    def on_random_read(
        self, obj: ObjectId, first: int, last: int, want: Mapping[int, int] | None = None
    ) -> set[int]:
        """A random read of blocks [first, last] of `obj`; `want` maps the
        blocks it misses to the bytes a part read of each would fetch
        (read/parts.py). Answers the blocks of `want` it may read in part;
        the others it fetches whole."""
        with self._cond:
            if self._closed:
                return set()
            policy = self._policies.get(obj)
            if policy is None:
                policy = self._new_policy(obj)
                self._policies[obj] = policy
                while len(self._policies) > MAX_TRACKED:
                    self._policies.popitem(last=False)
            else:
                self._policies.move_to_end(obj)
            started = policy.started
            granted, rest = policy.on_read_parts(first, last, want or {})
            if not rest:
                return granted
            self._jobs.append((obj, rest))
            self._cond.notify_all()
        if started:
            return granted
        self.stats.add(dense_fills=1)
        log.debug(
            "%s: random reads touched %d of %d blocks: filling %d of the others",
            obj.key, policy.touched, policy.block_count, len(rest),
        )  # fmt: skip
        return granted

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Until every fill decided so far is fetched or given up (tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy and not self._jobs, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()
        self._thread.join(5.0)

    def _new_policy(self, obj: ObjectId) -> DensePolicy:
        try:
            fits = obj.size <= FIT_SHARE * self._capacity()
        except OSError as exc:  # no statvfs of the cache: no fill
            log.debug("cache capacity: %s", exc)
            fits = False
        count = block_count(obj.size, self.fetcher.block_size)
        return DensePolicy(
            count, fits=fits, run=self.fetcher.run_blocks, block_size=self.fetcher.block_size
        )

    def _wake(self, _: object = None) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the worker --------------------------------------------------------

    def _work(self) -> None:
        """Schedules the fill's runs as the budget and the disk queue allow,
        job after job: the runs of one job stay in flight while the next
        job's are scheduled (the policy hands out a few runs at a time)."""
        pending: dict[Future[BlockData], ObjectId] = {}
        job: tuple[ObjectId, list[BlockKey]] | None = None
        pos = 0
        stalled_since: float | None = None
        while True:
            for future in [f for f in pending if f.done()]:
                obj = pending.pop(future)
                if future.exception() is not None:
                    self._stop(obj)
            with self._cond:
                if self._closed:
                    return
                if job is not None and self._stopped(job[0]):
                    job = None
                if job is None and self._jobs:
                    obj, blocks = self._jobs.popleft()
                    job, pos = (obj, [BlockKey(obj, i) for i in blocks]), 0
                self._busy = job is not None or bool(pending)
                if not self._busy:
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: self._closed or bool(self._jobs))
                    continue
                if job is None:  # only runs in flight: until one ends or a job comes
                    self._cond.wait_for(
                        lambda: self._closed or bool(self._jobs) or any(f.done() for f in pending),
                        1.0,
                    )
                    continue
            try:
                pos, stalled_since = self._schedule(job, pos, pending, stalled_since)
            except Exception:  # never lose the worker: a fill only saves requests
                log.exception("dense fill of %s failed", job[0].key)
                self._stop(job[0])
                pos = len(job[1])
            if pos >= len(job[1]):
                job = None

    def _schedule(
        self,
        job: tuple[ObjectId, list[BlockKey]],
        pos: int,
        pending: dict[Future[BlockData], ObjectId],
        stalled_since: float | None,
    ) -> tuple[int, float | None]:
        """Start runs of `job` from `pos` while there is room; wait for room
        when there is none. The new position and since when it stalled."""
        obj, keys = job
        chunk = keys[pos : pos + self.fetcher.run_blocks]
        taken = 0
        if self._disk_room(len(pending) + len(chunk)):
            taken, futures = self.fetcher.fill(chunk)
            for future in futures:
                pending[future] = obj
                future.add_done_callback(self._wake)
        if taken:
            return pos + taken, None
        if not pending:  # the budget is held by others: look again soon
            now = time.monotonic()
            stalled_since = now if stalled_since is None else stalled_since
            if now - stalled_since > STALLED_SECONDS:
                log.debug(
                    "dense fill of %s given up: no room for %.0f s", obj.key, now - stalled_since
                )
                self._stop(obj)
                return len(keys), None
            with self._cond:
                self._cond.wait_for(lambda: self._closed, POLL_SECONDS)
            return pos, stalled_since
        wait(list(pending), timeout=1.0, return_when=FIRST_COMPLETED)
        return pos, stalled_since

    def _stop(self, obj: ObjectId) -> None:
        """No more fill of `obj` (a fetch failed or it stalled)."""
        log.debug("dense fill of %s stopped", obj.key)
        with self._cond:
            policy = self._policies.get(obj)
            if policy is not None:
                policy.stop()
            self._jobs = deque(j for j in self._jobs if j[0] != obj)
            self._dead.add(obj)
            while len(self._dead) > MAX_TRACKED:
                self._dead.pop()

    def _stopped(self, obj: ObjectId) -> bool:
        return obj in self._dead  # lock held

    def _disk_room(self, blocks: int) -> bool:
        """The disk queue has room for `blocks` more blocks (or there is no
        disk tier): the fill's blocks in flight must all find a place."""
        budget = self.fetcher.budget
        if not budget.has(DISK_QUEUE) or budget.limit(DISK_QUEUE) == 0:
            return True
        queued = budget.in_use(DISK_QUEUE)
        # An empty queue takes a run even when the queue is smaller than one.
        return queued == 0 or queued + blocks * self.fetcher.block_size <= budget.limit(DISK_QUEUE)
