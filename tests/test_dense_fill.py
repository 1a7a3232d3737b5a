"""Dense fill: the pure policy (random reads in, fill decision out), then
DenseFill over a real BlockFetcher and an in-memory store: a dense random
reader gets the whole file fetched once, a sparse one stays on demand
(bytes fetched <= 2 x distinct blocks touched), sequential readers and files
that do not fit the cache are never filled, and the fill's blocks give their
budget back."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamount.read.cache.protocol import NoCache
from datamount.read.densefill import DenseFill
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.dense import PART_FILL_BYTES, START_SHARE, DensePolicy
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.reader import BlockReader
from datamount.read.stats import MountStats
from datamount.storage.memory import MemoryStore
from faultproxy import FaultProxy
from fuse_helpers import Mounts, wait_for
from test_mount_blocks import BS as MBS
from test_mount_blocks import env_for, folder_spec, mount_ok, read_direct, unmount_ok
from test_reader_fakes import DictCache, object_id, source

BS = 1024
NBLOCKS = 256
DATA = source(NBLOCKS * BS - 100)  # the last block short

# -- the policy ----------------------------------------------------------------


@pytest.mark.unit
def test_stays_on_demand_until_the_start_share_then_fills_twice_the_touched() -> None:
    policy = DensePolicy(16, fits=True, start_share=0.25)
    assert policy.threshold == 4
    for i in (1, 3, 5):
        assert policy.on_read(i, i) == []
    assert policy.on_read(5, 5) == []  # a block read again is not a new one
    # 4 touched: 4 more may be filled (touched or filled <= 2 x touched).
    assert policy.on_read(7, 7) == [0, 2, 4, 6]
    assert policy.started and not policy.done
    assert policy.on_read(9, 9) == [8]  # a miss pays for one more block
    assert policy.on_read(0, 0) == [10, 11]  # a first read of a filled block, for two
    assert policy.on_read(0, 0) == []  # read again: nothing new


@pytest.mark.unit
def test_the_fill_goes_in_whole_runs_but_the_tail() -> None:
    policy = DensePolicy(10, fits=True, start_share=0.4, run=4)
    assert [policy.on_read(i, i) for i in (9, 8, 7)] == [[], [], []]
    assert policy.on_read(6, 6) == [0, 1, 2, 3]  # room 4: one run
    assert policy.on_read(5, 5) == [4]  # room 1, one block left: the tail
    assert policy.done and policy.filled_count == 5
    assert policy.on_read(2, 3) == []
    longer = DensePolicy(20, fits=True, start_share=0.2, run=4)
    assert [longer.on_read(i, i) for i in (19, 18, 17)] == [[], [], []]
    assert longer.on_read(16, 16) == [0, 1, 2, 3]
    assert [longer.on_read(i, i) for i in (15, 14, 13)] == [[], [], []]  # room 1, 2, 3
    assert longer.on_read(12, 12) == [4, 5, 6, 7]


@pytest.mark.unit
def test_a_read_spanning_blocks_touches_each() -> None:
    policy = DensePolicy(8, fits=True, start_share=0.5)
    assert policy.on_read(2, 4) == []
    assert policy.touched == 3
    assert policy.on_read(6, 20) == [0, 1, 5]  # clipped to the file; room 4, 3 left


@pytest.mark.unit
def test_never_fills_a_file_that_does_not_fit_or_is_tiny() -> None:
    big = DensePolicy(10, fits=False)
    assert all(big.on_read(i, i) == [] for i in range(10))
    tiny = DensePolicy(3, fits=True)  # fewer blocks than MIN_TOUCHED
    assert all(tiny.on_read(i, i) == [] for i in range(3))


@pytest.mark.unit
def test_a_stopped_policy_fills_no_more() -> None:
    policy = DensePolicy(8, fits=True, start_share=0.5)
    assert [policy.on_read(i, i) for i in range(3)] == [[], [], []]
    assert policy.on_read(3, 3) == [4, 5, 6, 7]
    policy.stop()
    assert policy.done and policy.on_read(4, 7) == []


@pytest.mark.unit
def test_the_benchmark_readers_sparse_on_demand_dense_filled() -> None:
    """benchmarks/mount.py's seeded readers over 1 GiB of 2 MiB blocks: 200
    preads (a sparse reader) are never filled; 2,000 get the file whole with
    fewer demand misses than a fill at half the blocks (256)."""
    size, block, pread = 1 << 30, 2 << 20, 64 * 1024
    for count in (200, 2000):
        rng = random.Random(4)
        policy = DensePolicy(size // block, fits=True, run=4)
        fetched: set[int] = set()
        misses = 0
        for _ in range(count):
            off = rng.randrange(0, size - pread + 1)
            first, last = off // block, (off + pread - 1) // block
            misses += len(set(range(first, last + 1)) - fetched)
            fetched.update(range(first, last + 1))
            rest = policy.on_read(first, last)
            assert not fetched & set(rest)
            fetched.update(rest)
        if count == 200:
            assert not policy.started and len(fetched) == policy.touched == 172
        else:
            assert len(fetched) == 512 and misses < 220


@pytest.mark.unit
@given(
    st.integers(1, 300),
    st.floats(0.01, 1.0),
    st.integers(1, 8),
    st.lists(st.tuples(st.integers(0, 299), st.integers(0, 3)), max_size=400),
)
def test_fetched_never_exceeds_twice_the_touched(
    n: int, share: float, run: int, reads: list[tuple[int, int]]
) -> None:
    """Whatever the reads, at every moment: blocks touched or filled <= 2 x
    distinct blocks touched; each block handed out once, never a touched one;
    nothing before the start share."""
    policy = DensePolicy(n, fits=True, start_share=share, run=run)
    seen: set[int] = set()
    filled: set[int] = set()
    for r, span in reads:
        first = r % n
        seen.update(range(first, min(first + span, n - 1) + 1))
        rest = policy.on_read(first, first + span)
        assert rest == sorted(rest) and not set(rest) & (seen | filled)
        if rest:
            assert len(seen) >= policy.threshold
        filled.update(rest)
        assert len(seen | filled) <= 2 * len(seen)
    if policy.done and policy.started:
        assert seen | filled == set(range(n))


@pytest.mark.unit
def test_a_first_part_read_prepays_its_block_and_is_filled_for_free() -> None:
    """A block read in part costs its part plus the whole block it may still
    need; the fill then hands it out without paying again."""
    policy = DensePolicy(16, fits=True, start_share=0.25, block_size=100)
    for i in (1, 3, 5):
        assert policy.on_read_parts(i, i, {i: 10}) == ({i}, [])
    assert policy.spent == 3 * 110
    # 4 touched, all in part: allowance 800 - 440 = 360 -> 3 fresh blocks, and
    # the part-read blocks on the way come free.
    granted, rest = policy.on_read_parts(7, 7, {7: 10})
    assert granted == {7} and rest == [0, 1, 2, 3, 4]
    assert policy.spent == 4 * 110 + 3 * 100 <= 2 * policy.touched * 100
    # A miss of a block the fill has not brought yet: a part, its fill paid already.
    assert policy.on_read_parts(2, 2, {2: 10}) == ({2}, [5, 6, 7, 8])  # 5 and 7 free
    assert policy.spent == 4 * 110 + 10 + 5 * 100 <= 2 * policy.touched * 100
    assert policy.on_read_parts(9, 9, {9: 10}) == ({9}, [9, 10])
    for i in (11, 12, 13, 14, 15):
        policy.on_read_parts(i, i, {i: 10})
    # Every block handed out: a miss of one still on the way reads in part.
    assert policy.done and policy.on_read_parts(10, 10, {10: 10}) == ({10}, [])
    assert policy.spent <= 2 * policy.touched * 100


@pytest.mark.unit
def test_a_file_read_in_parts_is_filled_once_its_part_misses_cost_the_fill() -> None:
    """benchmarks/mount.py's 2,000 seeded 64 KiB preads over 1 GiB of 2 MiB
    blocks, missing in parts: no fill yet (2,048 part misses buy the 1 GiB
    fill, PART_FILL_BYTES); a reader that goes on gets the file filled, within
    the bound in bytes."""
    size, block, pread = 1 << 30, 2 << 20, 64 * 1024
    rng = random.Random(4)
    policy = DensePolicy(size // block, fits=True, run=4, block_size=block)
    assert policy.part_threshold == size // PART_FILL_BYTES == 2048
    filled: set[int] = set()
    for n in range(3000):
        off = rng.randrange(0, size - pread + 1)
        first, last = off // block, (off + pread - 1) // block
        want = {i: 128 * 1024 for i in range(first, last + 1) if i not in filled}
        granted, rest = policy.on_read_parts(first, last, want)
        filled.update(rest)
        assert policy.spent <= 2 * policy.touched * block
        if n < 2000:
            assert not policy.started
    assert policy.started and len(filled) == size // block


@pytest.mark.unit
def test_a_part_read_again_within_the_allowance_else_whole() -> None:
    policy = DensePolicy(64, fits=True, block_size=100)  # never filled this early
    assert policy.on_read_parts(5, 5, {5: 60}) == ({5}, [])
    # allowance 200, spent 160: one more part of 40, then the prepaid whole block.
    assert policy.on_read_parts(5, 5, {5: 40}) == ({5}, [])
    assert policy.on_read_parts(5, 5, {5: 40}) == (set(), [])
    assert policy.spent == 200
    assert policy.on_read_parts(5, 5, {5: 10}) == (set(), [])  # whole: cached now
    assert policy.spent == 200


@pytest.mark.unit
def test_a_file_that_does_not_fit_still_reads_in_part() -> None:
    policy = DensePolicy(10, fits=False, block_size=100)
    assert all(policy.on_read_parts(i, i, {i: 10}) == ({i}, []) for i in range(10))
    stopped = DensePolicy(10, fits=True, block_size=100)
    stopped.stop()  # a fill fetch failed: whole blocks again
    assert stopped.on_read_parts(1, 1, {1: 10}) == (set(), [])


@pytest.mark.unit
@given(
    st.integers(1, 300),
    st.floats(0.01, 1.0),
    st.integers(1, 8),
    st.lists(st.tuples(st.integers(0, 299), st.integers(0, 2), st.integers(0, 100)), max_size=400),
)
def test_bytes_never_exceed_twice_the_touched_blocks(
    n: int, share: float, run: int, reads: list[tuple[int, int, int]]
) -> None:
    """Reads that miss in part (part = 0: whole, or cached): at every moment
    the bytes spent (parts, whole misses, fill) <= 2 x distinct blocks
    touched x block size; each block filled at most once, never one fetched
    whole; a finished fill covers the file."""
    bs = 100
    policy = DensePolicy(n, fits=True, start_share=share, run=run, block_size=bs)
    seen: set[int] = set()
    whole: set[int] = set()
    filled: set[int] = set()
    spent = 0
    for r, span, part in reads:
        first = r % n
        blocks = range(first, min(first + span, n - 1) + 1)
        want = {i: part for i in blocks if part and i not in whole | filled}
        granted, rest = policy.on_read_parts(first, first + span, want)
        assert granted <= set(want)
        for i in blocks:
            if i in granted:
                spent += part
            elif i not in whole | filled:
                spent += bs
                whole.add(i)
        seen.update(blocks)
        assert rest == sorted(rest) and not set(rest) & (whole | filled)
        filled.update(rest)
        spent += bs * len(rest)
        assert spent <= policy.spent <= 2 * len(seen) * bs
    if policy.done and policy.started:
        assert whole | filled == set(range(n))


# -- DenseFill over a real fetcher -------------------------------------------------


class Rig:
    def __init__(
        self, *, capacity: int = 10 * len(DATA), budget: int = 32 * BS, part_align: int = 0
    ) -> None:
        self.store = MemoryStore({"f": DATA})
        self.cache = DictCache()
        self.stats = MountStats()
        self.scheduler = Scheduler(4)
        self.fetcher = BlockFetcher(
            self.store, self.cache, BS, self.scheduler, self.stats,
            memory_budget=budget, run_bytes=4 * BS,
        )  # fmt: skip
        self.dense = DenseFill(self.fetcher, self.stats, lambda: capacity)
        # part_align 0: whole-block misses (parts of these small blocks, below).
        self.reader = BlockReader(
            self.fetcher, BS, 8, dense=self.dense, part_align=part_align, part_min_block=0
        )
        self.obj = object_id(self.store, "f")

    def close(self) -> None:
        self.dense.close()
        self.reader.close()
        self.scheduler.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.close()


def random_reads(rig: Rig, count: int, seed: int = 3) -> set[int]:
    """`count` random 100-byte preads away from block 0; the blocks touched."""
    r = random.Random(seed)
    handle = rig.reader.open(rig.obj)
    touched = set()
    try:
        for _ in range(count):
            off = r.randrange(BS, len(DATA) - 100)
            assert handle.read(off, 100) == DATA[off : off + 100]
            touched.add(off // BS)
    finally:
        handle.close()
    return touched


@pytest.mark.unit
def test_a_dense_random_reader_gets_the_whole_file_once(rig: Rig) -> None:
    random_reads(rig, 1000)  # touches nearly every block
    assert rig.dense.wait_idle()
    snap = rig.stats.snapshot()
    assert snap["dense_fills"] == 1
    assert snap["bytes_fetched"] == len(DATA)  # every block once: demand + fill
    assert snap["filled_blocks"] > 0
    assert len(rig.cache.blocks) == NBLOCKS
    # Filled blocks went to the cache and gave their bytes back.
    assert rig.fetcher.memory_in_use() <= rig.fetcher.memory_budget
    assert rig.fetcher.budget.in_use() == rig.fetcher.memory_in_use()


@pytest.mark.unit
def test_the_fill_is_read_through_the_cache_afterwards(rig: Rig) -> None:
    random_reads(rig, 400)
    assert rig.dense.wait_idle()
    fetched = rig.stats.snapshot()["bytes_fetched"]
    handle = rig.reader.open(rig.obj)
    assert handle.read(0, len(DATA)) == DATA
    handle.close()
    assert rig.stats.snapshot()["bytes_fetched"] == fetched == len(DATA)


@pytest.mark.unit
def test_a_sparse_random_reader_stays_on_demand(rig: Rig) -> None:
    # 200 preads over 1 GiB of 2 MiB blocks (512) is 200 over 256 here: 10 % of reads.
    touched = random_reads(rig, 50)
    assert rig.dense.wait_idle()
    snap = rig.stats.snapshot()
    assert snap["dense_fills"] == 0 and snap["filled_blocks"] == 0
    assert snap["bytes_fetched"] <= 2 * len(touched) * BS


@pytest.mark.unit
def test_a_reader_past_the_start_share_is_filled_within_twice_its_blocks(rig: Rig) -> None:
    """~44 % of the blocks touched (past START_SHARE, short of half): the fill
    starts, and demand + fill stay within 2 x the distinct blocks touched."""
    random_reads(rig, 150)
    r = random.Random(3)  # random_reads' offsets: the blocks each 100-byte read spans
    offs = [r.randrange(BS, len(DATA) - 100) for _ in range(150)]
    touched = {o // BS for o in offs} | {(o + 99) // BS for o in offs}
    assert START_SHARE * NBLOCKS <= len(touched) < NBLOCKS / 2
    assert rig.dense.wait_idle()
    snap = rig.stats.snapshot()
    assert snap["dense_fills"] == 1 and snap["filled_blocks"] > 0
    assert snap["bytes_fetched"] <= 2 * len(touched) * BS
    assert len(rig.cache.blocks) == snap["blocks_fetched"]  # each block once


@pytest.mark.unit
def test_a_sequential_reader_is_never_filled(rig: Rig) -> None:
    handle = rig.reader.open(rig.obj)
    for off in range(0, len(DATA), 300):
        assert handle.read(off, 300) == DATA[off : off + 300]
    handle.close()
    assert rig.dense.wait_idle()
    snap = rig.stats.snapshot()
    assert snap["dense_fills"] == 0
    assert snap["bytes_fetched"] == len(DATA)


@pytest.fixture
def parts_rig() -> Iterator[Rig]:
    made = Rig(part_align=128)  # 100-byte reads of 1 KiB blocks miss in 128-256 bytes
    yield made
    made.close()


@pytest.mark.unit
def test_a_sparse_random_reader_fetches_only_its_parts(parts_rig: Rig) -> None:
    touched = random_reads(parts_rig, 50)
    assert parts_rig.dense.wait_idle()
    snap = parts_rig.stats.snapshot()
    assert snap["dense_fills"] == 0 and snap["blocks_fetched"] == 0
    assert snap["part_reads"] == snap["fetch_requests"] >= len(touched)
    assert snap["bytes_fetched"] <= 2 * 256 * 50  # a read spans at most two blocks
    assert not parts_rig.cache.blocks  # no partial block cached


@pytest.mark.unit
def test_a_dense_random_reader_in_parts_is_filled_then_read_from_the_cache(
    parts_rig: Rig,
) -> None:
    touched = random_reads(parts_rig, 1000)
    assert parts_rig.dense.wait_idle()
    snap = parts_rig.stats.snapshot()
    assert snap["dense_fills"] == 1 and len(parts_rig.cache.blocks) == NBLOCKS
    assert snap["blocks_fetched"] == NBLOCKS  # the fill and whole misses: each block once
    assert snap["bytes_fetched"] <= 2 * len(touched) * BS
    parts = snap["part_reads"]
    handle = parts_rig.reader.open(parts_rig.obj)
    r = random.Random(9)
    for _ in range(200):
        off = r.randrange(0, len(DATA) - 100)
        assert handle.read(off, 100) == DATA[off : off + 100]
    handle.close()
    after = parts_rig.stats.snapshot()
    assert after["part_reads"] == parts and after["bytes_fetched"] == snap["bytes_fetched"]


@pytest.mark.unit
def test_a_sequential_reader_fetches_whole_blocks_with_parts_on(parts_rig: Rig) -> None:
    handle = parts_rig.reader.open(parts_rig.obj)
    for off in range(0, len(DATA), 300):
        assert handle.read(off, 300) == DATA[off : off + 300]
    handle.close()
    snap = parts_rig.stats.snapshot()
    assert snap["part_reads"] == 0 and snap["bytes_fetched"] == len(DATA)


@pytest.mark.unit
def test_a_file_larger_than_its_share_of_the_cache_is_not_filled() -> None:
    rig = Rig(capacity=len(DATA))  # the file would take the whole cache
    try:
        random_reads(rig, 1000)
        assert rig.dense.wait_idle()
        snap = rig.stats.snapshot()
        assert snap["dense_fills"] == 0 and snap["filled_blocks"] == 0
    finally:
        rig.close()


@pytest.mark.unit
def test_a_tight_budget_still_fills_in_runs() -> None:
    rig = Rig(budget=4 * BS)  # the prefetch share takes 3 blocks: runs of 3
    try:
        random_reads(rig, 1000)
        assert rig.dense.wait_idle()
        snap = rig.stats.snapshot()
        assert snap["bytes_fetched"] == len(DATA)
        assert rig.fetcher.budget.in_use() <= rig.fetcher.memory_budget
    finally:
        rig.close()


@pytest.mark.unit
def test_no_prefetch_window_means_no_fill() -> None:
    """DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT=0: every read looks random, and
    a fill is a prefetch: none."""
    store = MemoryStore({"f": DATA})
    stats = MountStats()
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(store, DictCache(), BS, scheduler, stats, memory_budget=BS)
    dense = DenseFill(fetcher, stats, lambda: 1 << 40)
    reader = BlockReader(fetcher, BS, 0, dense=dense)
    try:
        handle = reader.open(object_id(store, "f"))
        order = list(range(1, NBLOCKS, 2))  # half the blocks, in a random order
        random.Random(1).shuffle(order)
        for i in order:
            assert handle.read(i * BS, 10) == DATA[i * BS : i * BS + 10]
        handle.close()
        assert dense.wait_idle()
        assert stats.snapshot()["dense_fills"] == 0
        assert stats.snapshot()["bytes_fetched"] == sum(len(DATA[i * BS :][:BS]) for i in order)
    finally:
        dense.close()
        reader.close()
        scheduler.close()


@pytest.mark.unit
def test_without_a_cache_the_fill_is_skipped_cheaply() -> None:
    """NoCache: a fill would throw its blocks away; with capacity 0 nothing fits."""
    store = MemoryStore({"f": DATA})
    stats = MountStats()
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(store, NoCache(), BS, scheduler, stats, memory_budget=8 * BS)
    dense = DenseFill(fetcher, stats, lambda: 0)
    reader = BlockReader(fetcher, BS, 8, dense=dense)
    try:
        handle = reader.open(object_id(store, "f"))
        for i in range(1, NBLOCKS):
            handle.read(i * BS, 10)
        handle.close()
        assert dense.wait_idle()
        assert stats.snapshot()["dense_fills"] == 0
    finally:
        dense.close()
        reader.close()
        scheduler.close()


# -- through FUSE, over Azurite --------------------------------------------------


def _gets_bytes(proxy: FaultProxy, name: str) -> int:
    spans = (g.range.split("=")[1].split("-") for g in proxy.ranged_gets(name))
    return sum(int(hi) - int(lo) + 1 for lo, hi in spans)


def _random_preads(path: Path, body: bytes, count: int, bs: int, seed: int) -> set[int]:
    """`count` O_DIRECT 4 KiB preads away from block 0; the blocks touched."""
    r = random.Random(seed)
    touched: set[int] = set()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        for _ in range(count):
            off = r.randrange(bs, len(body) - 8192)
            off -= off % 4096
            assert os.pread(fd, 4096, off) == body[off : off + 4096]
            touched.add(off // bs)
    finally:
        os.close(fd)
    return touched


@pytest.fixture
def read_mounted(azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy):  # noqa: ANN001, ANN201
    """`run(name, body, count, seed)`: `body` seeded as ds/NAME, the folder
    mounted through the proxy, then `count` random preads of blocks of MBS;
    returns (mount point, its env, the blocks touched)."""

    def run(name: str, body: bytes, count: int, seed: int) -> tuple[Path, dict[str, str], set[int]]:
        azurite.seed(container, {f"ds/{name}": body})
        env = env_for(azurite, tmp_path, container, via=proxy)
        mp = mounts.point(tmp_path / "mnt")
        mount_ok(folder_spec(tmp_path), mp, env)
        return mp, env, _random_preads(mp / name, body, count, MBS, seed=seed)

    return run


@pytest.mark.fuse
def test_mount_dense_random_reader_fetches_the_file_once(
    read_mounted, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    body = random.Random(11).randbytes(128 * MBS)  # 8 MiB, 128 blocks of 64 KiB
    mp, env, _ = read_mounted("dense.bin", body, 400, seed=5)
    # The fill finishes in the background: every byte of the file, once.
    assert wait_for(lambda: _gets_bytes(proxy, "ds/dense.bin") >= len(body), 30)
    assert read_direct(mp / "dense.bin") == body  # served by the cache: no GET more
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["dense_fills"] == 1 and stats["filled_blocks"] > 0, stats
    assert stats["bytes_fetched"] == _gets_bytes(proxy, "ds/dense.bin") == len(body), stats
    # In parallel ranges: far fewer requests than blocks.
    assert len(proxy.ranged_gets("ds/dense.bin")) < 128


@pytest.mark.fuse
def test_mount_sparse_random_reader_stays_on_demand(
    read_mounted, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    # 200 preads over 1 GiB of 2 MiB blocks (512), in proportion: 100 over 256 blocks.
    body = random.Random(12).randbytes(256 * MBS)
    mp, env, touched = read_mounted("sparse.bin", body, 100, seed=6)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["dense_fills"] == 0 and stats["filled_blocks"] == 0, stats
    assert stats["bytes_fetched"] <= 2 * len(touched) * MBS, (len(touched), stats)
    assert _gets_bytes(proxy, "ds/sparse.bin") == stats["bytes_fetched"]


@pytest.mark.fuse
def test_mount_reader_past_the_start_share_is_filled_within_twice_its_blocks(
    read_mounted, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    """150 preads over 256 blocks touch ~44 % of them: the fill starts and
    runs ahead of the reader, and what Azurite sent stays within 2 x the
    distinct blocks touched."""
    body = random.Random(13).randbytes(256 * MBS)
    mp, env, touched = read_mounted("medium.bin", body, 150, seed=7)
    assert 96 <= len(touched) < 128, len(touched)
    assert wait_for(lambda: _gets_bytes(proxy, "ds/medium.bin") > len(touched) * MBS, 30)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["dense_fills"] == 1 and stats["filled_blocks"] > 0, stats
    assert stats["bytes_fetched"] <= 2 * len(touched) * MBS, (len(touched), stats)
    # What Azurite sent: the daemon's count, plus at most a fill range cut by
    # the unmount (sent, never counted); the bound holds for it as well.
    sent = _gets_bytes(proxy, "ds/medium.bin")
    assert stats["bytes_fetched"] <= sent <= 2 * len(touched) * MBS, (sent, len(touched), stats)


@pytest.mark.fuse
def test_mount_random_misses_fetch_only_their_parts_sequential_whole_blocks(
    azurite,
    container,
    tmp_path: Path,
    mounts: Mounts,
    proxy: FaultProxy,  # noqa: ANN001
) -> None:
    """512 KiB blocks (larger than PART_MIN_BLOCK, unlike the 64 KiB ones
    above): a random 4 KiB pread that misses is one 4 KiB ranged GET
    (PART_ALIGN), never a whole block; a sequential read of the file
    still goes in whole blocks; every byte equals the source."""
    bs = 512 * 1024
    body = random.Random(14).randbytes(32 * bs)  # 16 MiB
    azurite.seed(container, {"ds/parts.bin": body})
    env = env_for(azurite, tmp_path, container, via=proxy, DATASET_MOUNT_READ_BLOCK_SIZE="512KB")
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    # Far apart (no two in a row look like a stream); block 20 twice, 2 parts.
    offsets = [b * bs + k * 4096 for b, k in ((5, 3), (20, 0), (9, 100), (30, 127), (20, 64))]
    fd = os.open(mp / "parts.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        for off in offsets:
            assert os.pread(fd, 4096, off) == body[off : off + 4096]
    finally:
        os.close(fd)
    spans = [
        tuple(int(x) for x in g.range.split("=")[1].split("-"))
        for g in proxy.ranged_gets("ds/parts.bin")
    ]
    assert sorted(lo for lo, _ in spans) == sorted(offsets)  # 4 KiB, as read (PART_ALIGN)
    assert all(hi - lo + 1 == 4096 for lo, hi in spans), spans
    assert read_direct(mp / "parts.bin") == body
    seq = [
        tuple(int(x) for x in g.range.split("=")[1].split("-"))
        for g in proxy.ranged_gets("ds/parts.bin")
    ][len(spans) :]
    assert all(lo % bs == 0 and (hi + 1) % bs == 0 for lo, hi in seq), seq
    assert sum(hi - lo + 1 for lo, hi in seq) == len(body)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["part_reads"] == len(spans), stats
    assert stats["bytes_fetched"] == _gets_bytes(proxy, "ds/parts.bin"), stats
