"""PrefetchPolicy: sequential scans prefetch every block once, ahead of its
reader; random access prefetches (almost) nothing; the window stays within
its bound and the file."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamount.read.blocks import blocks_for
from datamount.read.prefetch.policy import PrefetchPolicy

pytestmark = pytest.mark.unit

BS = 256  # bytes: only the block arithmetic matters here


def feed(policy: PrefetchPolicy, first: int, last: int) -> list[int]:
    """on_read plus the invariants every call must keep."""
    ahead = policy.on_read(first, last)
    assert 0 <= policy.window <= policy.max_window
    assert len(ahead) <= policy.window
    assert ahead == list(range(ahead[0], ahead[0] + len(ahead))) if ahead else True
    assert all(last < b < policy.block_count for b in ahead)
    return ahead


def scan(size: int, read_sizes: list[int]) -> list[tuple[int, int]]:
    """Blocks (first, last) of a sequential scan with the given read sizes (cycled)."""
    reads, offset, i = [], 0, 0
    while offset < size:
        n = read_sizes[i % len(read_sizes)]
        r = blocks_for(offset, n, size, BS)
        reads.append((r[0], r[-1]))
        offset, i = offset + n, i + 1
    return reads


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.integers(1, 300),
    max_window=st.integers(1, 40),
    read_sizes=st.lists(st.integers(16, BS), min_size=1, max_size=5),
    batch=st.integers(1, 6),
)
def test_sequential_scan_prefetches_every_block_once_ahead(
    blocks: int, max_window: int, read_sizes: list[int], batch: int
) -> None:
    policy = PrefetchPolicy(blocks, max_window, batch=batch)
    prefetched: list[int] = []
    seen: set[int] = set()
    for first, last in scan(blocks * BS, read_sizes):
        # Every block past the first is prefetched before a read needs it.
        assert first == 0 or first in seen
        assert last == 0 or last in seen
        ahead = feed(policy, first, last)
        prefetched += ahead
        seen.update(ahead)
    assert sorted(prefetched) == list(range(1, blocks))  # each once, none beyond EOF
    if blocks > 2 * max_window + 8:
        assert policy.window == max_window


@settings(max_examples=100, deadline=None)
@given(
    blocks=st.integers(1, 200),
    max_window=st.integers(0, 32),
    read_sizes=st.lists(st.integers(1, 5 * BS), min_size=1, max_size=5),
)
def test_large_reads_never_prefetch_twice_or_past_eof(
    blocks: int, max_window: int, read_sizes: list[int]
) -> None:
    policy = PrefetchPolicy(blocks, max_window)
    prefetched: list[int] = []
    for first, last in scan(blocks * BS - 3, read_sizes):
        prefetched += feed(policy, first, last)
    assert len(prefetched) == len(set(prefetched))
    if max_window == 0:
        assert prefetched == []


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    max_window=st.integers(1, 32),
    in_flight=st.integers(2, 8),
)
def test_kernel_readahead_reordering_still_counts_as_sequential(
    seed: int, max_window: int, in_flight: int
) -> None:
    """Half-block reads served by several FUSE threads: after the kernel's
    synchronous first read at offset 0, each group of `in_flight`
    consecutive readahead reads (up to 4 blocks) arrives in any order."""
    rng = random.Random(seed)
    blocks = 400
    ordered = scan(blocks * BS, [BS // 2])
    reads = ordered[:1]
    for i in range(1, len(ordered), in_flight):
        group = ordered[i : i + in_flight]
        rng.shuffle(group)
        reads += group
    policy = PrefetchPolicy(blocks, max_window)
    prefetched: list[int] = []
    for first, last in reads:
        prefetched += feed(policy, first, last)
    assert len(prefetched) == len(set(prefetched))
    if 2 * max_window >= in_flight:  # the window covers the reordering: every block ahead
        assert len(prefetched) >= blocks - in_flight
    # (A read that overtakes a smaller window fetches its block itself.)
    assert policy.window == max_window


def test_a_scan_after_a_seek_survives_reordering() -> None:
    policy = PrefetchPolicy(1000, 8)
    assert feed(policy, 100, 100) == []
    assert feed(policy, 102, 102) == []  # overtook 101: looks random for now
    assert feed(policy, 101, 101) == []  # behind: part of the stream, no growth
    assert feed(policy, 103, 103) == [104]
    assert feed(policy, 106, 106) == [107, 108]  # overtook 105 (prefetched): still a scan
    assert feed(policy, 104, 104) == []
    assert feed(policy, 105, 105) == []
    assert policy.window == 2
    assert feed(policy, 112, 112) == [113, 114, 115, 116]  # overtook the window by 3
    assert policy.window == 4


def test_a_late_read_far_behind_restarts_the_window_without_repeating_requests() -> None:
    """A read more than a window behind is a jump back (a new stream): the
    window restarts, and the blocks it offers again are ones the fetcher
    already holds or fetches (it ignores those)."""
    policy = PrefetchPolicy(100, 4)
    for b in range(12):
        feed(policy, b, b)
    assert policy.window == 4
    assert feed(policy, 5, 5) == []  # 6 behind: past the slack and the window
    assert policy.window == 0
    assert feed(policy, 12, 12) == []  # not next to 5: random
    assert feed(policy, 13, 13) == [14]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_window=st.integers(1, 64))
def test_random_reads_on_a_large_file_prefetch_nothing(seed: int, max_window: int) -> None:
    rng = random.Random(seed)
    blocks = 1_000_000
    policy = PrefetchPolicy(blocks, max_window)
    prefetched: list[int] = []
    for _ in range(300):
        first = rng.randrange(blocks)
        prefetched += feed(policy, first, min(first + rng.randrange(2), blocks - 1))
    assert len(prefetched) <= 1  # only if the very first read was at block 0
    assert policy.window <= 1


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_reads_on_a_small_file_prefetch_little(seed: int) -> None:
    rng = random.Random(seed)
    blocks, reads = 200, 200
    policy = PrefetchPolicy(blocks, 32)
    prefetched = sum(len(feed(policy, b, b)) for b in (rng.randrange(blocks) for _ in range(reads)))
    # A random read lands next to the previous one ~1 time in 30 here; each
    # such coincidence prefetches one or two blocks.
    assert prefetched <= reads // 5


def test_a_scan_after_a_random_jump_grows_again_from_one() -> None:
    policy = PrefetchPolicy(1000, 16)
    assert feed(policy, 500, 500) == []  # first read not at 0: wait and see
    assert feed(policy, 501, 501) == [502]
    assert feed(policy, 502, 502) == [503, 504]
    assert feed(policy, 503, 503) == [505, 506, 507]
    assert policy.window == 4
    assert feed(policy, 10, 10) == []  # a jump: back to nothing
    assert policy.window == 0
    assert feed(policy, 11, 11) == [12]


def test_the_window_doubles_up_to_its_bound_and_stops_at_eof() -> None:
    policy = PrefetchPolicy(40, 8)
    assert feed(policy, 0, 0) == [1]
    assert feed(policy, 1, 1) == [2, 3]
    assert feed(policy, 2, 2) == [4, 5, 6]
    assert feed(policy, 3, 3) == [7, 8, 9, 10, 11]
    assert feed(policy, 4, 4) == [12]  # window 8 reached: one new block per block read
    assert policy.window == 8
    for b in range(5, 32):
        feed(policy, b, b)
    assert feed(policy, 32, 32) == []  # 39 was the last block
    assert feed(policy, 39, 39) == []


def test_re_reading_the_same_block_neither_grows_nor_repeats() -> None:
    policy = PrefetchPolicy(100, 32)
    assert feed(policy, 0, 0) == [1]
    for _ in range(10):
        assert feed(policy, 0, 0) == []
    assert policy.window == 1


def test_retracted_blocks_are_offered_again() -> None:
    policy = PrefetchPolicy(100, 8)
    feed(policy, 0, 0)
    ahead = feed(policy, 1, 1)
    assert ahead == [2, 3]
    policy.retract(3)  # the fetcher had no room for 3
    assert feed(policy, 1, 1) == [3]
    policy.retract(2)
    assert feed(policy, 2, 2) == [3, 4, 5, 6]  # 2 is being read: not offered


def test_a_full_window_is_topped_up_a_batch_at_a_time() -> None:
    """batch=4 (4 blocks per request): a steady scan gets its prefetches 4 at a
    time, and keeps between window - 3 and window blocks ahead of the reader."""
    policy = PrefetchPolicy(1000, 16, batch=4)
    issued: list[int] = []
    for b in range(200):
        ahead = feed(policy, b, b)
        issued += ahead
        if b >= 8:
            assert len(ahead) in (0, 4)
            assert 16 - 3 <= max(issued) - b <= 16
    assert issued == list(range(1, 200 + 16 - 3 + 1))[: len(issued)]
    # The growing window still starts at once: 1, then 2 blocks ahead.
    policy = PrefetchPolicy(1000, 16, batch=4)
    assert feed(policy, 0, 0) == [1]
    assert feed(policy, 1, 1) == [2, 3]
    # And the tail of the file is handed out even when shorter than a batch.
    policy = PrefetchPolicy(10, 16, batch=4)
    got = [b for i in range(10) for b in feed(policy, i, i)]
    assert got == list(range(1, 10))


def test_empty_and_out_of_range_reads() -> None:
    assert PrefetchPolicy(0, 8).on_read(0, 0) == []
    policy = PrefetchPolicy(5, 8)
    assert policy.on_read(7, 9) == []
    assert policy.on_read(3, 2) == []
    assert feed(policy, 0, 10) == []  # clipped to the last block: nothing left
