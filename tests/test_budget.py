"""The one memory budget: the limiter itself with real threads (demand never
waits, background waits or is refused, every path gives its bytes back), and
the read path, the disk queue and the write-back of a mount drawing from the
same object."""

from __future__ import annotations

import errno
import logging
import threading
import time
from pathlib import Path

import pytest

from datamount.budget import DEMAND, DISK_QUEUE, PREFETCH, UPLOAD, MemoryBudget
from datamount.mount.stack import build_reader, memory_budget
from datamount.read.blocks import BlockKey
from datamount.read.cache.disk import DiskCache
from datamount.read.cache.protocol import NoCache
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.policy import REORDER_SLACK, reorder_slack
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.stats import MountStats
from datamount.settings import Settings
from datamount.storage.memory import MemoryStore
from datamount.write.writeback import WriteBack, WriteBackOptions, upload_budget
from faults import FaultPlan, FaultyStore, forbidden
from test_reader_fakes import GatedStore, object_id, source, wait_for

pytestmark = pytest.mark.unit

MIB = 1 << 20
BS = 1000


def run(fn) -> threading.Thread:  # noqa: ANN001
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


# -- the limiter -------------------------------------------------------------------


def test_areas_have_their_limits_and_the_total_is_their_sum() -> None:
    budget = MemoryBudget({PREFETCH: 100, DISK_QUEUE: 50, DEMAND: 0})
    assert budget.total == 150
    assert budget.try_reserve(PREFETCH, 100)
    assert not budget.try_reserve(PREFETCH, 1)  # its own limit, though the total has room
    assert budget.try_reserve(DISK_QUEUE, 50)
    assert not budget.try_reserve(DEMAND, 1)  # limit 0: only `reserve` serves it
    budget.release(PREFETCH, 40)
    assert budget.in_use() == 110 and budget.in_use(PREFETCH) == 60
    budget.release(PREFETCH, 60)
    budget.release(DISK_QUEUE, 50)
    assert budget.in_use() == 0 and budget.peak == 150


def test_demand_never_waits_even_when_prefetch_holds_everything() -> None:
    budget = MemoryBudget({PREFETCH: 100, UPLOAD: 100, DEMAND: 0})
    assert budget.try_reserve(PREFETCH, 100)
    assert budget.acquire(UPLOAD, 100)  # the whole budget is held by background work
    done = threading.Event()

    def demand() -> None:
        budget.reserve(DEMAND, 150)
        done.set()

    run(demand)
    assert done.wait(2)  # past the total: a demand read is never refused or queued
    assert budget.in_use() == 350 and budget.peak == 350
    # Demand holds 150 of the 200: background work gets only what is left...
    budget.release(PREFETCH, 100)
    budget.release(UPLOAD, 100)
    assert not budget.try_reserve(PREFETCH, 100)
    assert budget.try_reserve(PREFETCH, 50)
    budget.release(PREFETCH, 50)
    # ...and a blocked acquire resumes once demand gives its bytes back.
    got = threading.Event()

    def upload() -> None:
        budget.acquire(UPLOAD, 100)
        got.set()

    assert budget.acquire(UPLOAD, 100, timeout=0.05) is False
    waiter = run(upload)
    assert not got.wait(0.2)
    budget.release(DEMAND, 150)
    assert got.wait(2)
    waiter.join(2)
    budget.release(UPLOAD, 100)
    assert budget.in_use() == 0


def test_blocking_acquire_waits_for_a_release_in_another_thread() -> None:
    budget = MemoryBudget({UPLOAD: 10})
    budget.acquire(UPLOAD, 8)
    order: list[str] = []

    def second() -> None:
        with budget.held(UPLOAD, 5):
            order.append("second")

    thread = run(second)
    time.sleep(0.1)
    order.append("first releases")
    budget.release(UPLOAD, 8)
    thread.join(2)
    assert order == ["first releases", "second"]
    assert budget.in_use() == 0


def test_held_releases_on_an_error_and_impossible_requests_fail_at_once() -> None:
    budget = MemoryBudget({UPLOAD: 10})
    with pytest.raises(RuntimeError), budget.held(UPLOAD, 10):
        raise RuntimeError("upload failed")
    assert budget.in_use() == 0
    with pytest.raises(ValueError, match="can never fit"):
        budget.acquire(UPLOAD, 11)  # would wait forever
    with pytest.raises(ValueError, match="releasing 1 bytes"):
        budget.release(UPLOAD, 1)  # a double release is a bug, not a silent gift
    with pytest.raises(KeyError):
        budget.reserve("elsewhere", 1)
    with pytest.raises(ValueError, match="negative"):
        MemoryBudget({UPLOAD: -1})


def test_many_threads_never_exceed_the_limits_and_leave_nothing_behind() -> None:
    budget = MemoryBudget({PREFETCH: 1000, UPLOAD: 500, DEMAND: 0})
    over: list[int] = []

    def worker(seed: int) -> None:
        for i in range(500):
            if (seed + i) % 3 == 0:
                with budget.held(UPLOAD, 100):
                    if budget.in_use(UPLOAD) > 500:
                        over.append(budget.in_use(UPLOAD))
            elif budget.try_reserve(PREFETCH, 70):
                if budget.in_use(PREFETCH) > 1000:
                    over.append(budget.in_use(PREFETCH))
                budget.release(PREFETCH, 70)

    threads = [run(lambda s=s: worker(s)) for s in range(8)]
    for thread in threads:
        thread.join(30)
    assert not over
    assert budget.in_use() == 0 and 0 < budget.peak <= budget.total


def test_describe_names_the_total_and_what_draws_from_it() -> None:
    budget = MemoryBudget({PREFETCH: 64 * MIB, DEMAND: 0, DISK_QUEUE: 512 * MIB, UPLOAD: 0})
    assert budget.describe() == (
        "576 MiB (prefetch and held blocks 64 MiB, disk-write queue 512 MiB); "
        "demand reads never wait for it"
    )


# -- the fetcher draws from it ---------------------------------------------------------


def shared() -> MemoryBudget:
    return MemoryBudget({PREFETCH: 8 * BS, DEMAND: 0, UPLOAD: 4 * BS})


def test_a_demand_read_is_served_while_prefetch_holds_the_whole_budget() -> None:
    store = GatedStore({"f": source(40 * BS)})
    obj = object_id(store, "f")
    store.gate_all = threading.Event()  # every prefetch request hangs in storage
    budget = shared()
    scheduler = Scheduler(4)
    fetcher = BlockFetcher(store, NoCache(), BS, scheduler, MountStats(), budget=budget)
    try:
        assert fetcher.prefetch_many([BlockKey(obj, i) for i in range(6)]) == 6  # 3/4 of 8
        assert budget.acquire(UPLOAD, 4 * BS, timeout=1)  # and uploads hold the rest
        assert not fetcher.prefetch(BlockKey(obj, 6))
        budget.reserve(DEMAND, 2 * BS)  # other demand reads take the last of it
        assert budget.in_use() == budget.total
        store.gates[(obj.key, 20 * BS)] = threading.Event()
        store.gates[(obj.key, 20 * BS)].set()  # the demand read's own request is free
        assert fetcher.get(BlockKey(obj, 20)) == source(40 * BS)[20 * BS : 21 * BS]
        # It went past the total while fetched; its bytes are back, and with
        # no room left the block is not held as recently read.
        assert budget.peak == budget.total + BS and budget.in_use() == budget.total
        budget.release(UPLOAD, 4 * BS)
        budget.release(DEMAND, 2 * BS)
    finally:
        store.open_all()
        fetcher.close()
        scheduler.close()
    assert budget.in_use() == 0


def test_the_fetcher_charges_prefetch_held_and_demand_bytes_and_releases_them() -> None:
    store = GatedStore({"f": source(20 * BS)})
    obj = object_id(store, "f")
    budget = shared()
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(store, NoCache(), BS, scheduler, MountStats(), budget=budget)
    try:
        gate = store.gate(obj.key, 10 * BS)
        demand = fetcher.start(BlockKey(obj, 10))
        wait_for(lambda: (obj.key, 10 * BS) in store.started)
        assert budget.in_use(DEMAND) == BS  # on its way to the reader
        gate.set()
        demand.result(5)
        wait_for(lambda: budget.in_use(DEMAND) == 0)
        assert budget.in_use(PREFETCH) == fetcher.memory_in_use() == BS  # held: recently read
        assert fetcher.prefetch_many([BlockKey(obj, i) for i in range(4)]) == 4
        wait_for(lambda: fetcher.memory_in_use() == 5 * BS)  # unread prefetched + recent
        assert budget.in_use(PREFETCH) == 5 * BS
        # Others hold the rest of the total: prefetch is refused though its area has room.
        budget.reserve(DEMAND, budget.total - budget.in_use())
        assert fetcher.prefetch_many([BlockKey(obj, 5)]) == 0
        budget.release(DEMAND, budget.in_use(DEMAND))
    finally:
        fetcher.close()
        scheduler.close()
    assert budget.in_use() == 0  # held blocks went back at close


def test_failed_fetches_give_their_bytes_back() -> None:
    inner = MemoryStore({"f": source(20 * BS)})
    store = FaultyStore(inner, FaultPlan().fail("read", times=None, error=forbidden()))
    obj = object_id(inner, "f")
    budget = shared()
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(store, NoCache(), BS, scheduler, MountStats(), budget=budget)
    try:
        assert fetcher.prefetch_many([BlockKey(obj, i) for i in range(4)]) == 4
        with pytest.raises(OSError) as failed:
            fetcher.get(BlockKey(obj, 10))
        assert failed.value.errno == errno.EACCES
        wait_for(lambda: budget.in_use() == 0)
    finally:
        fetcher.close()
        scheduler.close()
    assert budget.in_use() == 0


def test_closing_with_prefetches_queued_and_running_leaks_nothing() -> None:
    store = GatedStore({"f": source(40 * BS)})
    obj = object_id(store, "f")
    store.gate_all = threading.Event()
    budget = MemoryBudget({PREFETCH: 40 * BS, DEMAND: 0})
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(
        store, NoCache(), BS, scheduler, MountStats(), budget=budget, run_bytes=BS
    )
    assert fetcher.prefetch_many([BlockKey(obj, i) for i in range(20)]) == 20
    wait_for(lambda: len(store.started) >= 1)
    assert budget.in_use(PREFETCH) == 20 * BS
    fetcher.close()
    store.open_all()  # the running request ends after close
    scheduler.close()
    assert budget.in_use() == 0


# -- the disk queue and the write-back draw from it --------------------------------------


def disk(tmp_path: Path, budget: MemoryBudget) -> DiskCache:
    return DiskCache(
        tmp_path / "blocks",
        limit=lambda free, used: 1 << 30,
        prune_threshold=1.0,
        prune_target=0.7,
        write_threads=1,
        budget=budget,
    )


def test_the_disk_queue_draws_from_the_budget_and_gives_back_at_write_and_close(
    tmp_path: Path,
) -> None:
    obj = object_id(MemoryStore({"f": source(10 * BS)}), "f")
    budget = MemoryBudget({DISK_QUEUE: 4 * BS, DEMAND: 0})
    cache = disk(tmp_path, budget)
    try:
        cache.put(BlockKey(obj, 0), source(BS))
        assert cache.flush(5)
        assert budget.in_use() == 0 and budget.peak == BS  # written: given back
        budget.reserve(DEMAND, 4 * BS)  # demand reads hold the whole total
        stats_before = cache.queued_bytes
        cache.put(BlockKey(obj, 1), source(BS))  # refused: skipped, never waits
        assert cache.queued_bytes == stats_before == 0
        budget.release(DEMAND, 4 * BS)
    finally:
        cache.close()
    assert budget.in_use() == 0


def test_writeback_uploads_draw_from_a_given_budget_and_release_on_failure(
    tmp_path: Path,
) -> None:
    options = WriteBackOptions(block_size=1024, threads=2)
    assert upload_budget(options) == 2 * 2 * 1024
    budget = MemoryBudget({UPLOAD: upload_budget(options), DEMAND: 0})
    inner = MemoryStore()
    store = FaultyStore(inner, FaultPlan().fail(times=1, error=forbidden()))
    writeback = WriteBack(store, tmp_path / "s", options, budget=budget)
    try:
        assert writeback.budget is budget
        staged = writeback.create("out/a")
        writeback.write(staged, b"x" * 3000, 0)
        with pytest.raises(OSError) as failed:
            writeback.upload(staged)
        assert failed.value.errno == errno.EIO
        assert budget.in_use() == 0 and budget.peak == 3 * 1024  # 3 blocks, then back
        assert writeback.upload(staged)  # the second attempt goes through
        assert inner.data("out/a") == b"x" * 3000
        assert budget.in_use() == 0
    finally:
        writeback.close()
    with pytest.raises(ValueError, match="upload area"):
        WriteBack(MemoryStore(), tmp_path / "t", options, budget=MemoryBudget({PREFETCH: 1}))


# -- one object for the whole mount --------------------------------------------------------


def test_a_mount_builds_one_budget_that_every_consumer_shares(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings.from_env({}, cpu_count=2, cache_dir=tmp_path / "cache")
    store = MemoryStore({"f": source(4 * MIB)})
    with caplog.at_level(logging.INFO, logger="datamount.readstack"):
        reader = build_reader(settings, store, MountStats(), cache_key="memory://f", uploads=True)
    try:
        fetcher = reader.reader.fetcher  # type: ignore[attr-defined]
        tiered = fetcher.cache
        writeback = WriteBack(
            store,
            tmp_path / "staging",
            WriteBackOptions(threads=settings.downloader_threads),
            budget=reader.budget,
        )
        assert fetcher.budget is tiered.disk.budget is writeback.budget is reader.budget
        # The total is the sum of the bounds each part had on its own.
        assert reader.budget.limits == {
            PREFETCH: 32 * 2 * MIB,
            DEMAND: 0,
            DISK_QUEUE: 512 * MIB,
            UPLOAD: 2 * 8 * 8 * MIB,
        }
        assert reader.budget.total == 704 * MIB
        # Really drawn: a read's prefetch lands in the PREFETCH area, its blocks in the queue.
        handle = reader.open(object_id(store, "f"))
        assert handle.read(0, 4096) == source(4 * MIB)[:4096]
        assert reader.budget.peak > 0
        assert reader.budget.in_use(PREFETCH) == fetcher.memory_in_use() > 0
        writeback.close()
        handle.close()
    finally:
        reader.close()
    assert reader.budget.in_use(PREFETCH) == 0 and reader.budget.in_use(DISK_QUEUE) == 0
    lines = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert len(lines) == 1
    assert "memory budget 704 MiB (prefetch and held blocks 64 MiB" in lines[0]


def test_a_read_only_mount_budget_has_no_upload_area_and_no_disk_queue_when_off() -> None:
    settings = Settings.from_env({"DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false"}, cpu_count=2)
    budget = memory_budget(settings, uploads=False)
    assert budget.limits[UPLOAD] == 0 and budget.limits[DISK_QUEUE] == 0
    assert budget.total == 64 * MIB


# -- constants in blocks come from the block size ----------------------------------------


@pytest.mark.parametrize(
    ("block_size", "slack"),
    [(2 * MIB, 4), (4 * MIB, 2), (3 * MIB, 3), (8 * MIB, 1), (16 * MIB, 1), (64 << 10, 4)],
)
def test_the_reorder_slack_is_8_mib_of_blocks(block_size: int, slack: int) -> None:
    assert reorder_slack(block_size) == slack
    assert reorder_slack(2 * MIB) == REORDER_SLACK
