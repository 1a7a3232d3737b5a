"""TieredCache: RAM then disk, promotion of disk hits, one lookup counter per
get, a failing tier is a miss, disabled tiers, and a put that never waits for
the disk writers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.disk import DiskCache
from datamount.read.cache.protocol import NoCache
from datamount.read.cache.ram import MemoryCache
from datamount.read.cache.tiered import TieredCache
from datamount.read.stats import MountStats

pytestmark = pytest.mark.unit

BLOCK = 1000


def key(index: int) -> BlockKey:
    return BlockKey(ObjectId("acct/c", "f.bin", "e1", 1 << 20), index)


def data(index: int) -> bytes:
    return bytes([index % 256]) * BLOCK


class Broken:
    """A tier whose every call fails."""

    def get(self, key: BlockKey) -> bytes | None:
        raise OSError("tier broken")

    def put(self, key: BlockKey, data: bytes) -> None:
        raise OSError("tier broken")

    def contains(self, key: BlockKey) -> bool:
        raise OSError("tier broken")

    def close(self) -> None:
        raise OSError("tier broken")


class Gate:
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, free: int, used: int) -> int:
        self.entered.set()
        assert self.opened.wait(60)
        return 1 << 30


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.opened.set()


def disk(root: Path, stats: MountStats, limit: object = None) -> DiskCache:
    return DiskCache(
        root,
        limit=limit if callable(limit) else (lambda free, used: 1 << 30),
        prune_threshold=1.0,
        prune_target=0.7,
        write_threads=1,
        max_queue_bytes=1 << 20,
        stats=stats,
    )


def counts(stats: MountStats) -> tuple[int, int, int]:
    return stats.ram_hits, stats.disk_hits, stats.misses


def test_ram_then_disk_and_a_disk_hit_is_promoted(tmp_path: Path) -> None:
    stats = MountStats()
    ram, lower = MemoryCache(2 * BLOCK, stats), disk(tmp_path, stats)
    cache = TieredCache(ram, lower, stats)
    for i in range(3):
        cache.put(key(i), data(i))
    assert lower.flush(30)
    assert not ram.contains(key(0))  # evicted from RAM, still on disk
    assert cache.contains(key(0))

    assert cache.get(key(0)) == data(0)
    assert counts(stats) == (0, 1, 0)
    assert ram.contains(key(0))  # promoted
    assert cache.get(key(0)) == data(0)
    assert counts(stats) == (1, 1, 0)
    assert cache.get(key(9)) is None
    assert counts(stats) == (1, 1, 1)
    assert stats.ram_evictions == 2  # key 0 by key 2, then key 1 by the promotion
    cache.close()


def test_contains_counts_nothing(tmp_path: Path) -> None:
    stats = MountStats()
    cache = TieredCache(MemoryCache(10 * BLOCK), NoCache(), stats)
    cache.put(key(0), data(0))
    assert cache.contains(key(0)) and not cache.contains(key(1))
    assert counts(stats) == (0, 0, 0)


def test_put_does_not_wait_for_the_disk_writer(tmp_path: Path, gate: Gate) -> None:
    stats = MountStats()
    slow = disk(tmp_path, stats, gate)
    cache = TieredCache(MemoryCache(10 * BLOCK), slow, stats)
    cache.put(key(0), data(0))
    assert gate.entered.wait(30)  # the writer is stuck inside block 0
    for i in range(1, 5):
        cache.put(key(i), data(i))  # returns at once: only enqueued
    assert [cache.get(key(i)) for i in range(5)] == [data(i) for i in range(5)]
    assert counts(stats) == (5, 0, 0)
    gate.opened.set()
    assert slow.flush(30)
    cache.close()


@pytest.mark.parametrize("broken", ["ram", "disk"])
def test_a_failing_tier_is_a_miss(tmp_path: Path, broken: str) -> None:
    stats = MountStats()
    good = MemoryCache(10 * BLOCK)
    cache = (
        TieredCache(Broken(), good, stats)
        if broken == "ram"
        else TieredCache(good, Broken(), stats)
    )
    cache.put(key(0), data(0))
    assert cache.get(key(0)) == data(0)
    assert cache.contains(key(0))
    assert cache.get(key(1)) is None
    hit = (0, 1, 1) if broken == "ram" else (1, 0, 1)
    assert counts(stats) == hit
    cache.close()  # the broken tier's close is logged, not raised


def test_both_tiers_disabled_counts_misses() -> None:
    stats = MountStats()
    cache = TieredCache(MemoryCache(0), NoCache(), stats)
    cache.put(key(0), data(0))
    assert cache.get(key(0)) is None
    assert not cache.contains(key(0))
    assert counts(stats) == (0, 0, 1)


def test_ram_tier_off_serves_every_hit_from_disk(tmp_path: Path) -> None:
    stats = MountStats()
    lower = disk(tmp_path, stats)
    cache = TieredCache(MemoryCache(0), lower, stats)
    cache.put(key(0), data(0))
    assert lower.flush(30)
    assert [cache.get(key(0)) for _ in range(3)] == [data(0)] * 3
    assert counts(stats) == (0, 3, 0)
    cache.close()


def test_stats_default_to_a_private_counter() -> None:
    cache = TieredCache(MemoryCache(BLOCK), NoCache())
    cache.get(key(0))
    assert cache.stats.misses == 1
