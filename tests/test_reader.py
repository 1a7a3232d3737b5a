"""BlockReader: every read equals the source slice (random reads around block
boundaries, many threads, many files); sequential readers are served by
prefetch, random readers pay only for what they touch; demand ahead of
prefetch; a changed object is ESTALE, never mixed bytes; transient faults
retried."""

from __future__ import annotations

import errno
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamount.read.blocks import ObjectId
from datamount.read.reader import DirectReader, Reader, ReadHandle
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy
from faults import (
    FaultPlan,
    FaultyStore,
    connection_reset,
    forbidden,
    throttled,
)
from test_reader_fakes import (
    DictCache,
    GatedStore,
    Stack,
    block_stack,
    object_id,
    source,
    wait_for,
)

pytestmark = pytest.mark.unit

BS = 1024
SIZES = [0, 1, BS - 1, BS, BS + 1, 3 * BS + 7]

reads = st.lists(
    st.tuples(st.integers(0, 4 * BS + 20), st.integers(0, 3 * BS)), min_size=1, max_size=25
)


@pytest.mark.parametrize("cached", [False, True], ids=["nocache", "dictcache"])
@pytest.mark.parametrize("size", SIZES)
def test_random_reads_equal_the_source_slice(size: int, cached: bool) -> None:
    data = source(size)
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS, window=4, cache=DictCache() if cached else None) as s:
        obj = object_id(store, "f")

        @settings(max_examples=60, deadline=None)
        @given(reads)
        def check(ranges: list[tuple[int, int]]) -> None:
            handle = s.reader.open(obj)
            for offset, n in ranges:
                assert handle.read(offset, n) == data[offset : offset + n]
            handle.close()

        check()


def test_the_direct_reader_is_a_reader_too() -> None:
    data = source(3 * BS + 7)
    store = MemoryStore({"f": data})
    reader: Reader = DirectReader(store)
    handle = reader.open(object_id(store, "f"))
    assert handle.read(BS - 3, 10) == data[BS - 3 : BS + 7]
    assert handle.read(10 * BS, 5) == b""


def test_bad_reads_are_einval_and_reads_after_close_ebadf() -> None:
    store = MemoryStore({"f": source(BS)})
    with block_stack(store, block_size=BS) as s:
        handle = s.reader.open(object_id(store, "f"))
        with pytest.raises(OSError) as caught:
            handle.read(-1, 10)
        assert caught.value.errno == errno.EINVAL
        handle.close()
        handle.close()
        with pytest.raises(OSError) as caught:
            handle.read(0, 10)
        assert caught.value.errno == errno.EBADF


def test_concurrent_readers_of_one_file() -> None:
    data = source(64 * BS + 5)
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS, threads=4, window=8) as s:
        obj = object_id(store, "f")

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            handle = s.reader.open(obj)
            if seed % 2:  # half scan sequentially, half read at random
                for offset in range(0, len(data), 700):
                    assert handle.read(offset, 700) == data[offset : offset + 700]
            else:
                for _ in range(150):
                    offset, n = rng.randrange(len(data)), rng.randrange(1, 3 * BS)
                    assert handle.read(offset, n) == data[offset : offset + n]
            handle.close()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(reader, range(16)))


def test_one_handle_shared_by_many_threads() -> None:
    data = source(40 * BS + 1)
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS) as s:
        handle = s.reader.open(object_id(store, "f"))

        def read(offset: int) -> bytes:
            return handle.read(offset, 1000)

        offsets = list(range(0, len(data), 500))
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(read, offsets))
        assert got == [data[o : o + 1000] for o in offsets]


def test_concurrent_readers_of_many_files() -> None:
    files = {f"d/{i}.bin": source(i * 300 + (i % 3), seed=i) for i in range(40)}
    store = MemoryStore(files)
    with block_stack(store, block_size=BS, threads=4, budget=16 * BS) as s:

        def whole(key: str) -> bytes:
            handle = s.reader.open(object_id(store, key))
            parts, offset = [], 0
            while chunk := handle.read(offset, 512):
                parts.append(chunk)
                offset += len(chunk)
            handle.close()
            return b"".join(parts)

        with ThreadPoolExecutor(8) as pool:
            got = dict(zip(files, pool.map(whole, files), strict=True))
        assert got == files
        assert s.fetcher.memory_in_use() <= 16 * BS


def test_single_flight_threads_reading_one_cold_block() -> None:
    data = source(8 * BS)
    store = GatedStore({"f": data})
    with block_stack(store, block_size=BS) as s:
        obj = object_id(store, "f")
        gate = store.gate("f", 3 * BS)
        results: list[bytes] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(s.reader.open(obj).read(3 * BS + 10, 100))
            )
            for _ in range(12)
        ]
        for t in threads:
            t.start()
        wait_for(lambda: s.stats.snapshot()["misses"] == 12)
        gate.set()
        for t in threads:
            t.join(10)
        assert results == [data[3 * BS + 10 : 3 * BS + 110]] * 12
        assert store.requests["read"] == 1


def test_a_sequential_reader_is_served_by_prefetch() -> None:
    data = source(40 * BS + 100)  # 41 blocks
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS, window=8) as s:
        handle = s.reader.open(object_id(store, "f"))

        def scan(start: int, stop: int) -> None:
            for offset in range(start, stop, BS // 2):  # kernel-style: two reads per block
                assert handle.read(offset, BS // 2) == data[offset : offset + BS // 2]

        scan(0, 4 * BS)
        # Blocks 0-3 read: the window has doubled to 8, blocks 1-11 were fetched ahead.
        wait_for(lambda: s.stats.snapshot()["prefetched_blocks"] == 11)
        assert store.requests["read"] == 12
        misses = s.stats.snapshot()["misses"]
        scan(4 * BS, 8 * BS)
        # Served from the held prefetches: no reader waited on storage, and the
        # only new requests are the window moving on (12-15).
        assert s.stats.snapshot()["misses"] == misses
        wait_for(lambda: s.stats.snapshot()["prefetched_blocks"] == 15)
        assert store.requests["read"] == 16
        scan(8 * BS, len(data))
        handle.close()
        snap = s.stats.snapshot()
        assert store.requests["read"] == 41  # every block exactly once
        assert snap["prefetched_blocks"] == 40  # all but the first, ahead of the reader
        assert snap["prefetch_used"] == 40


def test_a_sequential_reader_keeps_the_window_in_flight_in_runs_of_four() -> None:
    """The mount's shape: 4 blocks per prefetch request, a window of 32 blocks
    and a budget of one window (prefetch may take 24 blocks of it). Every
    block is fetched once, all but the first by prefetch, in requests of 4
    blocks (but the first ones, while the window grows), and the requests
    stay 21-32 blocks ahead of the reader."""
    data = source(200 * BS + 10)  # 201 blocks
    store = GatedStore({"f": data})

    def requested_end() -> int:  # blocks [0, n) were asked for
        return max(off + n for _, off, n in list(store.spans)) // BS

    with block_stack(store, block_size=BS, window=32, budget=32 * BS, run_blocks=4) as s:
        handle = s.reader.open(object_id(store, "f"))
        for offset in range(0, len(data), BS // 2):
            assert handle.read(offset, BS // 2) == data[offset : offset + BS // 2]
            b = offset // BS
            if 20 <= b < 170:
                wait_for(lambda b=b: requested_end() >= b + 21)
                assert requested_end() <= b + 1 + 32
        snap = s.stats.snapshot()
        assert snap["blocks_fetched"] == 201  # every block exactly once
        assert snap["prefetched_blocks"] == 200  # all but the first, ahead of the reader
        assert snap["fetch_requests"] <= 201 // 4 + 6
        sizes = [n // BS for _, _, n in store.spans]
        assert sizes.count(4) >= 201 // 4 - 4


def test_a_scan_with_a_budget_of_one_window_fetches_each_block_once() -> None:
    """No RAM tier, budget = window: prefetch must not evict the block a reader
    is halfway through (its second half-block read would fetch it again)."""
    data = source(64 * BS)
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS, threads=4, window=16, budget=16 * BS) as s:
        handle = s.reader.open(object_id(store, "f"))
        for offset in range(0, len(data), BS // 2):
            assert handle.read(offset, BS // 2) == data[offset : offset + BS // 2]
            assert s.fetcher.memory_in_use() <= 16 * BS
        assert store.requests["read"] == 64
        assert s.stats.snapshot()["prefetched_blocks"] >= 60


def test_random_reads_fetch_only_the_blocks_they_touch() -> None:
    blocks = 512
    data = source(blocks * BS)
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS, window=32, cache=DictCache()) as s:
        handle = s.reader.open(object_id(store, "f"))
        rng = random.Random(5)
        touched: set[int] = set()
        for _ in range(300):
            offset = rng.randrange(len(data) - 64)
            assert handle.read(offset, 64) == data[offset : offset + 64]
            touched.update({offset // BS, (offset + 63) // BS})
        handle.close()
        s.scheduler.close()  # settle any stray prefetch before counting
        # Chance adjacency can look sequential for a read or two, no more.
        assert store.requests["read"] <= len(touched) + 4
        assert s.stats.snapshot()["prefetched_blocks"] <= 4


def test_spread_out_random_reads_fetch_exactly_the_blocks_touched() -> None:
    data = source(1000 * BS)
    store = MemoryStore({"f": data})
    with block_stack(store, block_size=BS, window=32) as s:
        handle = s.reader.open(object_id(store, "f"))
        for b in (500, 17, 901, 250, 640, 99, 777, 333):
            offset = b * BS + 100
            assert handle.read(offset, 4096) == data[offset : offset + 4096]  # 5 blocks each
        assert store.requests["read"] == 8 * 5
        assert s.stats.snapshot()["prefetched_blocks"] == 0


def test_a_read_spanning_blocks_fetches_them_in_parallel() -> None:
    data = source(8 * BS)
    store = GatedStore({"f": data})
    with block_stack(store, block_size=BS, threads=4, window=0) as s:
        obj = object_id(store, "f")
        gates = [store.gate("f", i * BS) for i in (2, 3, 4)]
        got: list[bytes] = []
        t = threading.Thread(target=lambda: got.append(s.reader.open(obj).read(2 * BS, 3 * BS)))
        t.start()
        wait_for(lambda: len(store.started) == 3)  # three requests in flight at once
        for g in gates:
            g.set()
        t.join(10)
        assert got == [data[2 * BS : 5 * BS]]


def stuck_scan(s: Stack, store: GatedStore, obj: ObjectId, data: bytes) -> ReadHandle:
    """Scan blocks 0-5 of `obj` with every read from block 6 on gated: the
    prefetch worker hangs in block 6, the rest of the window (7-13) queues."""
    for i in range(6, obj.size // BS):
        store.gate(obj.key, i * BS)
    handle = s.reader.open(obj)
    for offset in range(0, 6 * BS, BS // 2):
        assert handle.read(offset, BS // 2) == data[offset : offset + BS // 2]
    wait_for(lambda: (obj.key, 6 * BS) in store.started)
    assert s.scheduler.queued() == (0, 7)
    return handle


def test_demand_reads_are_served_while_prefetches_are_queued() -> None:
    data = source(64 * BS)
    store = GatedStore({"f": data, "g": data})
    with block_stack(store, block_size=BS, threads=2, window=8) as s:
        scanner = stuck_scan(s, store, object_id(store, "f"), data)
        other = s.reader.open(object_id(store, "g"))
        assert other.read(30 * BS + 5, 100) == data[30 * BS + 5 : 30 * BS + 105]
        assert s.scheduler.queued() == (0, 7)  # served by the demand worker, queue intact
        store.open_all()
        for offset in range(6 * BS, len(data), 700):
            assert scanner.read(offset, 700) == data[offset : offset + 700]
        assert store.requests["read"] == 64 + 1


def test_a_demand_read_of_a_queued_prefetch_jumps_the_queue() -> None:
    data = source(64 * BS)
    store = GatedStore({"f": data})
    with block_stack(store, block_size=BS, threads=2, window=8) as s:
        obj = object_id(store, "f")
        scanner = stuck_scan(s, store, obj, data)
        store.gate("f", 10 * BS).set()
        used = s.stats.snapshot()["prefetch_used"]
        assert scanner.read(10 * BS, 100) == data[10 * BS : 10 * BS + 100]
        assert s.stats.snapshot()["prefetch_used"] == used + 1  # the queued prefetch, promoted
        assert ("f", 6 * BS) in store.started and store.requests["read"] <= 11


def test_a_closed_handle_cancels_its_queued_prefetches() -> None:
    data = source(64 * BS)
    store = GatedStore({"f": data})
    with block_stack(store, block_size=BS, threads=2, window=8) as s:
        scanner = stuck_scan(s, store, object_id(store, "f"), data)
        scanner.close()
        assert s.scheduler.queued() == (0, 0)
        store.open_all()
        wait_for(lambda: store.requests["read"] == 7)  # blocks 0-6; 7-13 never fetched
        wait_for(lambda: s.stats.snapshot()["prefetched_blocks"] == 6)
        assert s.fetcher.memory_in_use() <= 4 * 8 * BS


def test_a_version_change_mid_read_is_estale_never_mixed_bytes() -> None:
    old = source(6 * BS)
    store = GatedStore({"f": old})
    with block_stack(store, block_size=BS, window=0, cache=DictCache()) as s:
        handle = s.reader.open(object_id(store, "f"))
        assert handle.read(0, BS) == old[:BS]  # block 0 cached (old version)
        gate = store.gate("f", BS)
        errors: list[OSError] = []

        def span() -> None:
            try:
                handle.read(BS // 2, BS)  # half of block 0 (cached) + half of block 1
            except OSError as exc:
                errors.append(exc)

        t = threading.Thread(target=span)
        t.start()
        wait_for(lambda: ("f", BS) in store.started)
        store.put("f", source(6 * BS, seed=99))  # overwritten while block 1 is in flight
        gate.set()
        t.join(10)
        assert [e.errno for e in errors] == [errno.ESTALE]
        # The handle keeps serving the old version from what it already has...
        assert handle.read(0, BS) == old[:BS]
        # ...and any block it must fetch is ESTALE.
        with pytest.raises(OSError) as caught:
            handle.read(4 * BS, 10)
        assert caught.value.errno == errno.ESTALE
        # A new open of the new version reads the new bytes.
        fresh = s.reader.open(object_id(store, "f"))
        assert fresh.read(0, 6 * BS) == source(6 * BS, seed=99)


def test_transient_faults_are_retried_and_bytes_are_right() -> None:
    data = source(20 * BS + 3)
    plan = FaultPlan()
    # 7 failures in all: even if one request meets them all, 7 retries suffice.
    plan.fail("read", times=4, error=throttled(retry_after=0.0))
    plan.fail("read", times=3, error=connection_reset())
    store = FaultyStore(MemoryStore({"f": data}), plan, retry=RetryPolicy(7, sleep=lambda _s: None))
    with block_stack(store, block_size=BS, window=4) as s:
        handle = s.reader.open(object_id(store, "f"))
        got = b"".join(handle.read(o, 300) for o in range(0, len(data), 300))
        assert got == data
        assert store.failures["read"] == 7
        assert store.attempts["read"] == 21 + 7


def test_a_permanent_error_reaches_the_reader() -> None:
    data = source(4 * BS)
    plan = FaultPlan().fail("read", times=None, error=forbidden())
    store = FaultyStore(MemoryStore({"f": data}), plan, retry=RetryPolicy(3))
    with block_stack(store, block_size=BS) as s:
        obj = ObjectId("memory://test", "f", store.inner.stat("f").etag, len(data))
        handle = s.reader.open(obj)
        with pytest.raises(OSError) as caught:
            handle.read(0, 10)
        assert caught.value.errno == errno.EACCES
        plan.clear()
        assert handle.read(0, 10) == data[:10]
