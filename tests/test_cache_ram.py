"""MemoryCache: LRU order, the byte bound, capacity 0 and oversized blocks,
eviction counts; a hypothesis model check of random put/get sequences."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.ram import MemoryCache
from datamount.read.stats import MountStats

pytestmark = pytest.mark.unit


def key(index: int, etag: str = "e1") -> BlockKey:
    return BlockKey(ObjectId("acct/c", "f.bin", etag, 1 << 30), index)


def data(index: int, size: int = 10) -> bytes:
    return bytes([index % 256]) * size


def test_least_recently_used_goes_first() -> None:
    stats = MountStats()
    cache = MemoryCache(30, stats)
    for i in range(3):
        cache.put(key(i), data(i))
    assert cache.get(key(0)) == data(0)  # 0 is now the most recent; 1 the least
    cache.put(key(3), data(3))
    assert [cache.contains(key(i)) for i in range(4)] == [True, False, True, True]
    assert stats.ram_evictions == 1
    assert cache.used_bytes == 30


def test_contains_does_not_refresh() -> None:
    cache = MemoryCache(30)
    for i in range(3):
        cache.put(key(i), data(i))
    assert cache.contains(key(0))
    cache.put(key(3), data(3))
    assert not cache.contains(key(0))


def test_bound_is_in_bytes_not_blocks() -> None:
    stats = MountStats()
    cache = MemoryCache(100, stats)
    cache.put(key(0), data(0, 40))
    cache.put(key(1), data(1, 40))
    cache.put(key(2), data(2, 70))  # needs both out: 40 + 70 > 100, 70 alone fits
    assert not cache.contains(key(0)) and not cache.contains(key(1))
    assert cache.get(key(2)) == data(2, 70)
    assert cache.used_bytes == 70
    assert stats.ram_evictions == 2


def test_capacity_zero_stores_nothing() -> None:
    cache = MemoryCache(0)
    cache.put(key(0), data(0, 1))
    assert cache.get(key(0)) is None
    assert cache.used_bytes == 0 and len(cache) == 0


def test_block_larger_than_capacity_is_not_stored_and_evicts_nothing() -> None:
    stats = MountStats()
    cache = MemoryCache(100, stats)
    cache.put(key(0), data(0, 60))
    cache.put(key(1), data(1, 101))
    assert not cache.contains(key(1))
    assert cache.get(key(0)) == data(0, 60)
    assert stats.ram_evictions == 0


def test_block_exactly_the_capacity_fits() -> None:
    cache = MemoryCache(100)
    cache.put(key(0), data(0, 30))
    cache.put(key(1), data(1, 100))
    assert cache.get(key(1)) == data(1, 100)
    assert not cache.contains(key(0))


def test_put_again_replaces_and_refreshes() -> None:
    cache = MemoryCache(30)
    for i in range(3):
        cache.put(key(i), data(i))
    cache.put(key(0), data(0))  # refreshed, not counted twice
    assert cache.used_bytes == 30
    cache.put(key(3), data(3))
    assert cache.contains(key(0)) and not cache.contains(key(1))


def test_values_are_returned_without_copying() -> None:
    cache = MemoryCache(1 << 20)
    block = bytes(range(256)) * 1024
    cache.put(key(0), block)
    assert cache.get(key(0)) is block


def test_negative_capacity_is_rejected() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        MemoryCache(-1)


# --- model check ------------------------------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 12), st.integers(1, 60)),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 150), ops=OPS)
def test_random_sequences_match_a_reference_lru(
    capacity: int, ops: list[tuple[str, int, int]]
) -> None:
    stats = MountStats()
    cache = MemoryCache(capacity, stats)
    model: OrderedDict[int, bytes] = OrderedDict()
    evictions = 0
    for op, i, size in ops:
        if op == "put":
            value = data(i, size)
            cache.put(key(i), value)
            if size <= capacity:
                model.pop(i, None)
                while model and sum(map(len, model.values())) + size > capacity:
                    model.popitem(last=False)
                    evictions += 1
                model[i] = value
                assert cache.get(key(i)) == value  # a just-put block that fits is there
                model.move_to_end(i)
        else:
            expected = model.get(i)
            if expected is not None:
                model.move_to_end(i)
            assert cache.get(key(i)) == expected
        assert cache.used_bytes <= capacity
        assert cache.used_bytes == sum(map(len, model.values()))
        assert len(cache) == len(model)
    assert stats.ram_evictions == evictions
