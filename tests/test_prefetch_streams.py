"""StreamTable: several sequential streams on one handle each keep their own
window; a single stream behaves as one PrefetchPolicy; random readers still
prefetch (almost) nothing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamount.read.prefetch.policy import PrefetchPolicy
from datamount.read.prefetch.streams import MAX_STREAMS, StreamCensus, StreamTable

pytestmark = pytest.mark.unit


def feed(
    table: StreamTable, first: int, last: int, span: tuple[int, int] | None = None
) -> list[int]:
    """on_read plus the invariants every call must keep."""
    ahead = table.on_read(first, last, span)
    assert 0 <= table.window <= table.max_window
    assert len(ahead) <= table.window
    assert ahead == list(range(ahead[0], ahead[0] + len(ahead))) if ahead else True
    assert all(last < b < table.block_count for b in ahead)
    assert table.streams <= table.max_streams
    return ahead


READ = 16  # reads per block: the kernel's requests are smaller than a block


def interleaved(parts: int, blocks: int, seed: int) -> list[tuple[int, tuple[int, int]]]:
    """(block, byte span) of the reads of `parts` readers, each sequential
    over its own part of `blocks` in reads of 1/READ block, interleaved in
    bursts of 1 to 4 reads in a random order (threads on one handle)."""
    rng = random.Random(seed)
    size = blocks * READ // parts
    cursors = [p * size for p in range(parts)]
    ends = [(p + 1) * size for p in range(parts)]
    reads = []
    while any(c < e for c, e in zip(cursors, ends, strict=True)):
        p = rng.choice([i for i in range(parts) if cursors[i] < ends[i]])
        for _ in range(min(rng.randint(1, 4), ends[p] - cursors[p])):
            reads.append((cursors[p] // READ, (cursors[p], cursors[p] + 1)))
            cursors[p] += 1
    return reads


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_interleaved_streams_are_prefetched_ahead_of_their_readers(parts: int, seed: int) -> None:
    blocks = 1024
    table = StreamTable(blocks, 16, batch=4, slack=4)
    prefetched: list[int] = []
    missed: set[int] = set()
    for block, span in interleaved(parts, blocks, seed):
        if block not in prefetched:
            missed.add(block)
        prefetched += feed(table, block, block, span)
    # Only the first blocks (two or three) of each part are read before its stream is
    # known; every other block was prefetched before it was read, once, but
    # for the window a stream runs on past its part's end into the next.
    assert len(missed) <= 3 * parts
    assert len(prefetched) - len(set(prefetched)) <= (parts - 1) * table.max_window
    assert len(set(prefetched)) >= blocks - 3 * parts


def test_one_policy_loses_interleaved_streams_the_table_keeps_them() -> None:
    """The single-window baseline: interleaved streams reset each other."""
    blocks, reads = 400, interleaved(4, 400, 7)
    single = PrefetchPolicy(blocks, 16, 4, slack=4)
    table = StreamTable(blocks, 16, 4, slack=4)
    one: set[int] = set()
    four: set[int] = set()
    for block, span in reads:
        one.update(single.on_read(block, block))
        four.update(table.on_read(block, block, span))
    assert len(one) < blocks * 3 // 4
    assert len(four) >= blocks - 8


def test_a_single_scan_is_what_one_policy_returns() -> None:
    blocks = 300
    single = PrefetchPolicy(blocks, 8, batch=2, slack=2)
    table = StreamTable(blocks, 8, batch=2, slack=2)
    for block in [0, 1, 3, 2, 4, 5, 9, 6, 7, 8, *range(10, 300)]:
        assert table.on_read(block, block) == single.on_read(block, block)
        assert table.window == single.window


def test_a_scan_after_a_random_jump_grows_again_from_one() -> None:
    table = StreamTable(1000, 16)
    assert feed(table, 500, 500) == []  # first read not at 0: wait and see
    assert feed(table, 501, 501) == [502]
    assert feed(table, 502, 502) == [503, 504]
    assert table.streams == 1
    assert feed(table, 10, 10) == []  # a jump: the candidate, window 0
    assert table.window == 0
    assert feed(table, 11, 11) == [12]  # a second stream
    assert table.streams == 2
    assert feed(table, 503, 503) == [505, 506, 507]  # the first kept its window


def test_the_least_recent_stream_leaves_a_full_table() -> None:
    table = StreamTable(10_000, 4, max_streams=3)
    for start in (0, 1000, 2000, 3000):
        feed(table, start + 1, start + 1)
        feed(table, start + 2, start + 2)
    assert table.streams == 3
    assert feed(table, 3, 3) == []  # the stream at 0 was dropped: a candidate again
    assert feed(table, 2003, 2003) != []


def test_an_idle_stream_is_dropped() -> None:
    table = StreamTable(100_000, 4, idle_reads=10)
    feed(table, 0, 0)
    assert table.streams == 1
    rng = random.Random(3)
    for _ in range(11):  # random reads: none taken by the stream
        block = rng.randrange(50_000, 100_000)
        feed(table, block, block)
    assert table.streams == 0


def test_retracted_blocks_go_back_to_their_own_stream() -> None:
    table = StreamTable(1000, 8)
    feed(table, 0, 0)
    assert feed(table, 1, 1) == [2, 3]
    feed(table, 500, 500)
    assert feed(table, 501, 501) == [502]
    table.retract(3)  # the fetcher had no room for 3 (stream at 0)
    assert feed(table, 1, 1) == [3]
    table.retract(502)
    assert feed(table, 501, 501) == [502]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_window=st.integers(1, 64))
def test_random_reads_on_a_large_file_prefetch_nothing(seed: int, max_window: int) -> None:
    rng = random.Random(seed)
    blocks = 1_000_000
    table = StreamTable(blocks, max_window)
    prefetched: list[int] = []
    for _ in range(300):
        first = rng.randrange(blocks)
        prefetched += feed(table, first, min(first + rng.randrange(2), blocks - 1))
    assert len(prefetched) <= 1  # only if the very first read was at block 0


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_reads_on_a_small_file_prefetch_little(seed: int) -> None:
    """As for one policy (tests/test_prefetch_policy.py): the streams kept
    beside the candidate do not catch more random reads."""
    rng = random.Random(seed)
    blocks, reads = 200, 200
    table = StreamTable(blocks, 32)
    prefetched = sum(len(feed(table, b, b)) for b in (rng.randrange(blocks) for _ in range(reads)))
    assert prefetched <= reads // 5


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_streams"):
        StreamTable(10, 4, max_streams=0)
    assert StreamTable(10, 4).idle_reads == 2 * MAX_STREAMS


def test_streams_keep_to_their_share_of_the_census_budget() -> None:
    """One stream may grow to the whole budget; with more, each keeps at most
    an equal part of it, and the streams of closed handles leave the census."""
    census = StreamCensus(24)
    alone = StreamTable(10_000, 32, batch=4, census=census)
    for block in range(40):
        feed(alone, block, block)
    assert (alone.window, census.streams) == (24, 1)
    tables = [StreamTable(10_000, 32, batch=4, census=census) for _ in range(7)]
    for step in range(40):
        for t, table in enumerate(tables):
            feed(table, 1000 * (t + 1) + step, 1000 * (t + 1) + step)
            assert table.window <= max(1, 24 // census.streams)
    feed(alone, 40, 40)
    assert census.streams == 8
    assert alone.window == 3  # shrunk to its share
    small = StreamTable(1, 32, census=census)  # one block: nothing to prefetch, no share
    feed(small, 0, 0)
    assert census.streams == 8
    for table in [alone, *tables, small]:
        table.close()
    assert census.streams == 0
    with pytest.raises(ValueError, match="blocks"):
        StreamCensus(0)
