"""The BlockFetcher: one block of one pinned object version, from the cache or
from storage, fetched at most once at a time.

- `start(key)` / `get(key)`: a held or cached block is returned at once;
  otherwise one `store.read_into_views` of the block's span, pinned to the
  etag (a changed object raises VersionChanged: ESTALE), runs on the
  scheduler's demand lane, and the block is put in the cache. Each block is
  read into a buffer of its own (`block_buffer`), kept as a read-only view.
- Single flight: a Future per BlockKey in flight; every concurrent reader of
  the block waits for the same request. A reader that starts waiting for a
  queued prefetch promotes it to the demand lane.
- `prefetch(key)` / `prefetch_many(keys)`: non-blocking; schedules the blocks
  not cached, held or in flight on the prefetch lane, as far as the memory
  budget allows (a prefix of `keys`). Consecutive blocks go out together, up
  to RUN_BYTES per ranged GET, each block keeping its own flight. `fill(keys)`
  is the same for a dense fill (read/densefill.py), whose blocks go to the
  cache and give their budget back instead of being held until read.
- Memory: prefetches queued or in flight, prefetched blocks not yet read and
  recently read blocks are held in the PREFETCH area (cache/held.py); a
  demand fetch takes the DEMAND area, which never fails or waits
  (docs/design/memory.md).
- Counters (MountStats): misses, blocks_fetched, bytes_fetched, fetch_requests,
  prefetched_blocks, prefetch_used, prefetch_wasted (with cache/held.py).

Threads: any thread calls in; fetches run on the scheduler's workers. One
lock guards the maps and the hold; cache and store calls run outside it.
Lock order: fetcher, then scheduler (the scheduler calls back only without
its lock) or budget (it calls nothing).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

from datamount.budget import DEMAND, PREFETCH, MemoryBudget
from datamount.errors import StorageError
from datamount.read.blocks import BlockData, BlockKey, block_span
from datamount.read.cache.held import HOLD_SECONDS, HeldBlocks
from datamount.read.cache.protocol import BlockCache
from datamount.read.copy import empty
from datamount.read.fetchlane import LaneUnavailable, MountLane
from datamount.read.prefetch.scheduler import Scheduler, SchedulerClosed, Ticket
from datamount.read.prefetch.streams import StreamCensus
from datamount.read.stats import MountStats
from datamount.storage.base import ObjectStore

log = logging.getLogger("datamount.fetch")

# Consecutive prefetched blocks go out as one ranged GET of up to this many
# bytes; the downloader uses 8 MiB ranges too.
# Why 8 MiB: docs/design/ro_mount.md ("Run size").
RUN_BYTES = 8 * 1024 * 1024


def block_buffer(size: int) -> memoryview:
    """A fetched block's own buffer, filled straight from the socket and then
    kept, read-only, by the caches (no copy out of a shared request buffer).
    Uninitialised memory (malloc without a memset), so a freed
    block's heap memory is reused as it is and fresh pages are first touched
    inside the socket read, which runs without the GIL; page-aligned from
    64 KiB, so the disk tier writes it with O_DIRECT without a copy (read/copy.py
    `empty`). Why not a zeroed buffer or an mmap per block:
    docs/design/ro_mount.md ("Fetch buffers")."""
    return empty(size)  # a writable memoryview, format "B"


@dataclass(eq=False)
class _Flight:
    key: BlockKey
    size: int
    prefetch: bool  # started by prefetch(): holds `size` bytes of the PREFETCH area
    wanted: bool  # a reader waits for it
    urgent: bool  # a demand reader waits for it: it belongs on the demand lane
    fill: bool = False  # a dense fill's (fill()): into the cache only, never held unread
    future: Future[BlockData] = field(default_factory=Future)
    ticket: Ticket | None = None
    run: list[_Flight] = field(default_factory=list)  # the flights sharing its request
    demand_bytes: int = 0  # bytes it holds of the DEMAND area (a demand fetch)


def _done(data: BlockData) -> Future[BlockData]:
    future: Future[BlockData] = Future()
    future.set_result(data)
    return future


class BlockFetcher:
    def __init__(
        self,
        store: ObjectStore,
        cache: BlockCache,
        block_size: int,
        scheduler: Scheduler,
        stats: MountStats,
        *,
        memory_budget: int | None = None,
        budget: MemoryBudget | None = None,
        run_bytes: int = RUN_BYTES,
        hold_seconds: float = HOLD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        lane: MountLane | None = None,
    ) -> None:
        """Either `budget`, the mount's shared MemoryBudget (its PREFETCH
        limit is this fetcher's bound), or `memory_budget` bytes in a budget
        of its own. `lane`: worker processes that make the fetches
        (read/fetchlane.py; without one, or when it cannot, they are made here)."""
        if (budget is None) == (memory_budget is None):
            raise ValueError("give exactly one of memory_budget and budget")
        if budget is None:
            budget = MemoryBudget({PREFETCH: memory_budget or 0, DEMAND: 0})
        elif not (budget.has(PREFETCH) and budget.has(DEMAND)):
            raise ValueError("the memory budget has no prefetch or demand area")
        memory_budget = budget.limit(PREFETCH)
        if block_size < 1 or memory_budget < 0:
            raise ValueError("block_size must be >= 1 and memory_budget >= 0")
        self.store = store
        self.lane = lane
        self.cache = cache
        self.block_size = block_size
        self.scheduler = scheduler
        self.stats = stats
        self.memory_budget = memory_budget
        self.budget = budget
        self._lock = threading.Lock()  # guards _flights and _held
        self._flights: dict[BlockKey, _Flight] = {}
        self._held = HeldBlocks(budget, stats, hold_seconds=hold_seconds, clock=clock)
        # Blocks per prefetch request; a run never needs more than the
        # prefetch share, or a small budget would never admit a whole one.
        self.run_blocks = max(1, min(run_bytes, self._held.prefetch_cap) // block_size)
        # The sequential streams of every handle, each kept to its share of the
        # prefetch budget (read/prefetch/streams.py).
        self.census = StreamCensus(max(1, self._held.prefetch_cap // block_size))
        # The run the last offer could not admit: (its first key, its bytes).
        self._refused_run: tuple[BlockKey | None, int] = (None, 0)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    # -- reads -------------------------------------------------------------

    def get(self, key: BlockKey, *, demand: bool = True) -> BlockData:
        """The block's bytes (short only for the last block of the object).
        `demand=False` fetches on the prefetch lane (background callers)."""
        return self.start(key, demand=demand).result()

    def start(self, key: BlockKey, *, demand: bool = True) -> Future[BlockData]:
        """Like `get`, without waiting: a Future of the block's bytes (already
        done on a hit). Only a cache lookup runs in the calling thread."""
        with self._lock:
            if self._closed:
                raise OSError(errno.EIO, "the block fetcher is closed")
            data = self._held.take(key)
            if data is not None:
                return _done(data)
            flight = self._flights.get(key)
            if flight is not None:
                # A done flight (its block on the way into the cache) is a hit.
                self._join(flight, demand=demand and not flight.future.done())
                return flight.future
            # Registered before the cache lookup: concurrent readers join it.
            flight = _Flight(key, self._span(key)[1], prefetch=False, wanted=True, urgent=demand)
            self._flights[key] = flight
        data = self._cache_get(key)
        if data is not None:
            with self._lock:
                self._forget(flight)
                self._held.note_read(key)
            flight.future.set_result(data)
            return flight.future
        self.stats.add(misses=1)
        with self._lock:
            if self._flights.get(key) is flight:  # it is fetched: its bytes are on the way
                flight.demand_bytes = flight.size
                self.budget.reserve(DEMAND, flight.size)
        self._submit([flight], demand=demand)
        return flight.future

    def has(self, key: BlockKey) -> bool:
        """The block is held, cached or on its way to a reader: a read of it
        waits for no dense fill's run (read/parts.py reads a part of a block
        it has not, rather than wait for a fill's 8 MiB GET)."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                return not flight.fill or flight.urgent or flight.future.done()
            if key in self._held:
                return True
        return self._cache_contains(key)

    def prefetch(self, key: BlockKey) -> bool:
        """Fetch `key` in the background unless it is held, cached or in
        flight. False when the prefetch share of the memory budget is spent
        (or the fetcher is closed), so the caller can offer it again later;
        never blocks on I/O."""
        return self.prefetch_many([key]) == 1

    def prefetch_many(self, keys: list[BlockKey]) -> int:
        """`prefetch` of each key in order, consecutive blocks of one object
        in shared requests of up to `run_blocks` blocks. Returns how many
        keys, from the first, are taken care of (held, cached, in flight or
        now scheduled); the others did not fit the prefetch share and may be
        offered again later. A run is admitted whole or not at all, so a
        tight budget delays requests rather than splitting them into single
        blocks."""
        return self._schedule(keys, fill=False)[0]

    def fill(self, keys: list[BlockKey]) -> tuple[int, list[Future[BlockData]]]:
        """`prefetch_many` for a dense fill (read/densefill.py): the blocks go
        to the cache and give their bytes of the budget back once there,
        instead of being held until read. Returns how many keys are taken
        care of and the futures of the fetches it started."""
        taken, flights = self._schedule(keys, fill=True)
        return taken, [f.future for f in flights]

    def _schedule(self, keys: list[BlockKey], *, fill: bool) -> tuple[int, list[_Flight]]:
        with self._lock:
            if self._closed:
                return 0, []
            # A budget-bound reader offers again, from the run that did not fit,
            # at nearly every read (docs/design/ro_mount.md, "Fetch buffers"):
            # until the share has room for that run, no per-key work (a run that
            # became shorter meanwhile waits for that room too).
            first, need = self._refused_run
            shut = self._held.shut(need if keys and keys[0] == first else 1)
        if shut:  # the usual offer of a budget-bound reader
            return self._refused(keys), []
        with self._lock:
            todo = [not self._known(k) for k in keys]
        # Cache lookups outside the lock (the disk tier's may stat a file).
        todo = [t and not self._cache_contains(k) for t, k in zip(todo, keys, strict=True)]
        runs: list[list[_Flight]] = []
        taken = 0
        full = False
        with self._lock:
            self._refused_run = (None, 0)
            while taken < len(keys) and not self._closed:
                if not todo[taken] or self._known(keys[taken]):
                    taken += 1
                    continue
                run = [keys[taken]]
                for key in keys[taken + 1 : taken + self.run_blocks]:
                    prev = run[-1]
                    if (key.obj, key.index) != (prev.obj, prev.index + 1):
                        break
                    if not todo[taken + len(run)] or self._known(key):
                        break
                    run.append(key)
                sizes = [self._span(k)[1] for k in run]
                if not self._held.admit(sum(sizes)):
                    full = True
                    self._refused_run = (keys[taken], sum(sizes))
                    break
                flights = [
                    _Flight(k, n, prefetch=True, wanted=False, urgent=False, fill=fill)
                    for k, n in zip(run, sizes, strict=True)
                ]
                for flight in flights:
                    self._flights[flight.key] = flight
                runs.append(flights)
                taken += len(run)
        for flights in runs:
            self._submit(flights, demand=False)
        self.stats.add(prefetch_offers=1, prefetch_window_full=int(full))
        return taken, [f for flights in runs for f in flights]

    def _refused(self, keys: list[BlockKey]) -> int:
        """`_schedule`'s answer when the prefetch share admits nothing: the keys,
        from the first, that are taken care of already (held, in flight, past the
        end or cached), up to the first that would need a fetch."""
        taken = 0
        for key in keys:
            with self._lock:
                known = self._known(key)
            if not known and not self._cache_contains(key):
                break
            taken += 1
        self.stats.add(prefetch_offers=1, prefetch_window_full=int(taken < len(keys)))
        return taken

    def _known(self, key: BlockKey) -> bool:
        """Held, in flight, or empty (past the end): nothing to fetch. Lock held."""
        return key in self._flights or key in self._held or self._span(key)[1] == 0

    def cancel(self, keys: list[BlockKey]) -> None:
        """A reader lost interest in these prefetches (its handle closed):
        drop the queued ones nobody waits for, and let their held blocks be
        evicted first. Another handle on the same version re-fetches on demand."""
        tickets: dict[int, Ticket] = {}
        with self._lock:
            for key in keys:
                flight = self._flights.get(key)
                if flight is None or flight.ticket is None:
                    continue
                # A shared request is dropped only when nobody waits for any of its blocks.
                if all(f.prefetch and not f.wanted for f in flight.run):
                    tickets[id(flight.ticket)] = flight.ticket
                self._held.abandon(key)
        for ticket in tickets.values():
            ticket.cancel()

    def taken(self, keys: list[BlockKey]) -> None:
        """These blocks are read from the disk tier, not through the fetcher
        (the native FUSE loop serves a file the disk tier holds whole): their
        held prefetches count as used and make way for the next ones now,
        not HOLD_SECONDS later."""
        with self._lock:
            for key in keys:
                self._held.take(key)

    def memory_in_use(self) -> int:
        """Bytes of the budget taken: prefetches in flight plus held blocks."""
        with self._lock:
            return self._held.in_use()

    def close(self) -> None:
        """Drop queued fetches (their readers get EIO) and held blocks; count
        prefetched blocks never read as wasted. Running fetches finish."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tickets = [f.ticket for f in self._flights.values() if f.ticket is not None]
            self._held.clear()
        for ticket in tickets:
            ticket.cancel()

    # -- fetching (workers) -----------------------------------------------

    def _submit(self, flights: list[_Flight], *, demand: bool) -> bool:
        """Queue one request for `flights` (consecutive blocks of one object)."""
        try:
            ticket = self.scheduler.submit(
                partial(self._fetch, flights),
                demand=demand,
                on_drop=partial(self._dropped, flights),
            )
        except SchedulerClosed:
            for flight in flights:
                self._fail(flight, OSError(errno.EIO, "the read scheduler is closed"))
            return False
        with self._lock:
            for flight in flights:
                if self._flights.get(flight.key) is flight:  # not already done
                    flight.ticket = ticket
                    flight.run = flights
            promote = not demand and any(f.urgent for f in flights)
        if promote:  # a demand reader joined before the ticket existed
            ticket.promote()
        return True

    def _fetch(self, flights: list[_Flight]) -> None:
        first = flights[0].key
        offset = self._span(first)[0]
        length = sum(f.size for f in flights)
        try:
            buffers = [block_buffer(flight.size) for flight in flights]
            started = time.monotonic()
            got = self._read(first, offset, length, buffers) if length else 0
            took = time.monotonic() - started
            if got != length:
                raise StorageError(
                    f"{first.obj.key}: short read of blocks {first.index}-"
                    f"{first.index + len(flights) - 1} ({got} of {length} bytes)"
                )
            datas = [buffer.toreadonly() for buffer in buffers]
        except BaseException as exc:
            for flight in flights:
                self._fail(flight, exc)
            return
        if self.stats.on_read is not None:
            self.stats.on_read(took)
        self.stats.add(
            fetch_us=int(took * 1e6),
            fetch_requests=1,
            blocks_fetched=len(flights),
            bytes_fetched=length,
            prefetched_blocks=sum(f.prefetch for f in flights),
            filled_blocks=sum(f.fill for f in flights),
        )
        for flight, data in zip(flights, datas, strict=True):
            self._complete(flight, data)

    def _read(self, first: BlockKey, offset: int, length: int, buffers: list[memoryview]) -> int:
        """The request of a run: in the lane's worker processes where there
        are any (or here, if the lane cannot take it)."""
        lane = self.lane
        if lane is not None and lane.takes(length):
            with contextlib.suppress(LaneUnavailable):
                return lane.read_into(first.obj, offset, buffers)
        return self.store.read_into_views(first.obj.key, offset, buffers, etag=first.obj.etag)

    def _complete(self, flight: _Flight, data: BlockData) -> None:
        key = flight.key
        # Readers first; the flight stays registered until the block is in the
        # cache, so a reader arriving meanwhile joins this done future.
        flight.future.set_result(data)
        try:
            self.cache.put(key, data)
        except Exception:
            log.exception("cache put of %s block %d failed", key.obj.key, key.index)
        with self._lock:
            # An unread prefetch keeps its bytes of the budget: they now hold the block.
            keep = flight.prefetch and not flight.wanted and not flight.fill and not self._closed
            if not self._forget(flight, release=not keep) or self._closed:
                return  # closed: the hold is cleared and takes nothing more
            if flight.wanted:
                self._held.hold_recent(key, data)
            elif keep:
                self._held.keep_unread(key, data)  # len(data) == flight.size

    def _dropped(self, flights: list[_Flight]) -> None:
        """The scheduler dropped the job: release its blocks, or re-queue
        each block a reader waits for on the demand lane (never dropped but
        at close)."""
        for flight in flights:
            with self._lock:
                resubmit = flight.wanted and not self._closed
                if not resubmit:
                    self._forget(flight)
            if resubmit:
                self._submit([flight], demand=True)
            elif not flight.future.done():
                flight.future.set_exception(OSError(errno.EIO, "block fetch cancelled"))

    def _fail(self, flight: _Flight, exc: BaseException) -> None:
        with self._lock:
            self._forget(flight)
        if not flight.future.done():
            flight.future.set_exception(exc)

    # -- bookkeeping (lock held) ------------------------------------------

    def _join(self, flight: _Flight, *, demand: bool) -> None:
        if demand:
            self.stats.add(misses=1)
            flight.urgent = True
            if flight.ticket is not None:
                flight.ticket.promote()  # if it was just dropped, _dropped re-queues it
        if not flight.wanted:
            flight.wanted = True
            if flight.prefetch:
                self.stats.add(prefetch_used=1)

    def _forget(self, flight: _Flight, *, release: bool = True) -> bool:
        """Unregister the flight and release its budget (a prefetch's bytes
        stay taken with `release=False`); False if it was not registered."""
        if self._flights.get(flight.key) is not flight:
            return False
        del self._flights[flight.key]
        # No reference cycles (flight -> ticket -> job -> flights -> flight, and
        # flight -> run -> flight): a done flight must be freed by its reference
        # count, or its future's block waits for the cyclic GC
        # (docs/design/memory.md, "Reference cycles").
        flight.ticket = None
        flight.run = []
        if flight.demand_bytes:
            self.budget.release(DEMAND, flight.demand_bytes)
            flight.demand_bytes = 0
        if flight.prefetch and release:
            self._held.unadmit(flight.size)
        return True

    # -- helpers -----------------------------------------------------------

    def _span(self, key: BlockKey) -> tuple[int, int]:
        return block_span(key.index, key.obj.size, self.block_size)

    def _cache_get(self, key: BlockKey) -> BlockData | None:
        try:
            return self.cache.get(key)
        except Exception:  # the protocol says a tier error is a miss; make sure
            log.exception("cache get of %s block %d failed", key.obj.key, key.index)
            return None

    def _cache_contains(self, key: BlockKey) -> bool:
        try:
            return self.cache.contains(key)
        except Exception:
            log.exception("cache lookup of %s block %d failed", key.obj.key, key.index)
            return False
