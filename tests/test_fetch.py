"""BlockFetcher: blocks equal the source slice, one request per block at a
time (single flight), cache first, prefetch held until read within one
memory budget, demand reads ahead of prefetches, errors to every waiter."""

from __future__ import annotations

import contextlib
import errno
import gc
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from datamount.errors import VersionChanged
from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.protocol import NoCache
from datamount.read.fetch import BlockFetcher, _Flight
from datamount.read.prefetch.scheduler import Scheduler, Ticket
from datamount.read.reader import BlockReader
from datamount.read.stats import MountStats
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy
from faults import FaultPlan, FaultyStore, forbidden, throttled
from test_reader_fakes import DictCache, GatedStore, object_id, source, wait_for

pytestmark = pytest.mark.unit

BS = 1000
DATA = source(10 * BS + 37)  # 11 blocks, the last one short


@pytest.fixture
def store() -> GatedStore:
    return GatedStore({"f": DATA})


@pytest.fixture
def obj(store: GatedStore) -> ObjectId:
    return object_id(store, "f")


class Rig:
    def __init__(
        self,
        store: MemoryStore | FaultyStore,
        *,
        threads: int = 4,
        budget: int = 20 * BS,
        run_blocks: int = 4,
    ) -> None:
        self.store = store
        self.cache = DictCache()
        self.stats = MountStats()
        self.scheduler = Scheduler(threads)
        self.fetcher = BlockFetcher(
            store,
            self.cache,
            BS,
            self.scheduler,
            self.stats,
            memory_budget=budget,
            run_bytes=run_blocks * BS,
        )

    def close(self) -> None:
        if isinstance(self.store, GatedStore):
            self.store.open_all()
        self.fetcher.close()
        self.scheduler.close()


@pytest.fixture
def rig(store: GatedStore) -> Iterator[Rig]:
    made = Rig(store)
    yield made
    made.close()


def block(i: int) -> bytes:
    return DATA[i * BS : (i + 1) * BS]


def test_every_block_equals_its_source_slice(rig: Rig, obj: ObjectId) -> None:
    for i in range(11):
        assert rig.fetcher.get(BlockKey(obj, i)) == block(i)
    assert len(block(10)) == 37
    assert rig.store.requests["read"] == 11
    snap = rig.stats.snapshot()
    assert (snap["misses"], snap["blocks_fetched"], snap["bytes_fetched"]) == (11, 11, len(DATA))


def test_a_cached_block_is_not_fetched_again(rig: Rig, obj: ObjectId) -> None:
    key = BlockKey(obj, 3)
    rig.fetcher.get(key)
    assert rig.cache.blocks[key] == block(3)
    rig.fetcher.close()  # drop the fetcher's own hold: the next one must use the cache
    again = BlockFetcher(rig.store, rig.cache, BS, rig.scheduler, rig.stats, memory_budget=0)
    assert again.get(key) == block(3)
    assert rig.store.requests["read"] == 1


def test_single_flight_many_readers_one_request(store: GatedStore, rig: Rig, obj: ObjectId) -> None:
    gate = store.gate("f", 2 * BS)
    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(rig.fetcher.get(BlockKey(obj, 2))))
        for _ in range(16)
    ]
    for t in threads:
        t.start()
    wait_for(lambda: rig.stats.snapshot()["misses"] == 16)  # every reader is waiting
    gate.set()
    for t in threads:
        t.join(10)
    assert results == [block(2)] * 16
    assert store.requests["read"] == 1


def test_prefetched_blocks_are_held_until_read_without_any_cache(obj: ObjectId) -> None:
    store = MemoryStore({"f": DATA})
    stats, scheduler = MountStats(), Scheduler(2)
    fetcher = BlockFetcher(store, NoCache(), BS, scheduler, stats, memory_budget=8 * BS)
    try:
        o = object_id(store, "f")
        keys = [BlockKey(o, i) for i in range(6)]  # prefetch may take 3/4 of the budget
        assert all(fetcher.prefetch(k) for k in keys)
        wait_for(lambda: stats.snapshot()["prefetched_blocks"] == 6)
        assert fetcher.prefetch(BlockKey(o, 6)) is False  # prefetch share spent
        assert [fetcher.get(k) for k in keys] == [block(i) for i in range(6)]
        assert [fetcher.get(k) for k in keys] == [block(i) for i in range(6)]  # read twice
        assert store.requests["read"] == 6
        snap = stats.snapshot()
        assert (snap["prefetch_used"], snap["misses"]) == (6, 0)
        # Read blocks give their room back to new prefetches, least recent first.
        assert all(fetcher.prefetch(BlockKey(o, i)) for i in range(6, 11))
        wait_for(lambda: stats.snapshot()["prefetched_blocks"] == 11)
        assert fetcher.memory_in_use() <= 8 * BS
        assert fetcher.get(keys[-1]) == block(5)  # the most recently read one is still held
        assert store.requests["read"] == 11
    finally:
        fetcher.close()
        scheduler.close()


def test_no_budget_means_no_prefetch_but_demand_still_works(obj: ObjectId) -> None:
    store = MemoryStore({"f": DATA})
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(store, NoCache(), BS, scheduler, MountStats(), memory_budget=0)
    try:
        key = BlockKey(object_id(store, "f"), 5)
        assert fetcher.prefetch(key) is False
        assert fetcher.get(key) == block(5)
        assert fetcher.memory_in_use() == 0
    finally:
        fetcher.close()
        scheduler.close()


def test_prefetch_skips_cached_held_and_in_flight_blocks(rig: Rig, obj: ObjectId) -> None:
    key = BlockKey(obj, 1)
    rig.cache.put(BlockKey(obj, 0), block(0))
    assert rig.fetcher.prefetch(BlockKey(obj, 0))  # cached: nothing to do
    assert rig.fetcher.prefetch(key)
    assert rig.fetcher.prefetch(key)
    wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 1)
    assert rig.fetcher.prefetch(key)  # held
    assert rig.fetcher.prefetch(BlockKey(obj, 99))  # past EOF: nothing to do
    assert rig.store.requests["read"] == 1


def test_a_demand_read_is_served_while_prefetches_are_stuck(
    store: GatedStore, obj: ObjectId
) -> None:
    rig = Rig(store, threads=2)
    try:
        store.gate_all = threading.Event()
        store.gate("f", 9 * BS).set()  # only the demand block's read may proceed
        for i in range(8):
            assert rig.fetcher.prefetch(BlockKey(obj, i))
        wait_for(lambda: len(store.started) == 1)  # the prefetch worker is stuck
        assert rig.fetcher.get(BlockKey(obj, 9)) == block(9)
        assert rig.scheduler.queued() == (0, 7)  # the prefetches are still waiting
    finally:
        rig.close()


def test_a_reader_waiting_for_a_queued_prefetch_promotes_it(
    store: GatedStore, obj: ObjectId
) -> None:
    rig = Rig(store, threads=2)
    try:
        stuck = store.gate("f", 0)
        assert rig.fetcher.prefetch(BlockKey(obj, 0))
        wait_for(lambda: len(store.started) == 1)
        assert rig.fetcher.prefetch(BlockKey(obj, 1))  # queued behind the stuck one
        assert rig.fetcher.get(BlockKey(obj, 1)) == block(1)  # promoted, not waiting
        assert rig.stats.snapshot()["prefetch_used"] == 1
        stuck.set()
        assert rig.fetcher.get(BlockKey(obj, 0)) == block(0)
        assert store.requests["read"] == 2
    finally:
        rig.close()


def test_a_version_change_is_estale_for_every_waiter(
    store: GatedStore, rig: Rig, obj: ObjectId
) -> None:
    gate = store.gate("f", 4 * BS)
    errors: list[OSError] = []

    def read() -> None:
        try:
            rig.fetcher.get(BlockKey(obj, 4))
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: rig.stats.snapshot()["misses"] == 3)
    store.put("f", b"new" * 5000)
    gate.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 3
    assert all(isinstance(e, VersionChanged) and e.errno == errno.ESTALE for e in errors)
    assert BlockKey(obj, 4) not in rig.cache.blocks
    assert rig.fetcher.memory_in_use() == 0


def test_transient_faults_are_retried_by_the_store(obj: ObjectId) -> None:
    plan = FaultPlan().fail("read", times=3, error=throttled())
    store = FaultyStore(MemoryStore({"f": DATA}), plan, retry=RetryPolicy(5, sleep=lambda _s: None))
    rig = Rig(store)
    try:
        key = BlockKey(object_id(store, "f"), 6)
        assert rig.fetcher.get(key) == block(6)
        assert store.attempts["read"] == 4
    finally:
        rig.close()


def test_a_failure_is_not_remembered(obj: ObjectId) -> None:
    plan = FaultPlan().fail("read", times=1, error=forbidden())
    store = FaultyStore(MemoryStore({"f": DATA}), plan, retry=RetryPolicy(5))
    rig = Rig(store)
    try:
        key = BlockKey(object_id(store, "f"), 0)
        with pytest.raises(PermissionError) as caught:
            rig.fetcher.get(key)
        assert caught.value.errno == errno.EACCES
        assert rig.fetcher.get(key) == block(0)
    finally:
        rig.close()


def test_cancel_drops_queued_prefetches_and_close_counts_waste(
    store: GatedStore, obj: ObjectId
) -> None:
    rig = Rig(store, threads=2)
    try:
        stuck = store.gate("f", 0)
        keys = [BlockKey(obj, i) for i in range(6)]
        assert all(rig.fetcher.prefetch(k) for k in keys)
        wait_for(lambda: len(store.started) == 1)
        rig.fetcher.cancel(keys)
        assert rig.scheduler.queued() == (0, 0)
        stuck.set()
        wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 1)
        assert rig.fetcher.memory_in_use() == BS  # only the block that was running
        rig.fetcher.close()
        snap = rig.stats.snapshot()
        assert (snap["prefetch_wasted"], snap["prefetch_used"]) == (1, 0)
        assert store.requests["read"] == 1
    finally:
        rig.close()


def test_close_fails_queued_demand_reads_with_eio(store: GatedStore, obj: ObjectId) -> None:
    rig = Rig(store, threads=1)
    try:
        store.gate("f", 0)
        first = rig.fetcher.start(BlockKey(obj, 0))
        wait_for(lambda: len(store.started) == 1)
        queued = rig.fetcher.start(BlockKey(obj, 1))
        rig.fetcher.close()
        with pytest.raises(OSError) as caught:
            queued.result(5)
        assert caught.value.errno == errno.EIO
        with pytest.raises(OSError):
            rig.fetcher.get(BlockKey(obj, 2))
        store.open_all()
        assert first.result(5) == block(0)  # a running fetch completes
    finally:
        rig.close()


def test_unread_prefetches_expire_and_count_as_wasted(obj: ObjectId) -> None:
    store = MemoryStore({"f": DATA})
    now = [0.0]
    stats, scheduler = MountStats(), Scheduler(2)
    fetcher = BlockFetcher(
        store, NoCache(), BS, scheduler, stats, memory_budget=4 * BS, clock=lambda: now[0]
    )
    try:
        o = object_id(store, "f")
        assert all(fetcher.prefetch(BlockKey(o, i)) for i in range(3))
        wait_for(lambda: stats.snapshot()["prefetched_blocks"] == 3)
        assert not fetcher.prefetch(BlockKey(o, 3))  # all held, still fresh
        now[0] += 31
        assert fetcher.prefetch(BlockKey(o, 3))  # the oldest gave way
        assert stats.snapshot()["prefetch_wasted"] == 1
        wait_for(lambda: stats.snapshot()["prefetched_blocks"] == 4)
        fetcher.close()
        assert stats.snapshot()["prefetch_wasted"] == 4  # and 1, 2, 3: never read
    finally:
        fetcher.close()
        scheduler.close()


# -- prefetches of consecutive blocks share requests ---------------------------------


def test_consecutive_prefetches_share_requests_of_run_blocks(rig: Rig, obj: ObjectId) -> None:
    rig.cache.put(BlockKey(obj, 5), block(5))  # a cached block splits a run
    keys = [BlockKey(obj, i) for i in range(1, 11)]
    assert rig.fetcher.prefetch_many(keys) == 10
    wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 9)
    # 1-4 (a full run), 6-9, 10: three requests for nine blocks
    snap = rig.stats.snapshot()
    assert (snap["fetch_requests"], snap["blocks_fetched"]) == (3, 9)
    assert [rig.fetcher.get(k) for k in keys] == [block(i) for i in range(1, 11)]
    assert rig.store.requests["read"] == 3
    assert rig.stats.snapshot()["prefetch_used"] == 9
    assert rig.fetcher.prefetch_many(keys) == 10  # all held or cached: nothing to do
    assert rig.store.requests["read"] == 3


def test_a_run_is_admitted_whole_or_not_at_all(obj: ObjectId) -> None:
    """Budget 8 blocks: prefetch may take 6, i.e. one run of 4 and not a second."""
    store = GatedStore({"f": DATA})
    rig = Rig(store, budget=8 * BS)
    try:
        keys = [BlockKey(obj, i) for i in range(8)]
        assert rig.fetcher.prefetch_many(keys) == 4
        wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 4)
        assert rig.fetcher.memory_in_use() == 4 * BS
        assert rig.fetcher.prefetch_many(keys[4:]) == 0  # 2 blocks of room: not a run of 4
        rig.fetcher.get(keys[0])  # read: its room goes back to prefetch
        assert rig.fetcher.prefetch_many(keys[4:]) == 0  # 3 blocks of room
        rig.fetcher.get(keys[1])
        assert rig.fetcher.prefetch_many(keys[4:]) == 4
        wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 8)
        assert rig.store.requests["read"] == 2
    finally:
        rig.close()


def test_a_refused_run_offered_again_costs_no_lookup_until_its_room_is_there(
    obj: ObjectId,
) -> None:
    """A budget-bound reader offers the run that did not fit again at every
    read: without room for that run the offer is refused after one lookup (not
    one per key), with the same answer and counters; once reads free the room,
    the run goes out."""
    store = GatedStore({"f": DATA})
    rig = Rig(store, budget=8 * BS)  # a prefetch share of 6 blocks, runs of 4
    try:
        keys = [BlockKey(obj, i) for i in range(11)]
        assert rig.fetcher.prefetch_many(keys[:4]) == 4
        wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 4)
        rig.cache.counts.clear()
        assert rig.fetcher.prefetch_many(keys[4:]) == 0  # 2 blocks of room: not a run of 4
        assert rig.cache.counts["contains"] == 7  # the full walk: every key looked up
        rig.fetcher.get(keys[0])  # 3 blocks of room
        before, rig.cache.counts["contains"] = rig.stats.snapshot(), 0
        assert rig.fetcher.prefetch_many(keys[4:]) == 0
        assert rig.fetcher.prefetch_many(keys[4:]) == 0
        assert rig.cache.counts["contains"] == 2  # one lookup an offer
        after = rig.stats.snapshot()
        assert after["prefetch_offers"] - before["prefetch_offers"] == 2
        assert after["prefetch_window_full"] - before["prefetch_window_full"] == 2
        assert rig.fetcher.prefetch_many(keys[5:]) == 0  # another offer: the full walk
        assert rig.cache.counts["contains"] == 2 + 6
        rig.fetcher.get(keys[1])  # 4 blocks of room: the run fits
        assert rig.fetcher.prefetch_many(keys[4:]) == 4
        wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 8)
        assert rig.store.requests["read"] == 2
    finally:
        rig.close()


def test_a_reader_of_one_block_of_a_queued_run_promotes_the_run(
    store: GatedStore, obj: ObjectId
) -> None:
    rig = Rig(store, threads=2)
    try:
        stuck = store.gate("f", 0)
        assert rig.fetcher.prefetch(BlockKey(obj, 0))  # the one prefetch worker is stuck
        wait_for(lambda: len(store.started) == 1)
        assert rig.fetcher.prefetch_many([BlockKey(obj, i) for i in range(1, 5)]) == 4
        assert rig.scheduler.queued() == (0, 1)  # one job for four blocks
        assert rig.fetcher.get(BlockKey(obj, 3)) == block(3)  # on the demand lane now
        assert [rig.fetcher.get(BlockKey(obj, i)) for i in (1, 2, 4)] == [
            block(1),
            block(2),
            block(4),
        ]
        stuck.set()
        assert rig.fetcher.get(BlockKey(obj, 0)) == block(0)
        assert rig.store.requests["read"] == 2
    finally:
        rig.close()


def test_cancel_keeps_a_run_someone_waits_for(store: GatedStore, obj: ObjectId) -> None:
    rig = Rig(store, threads=2)
    try:
        stuck = store.gate("f", 0)
        assert rig.fetcher.prefetch(BlockKey(obj, 0))
        wait_for(lambda: len(store.started) == 1)
        keys = [BlockKey(obj, i) for i in range(1, 9)]  # runs 1-4 and 5-8
        assert rig.fetcher.prefetch_many(keys) == 8
        waiter = rig.fetcher.start(BlockKey(obj, 2), demand=False)  # waits, on the prefetch lane
        rig.fetcher.cancel(keys)
        assert rig.scheduler.queued() == (0, 1)  # 5-8 dropped, 1-4 kept for the waiter
        stuck.set()
        assert waiter.result(5) == block(2)
        assert rig.store.requests["read"] == 2
    finally:
        rig.close()


def test_a_failed_run_fails_every_waiter(obj: ObjectId) -> None:
    store = GatedStore({"f": DATA})
    rig = Rig(store, threads=2)
    try:
        gate = store.gate("f", BS)
        assert rig.fetcher.prefetch_many([BlockKey(obj, i) for i in range(1, 5)]) == 4
        waiters = [rig.fetcher.start(BlockKey(obj, i)) for i in range(1, 5)]
        store.put("f", b"changed")  # the run's request now fails its If-Match
        gate.set()
        for waiter in waiters:
            with pytest.raises(VersionChanged):
                waiter.result(5)
        assert rig.fetcher.memory_in_use() == 0
    finally:
        rig.close()


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[list[object]]:
    """The cyclic GC off; yields the list that, once the block exits, holds
    what only a cyclic collection would have freed (gc.DEBUG_SAVEALL)."""
    garbage: list[object] = []
    gc.collect()
    enabled, flags = gc.isenabled(), gc.get_debug()
    gc.disable()
    try:
        yield garbage
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        gc.collect()
        garbage.extend(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(flags)
        if enabled:
            gc.enable()


def test_done_fetches_are_freed_without_the_cyclic_gc(store: GatedStore, obj: ObjectId) -> None:
    """Flights, tickets and their blocks are freed by reference counting once
    a fetch is done, failed or dropped: a cycle (flight -> ticket -> job ->
    flight) kept every fetched block until the cyclic GC ran, 360 MiB of a
    cold 1 GiB read."""
    with no_cyclic_gc() as garbage:
        rig = Rig(store, threads=2)
        try:
            keys = [BlockKey(obj, i) for i in range(11)]
            assert rig.fetcher.prefetch_many(keys[:8]) == 8  # two runs of 4
            assert [rig.fetcher.get(k) for k in keys] == [block(i) for i in range(11)]
        finally:
            rig.close()
        other = GatedStore({"f": DATA})
        rig = Rig(other, threads=2)
        try:
            stuck = other.gate("f", 0)
            assert rig.fetcher.prefetch_many([BlockKey(obj, i) for i in range(10)]) == 10
            wait_for(lambda: len(other.started) == 1)
            rig.fetcher.cancel([BlockKey(obj, i) for i in range(10)])  # runs 4-7, 8-9 dropped
            stuck.set()
            wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 4)
        finally:
            rig.close()
    leaks = [type(o).__name__ for o in garbage if isinstance(o, _Flight | Ticket)]
    assert leaks == []


def test_a_cold_sequential_read_holds_at_most_its_budget_plus_runs_in_flight() -> None:
    """Bytes, not timing: reading a 16 MiB object through the reader (NoCache,
    a budget of 8 blocks, runs of 4) never has more than ~3 budgets of Python
    memory allocated, with the cyclic GC off (the budget, the prefetch share
    fetched into run buffers, and each run's per-block copies)."""
    bs, blocks = 256 << 10, 64
    store = MemoryStore({"f": source(bs * blocks)})
    o = object_id(store, "f")
    budget = 8 * bs
    stats, scheduler = MountStats(), Scheduler(4)
    fetcher = BlockFetcher(store, NoCache(), bs, scheduler, stats, memory_budget=budget)
    reader = BlockReader(fetcher, bs, 8)
    with no_cyclic_gc():
        tracemalloc.start()
        try:
            handle = reader.open(o)
            for offset in range(0, bs * blocks, 128 << 10):
                assert len(handle.read(offset, 128 << 10)) == 128 << 10
            handle.close()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            reader.close()
            scheduler.close()
    assert stats.snapshot()["blocks_fetched"] == blocks
    assert stats.snapshot()["fetch_requests"] < blocks  # runs were shared
    assert peak <= 3 * budget, f"peak {peak / (1 << 20):.1f} MiB for a {budget >> 20} MiB budget"


def test_an_offer_to_a_spent_prefetch_share_takes_only_what_needs_no_fetch(
    obj: ObjectId,
) -> None:
    """The budget-bound reader's usual offer: refused at once, the same answer and
    counters as the full walk (cached and held blocks from the first still count)."""
    store = GatedStore({"f": DATA})
    rig = Rig(store, budget=8 * BS)
    try:
        keys = [BlockKey(obj, i) for i in range(11)]
        assert rig.fetcher.prefetch_many(keys[:4]) == 4
        assert rig.fetcher.prefetch_many(keys[4:6]) == 2  # the share (6 blocks) is spent
        wait_for(lambda: rig.stats.snapshot()["prefetched_blocks"] == 6)
        rig.cache.put(keys[6], block(6))
        before = rig.stats.snapshot()
        # held 4, 5 and cached 6 are taken care of; 7 would need a fetch
        assert rig.fetcher.prefetch_many(keys[4:10]) == 3
        assert rig.fetcher.prefetch_many(keys[4:7]) == 3  # nothing to fetch: not full
        after = rig.stats.snapshot()
        assert after["prefetch_offers"] - before["prefetch_offers"] == 2
        assert after["prefetch_window_full"] - before["prefetch_window_full"] == 1
        assert rig.store.requests["read"] == 2
    finally:
        rig.close()


@pytest.mark.parametrize("handles", [1, 8])
def test_interleaved_streams_share_the_prefetch_budget(handles: int) -> None:
    """8 sequential readers, each over its own eighth, their reads interleaved
    (a model loader's threads, on one handle or on 8): each stream keeps its
    share of the prefetch budget ahead, so after the first reads of each part
    every block comes from a prefetch, none from a one-block demand fetch. (Each
    stream's window free to grow to the whole budget, the first streams to grow
    take it all and the others read on demand: 150 demand blocks in 193
    requests here, against 15 in 104.)"""
    bs, parts, per_part = 64 << 10, 8, 32
    data = source(bs * parts * per_part)
    store = MemoryStore({"f": data})
    o = object_id(store, "f")
    stats, scheduler = MountStats(), Scheduler(4)
    # a prefetch share of 24 blocks (3 per stream), runs of 4 blocks
    fetcher = BlockFetcher(
        store, NoCache(), bs, scheduler, stats, memory_budget=32 * bs, run_bytes=4 * bs
    )
    reader = BlockReader(fetcher, bs, 32)
    try:
        opened = [reader.open(o) for _ in range(handles)]
        step = bs // 2
        cursors = [p * per_part * bs for p in range(parts)]
        while cursors[0] < per_part * bs:
            for p in range(parts):
                handle = opened[p % handles]
                assert handle.read(cursors[p], step) == data[cursors[p] : cursors[p] + step]
                cursors[p] += step
            assert fetcher.census.streams <= parts
        for handle in opened:
            handle.close()
        assert fetcher.census.streams == 0
    finally:
        reader.close()
        scheduler.close()
    got = stats.snapshot()
    demand = got["blocks_fetched"] - got["prefetched_blocks"]
    assert demand <= 2 * parts, got
