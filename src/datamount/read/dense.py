"""Dense fill: when random reads of a file become dense, the rest of the
file is fetched into the block cache in the background.

Every random read of a block-mode handle (one its PrefetchPolicy does not
count as a sequential stream) is reported with `on_random_read`; one
DensePolicy per object version (prefetch/dense.py), shared by every handle
on it, decides when the rest of the file is due. A file is a candidate only
if it takes at most FIT_SHARE of the cache (RAM tier + disk tier limit, from
`capacity()`): a fill must neither prune its own first blocks nor flush the
whole cache.

A fill goes through `BlockFetcher.fill`: the same single flight, cache and
PREFETCH area of the memory budget as prefetch, in runs of up to RUN_BYTES
(parallel ranged GETs on the scheduler's prefetch lane, so demand reads go
first, and a demand read of a block a fill has queued promotes it). Filled
blocks go to the cache and give their budget back at once; with the disk
tier on, a fill waits while the disk queue has no room for its blocks in
flight, so none is dropped on the way to the disk (and fetched again). The
fill goes on after its handles close (the cost was decided at the
threshold) and stops at a version change (ESTALE) or at close. Counters
(MountStats): dense_fills, filled_blocks.

Threads: one worker ("datamount-fill") runs the fills, one file at a time;
`on_random_read` takes a lock briefly and only queues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait

from datamount.budget import DISK_QUEUE
from datamount.read.blocks import BlockKey, ObjectId, block_count
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
        self._thread = threading.Thread(target=self._work, name="datamount-fill", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------

    def on_random_read(self, obj: ObjectId, first: int, last: int) -> None:
        """A random read of blocks [first, last] of `obj`."""
        with self._cond:
            if self._closed:
                return
            policy = self._policies.get(obj)
            if policy is None:
                policy = self._new_policy(obj)
                self._policies[obj] = policy
                while len(self._policies) > MAX_TRACKED:
                    self._policies.popitem(last=False)
            else:
                self._policies.move_to_end(obj)
            rest = policy.on_read(first, last)
            if not rest:
                return
            self._jobs.append((obj, rest))
            self._cond.notify_all()
        self.stats.add(dense_fills=1)
        log.debug(
            "%s: random reads touched %d of %d blocks: filling the other %d",
            obj.key, policy.touched, policy.block_count, len(rest),
        )  # fmt: skip

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
        return DensePolicy(block_count(obj.size, self.fetcher.block_size), fits=fits)

    # -- the worker --------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._closed or bool(self._jobs))
                if self._closed:
                    return
                obj, blocks = self._jobs.popleft()
                self._busy = True
            try:
                self._fill(obj, blocks)
            except Exception:  # never lose the worker: a fill only saves requests
                log.exception("dense fill of %s failed", obj.key)

    def _fill(self, obj: ObjectId, blocks: list[int]) -> None:
        keys = [BlockKey(obj, i) for i in blocks]
        run = self.fetcher.run_blocks
        pending: set[Future[bytes]] = set()
        pos = 0
        stalled_since: float | None = None
        while pos < len(keys) and not self._closed:
            chunk = keys[pos : pos + run]
            taken = 0
            if self._disk_room(len(pending) + len(chunk)):
                taken, futures = self.fetcher.fill(chunk)
                pending.update(futures)
                pos += taken
            if taken:
                stalled_since = None
            if taken == len(chunk):
                continue
            if not pending:  # the budget is held by others: look again soon
                now = time.monotonic()
                stalled_since = now if stalled_since is None else stalled_since
                if now - stalled_since > STALLED_SECONDS:
                    log.debug(
                        "dense fill of %s given up: no room for %.0f s",
                        obj.key,
                        now - stalled_since,
                    )
                    return
                with self._cond:
                    self._cond.wait_for(lambda: self._closed, POLL_SECONDS)
                continue
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            if any(f.exception() is not None for f in done):
                log.debug("dense fill of %s stopped: a fetch failed", obj.key)
                return
        wait(pending)

    def _disk_room(self, blocks: int) -> bool:
        """The disk queue has room for `blocks` more blocks (or there is no
        disk tier): the fill's blocks in flight must all find a place."""
        budget = self.fetcher.budget
        if not budget.has(DISK_QUEUE) or budget.limit(DISK_QUEUE) == 0:
            return True
        queued = budget.in_use(DISK_QUEUE)
        # An empty queue takes a run even when the queue is smaller than one.
        return queued == 0 or queued + blocks * self.fetcher.block_size <= budget.limit(DISK_QUEUE)
