"""One BlockCache suite, run over MemoryCache, DiskCache and TieredCache (RAM +
disk, and disk behind a disabled RAM tier). Every hit is compared with the
exact bytes that were put; `settle` waits for the disk writers, so the disk
cases read the block back from its file, not from the write queue."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.disk import DiskCache
from datamount.read.cache.protocol import BlockCache
from datamount.read.cache.ram import MemoryCache
from datamount.read.cache.tiered import TieredCache

pytestmark = pytest.mark.unit

MB = 1024 * 1024


def key(
    name: str = "dir/a.bin", etag: str = '"0x1"', index: int = 0, size: int = 10 * MB
) -> BlockKey:
    return BlockKey(ObjectId("acct/container", name, etag, size), index)


def block(seed: int, size: int = 4099) -> bytes:
    return random.Random(seed).randbytes(size)


def disk_cache(root: Path) -> DiskCache:
    return DiskCache(
        root,
        limit=lambda free, used: 64 * MB,
        prune_threshold=1.0,
        prune_target=0.7,
        write_threads=2,
        max_queue_bytes=16 * MB,
    )


@dataclass
class Subject:
    cache: BlockCache
    settle: Callable[[], None]


def _no_wait() -> None:
    return None


@pytest.fixture(params=["memory", "disk", "tiered", "tiered-disk-only"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    disk = disk_cache(tmp_path / "blocks") if request.param != "memory" else None
    settle: Callable[[], None] = _no_wait if disk is None else lambda: _flush(disk)
    cache: BlockCache
    if request.param == "memory":
        cache = MemoryCache(8 * MB)
    elif request.param == "disk":
        assert disk is not None
        cache = disk
    else:
        assert disk is not None
        ram = MemoryCache(8 * MB if request.param == "tiered" else 0)
        cache = TieredCache(ram, disk)
    yield Subject(cache, settle)
    cache.close()


def _flush(disk: DiskCache) -> None:
    assert disk.flush(timeout=30)


def test_round_trip_returns_the_same_bytes(subject: Subject) -> None:
    blocks = {key(index=i): block(i, 1000 + i) for i in range(5)}
    blocks[key("other/ファイル name.bin")] = block(99, 1)
    for k, data in blocks.items():
        subject.cache.put(k, data)
    subject.settle()
    for k, data in blocks.items():
        assert subject.cache.get(k) == data
        assert subject.cache.contains(k)


def test_miss_is_none(subject: Subject) -> None:
    assert subject.cache.get(key()) is None
    assert not subject.cache.contains(key())


@pytest.mark.parametrize(
    "other",
    [
        key(etag='"0x2"'),
        key(index=1),
        key(name="dir/b.bin"),
        key(size=10 * MB + 1),
        BlockKey(ObjectId("acct/other-container", "dir/a.bin", '"0x1"', 10 * MB), 0),
    ],
    ids=["etag", "index", "key", "size", "store"],
)
def test_any_other_identity_is_a_miss(subject: Subject, other: BlockKey) -> None:
    subject.cache.put(key(), block(1))
    subject.settle()
    assert subject.cache.get(other) is None
    assert not subject.cache.contains(other)
    assert subject.cache.get(key()) == block(1)


def test_two_versions_of_one_object_are_kept_apart(subject: Subject) -> None:
    old, new = key(etag='"old"'), key(etag='"new"')
    subject.cache.put(old, block(1))
    subject.cache.put(new, block(2))
    subject.settle()
    assert subject.cache.get(old) == block(1)
    assert subject.cache.get(new) == block(2)


def test_put_twice_keeps_the_block(subject: Subject) -> None:
    subject.cache.put(key(), block(1))
    subject.cache.put(key(), block(1))
    subject.settle()
    subject.cache.put(key(), block(1))
    subject.settle()
    assert subject.cache.get(key()) == block(1)


def test_concurrent_readers_and_writers_see_whole_blocks(subject: Subject) -> None:
    keys = [key(index=i) for i in range(40)]
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(200):
            i = rng.randrange(len(keys))
            if rng.random() < 0.5:
                subject.cache.put(keys[i], block(i, 2048))
            else:
                got = subject.cache.get(keys[i])
                if got is not None and got != block(i, 2048):
                    errors.append(f"block {i} came back different")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    subject.settle()
    for i, k in enumerate(keys):
        got = subject.cache.get(k)
        assert got is None or got == block(i, 2048)


def test_closed_cache_is_a_miss_and_close_is_idempotent(subject: Subject) -> None:
    subject.cache.put(key(), block(1))
    subject.settle()
    subject.cache.close()
    subject.cache.close()
    assert subject.cache.get(key()) is None
    subject.cache.put(key(index=1), block(2))  # ignored, no error
