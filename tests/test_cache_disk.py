"""DiskCache: the file format and its checks (a damaged block is a miss and is
removed), pruning within the bound (the directory is measured before every
write and after), the DATASET_MOUNT_CACHE_SIZE semantics through
Settings.cache_limit on a simulated disk, the bounded write queue, restart
reuse and a prompt close.

Slow writers are made deterministic with a gate: a `limit` callable that the
writer calls before each write and that blocks until the test opens the gate."""

from __future__ import annotations

import contextlib
import os
import random
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache import disk as disk_module
from datamount.read.cache.blockfile import (
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    TMP_DIR,
    encode_header,
)
from datamount.read.cache.disk import DiskCache
from datamount.read.stats import MountStats
from datamount.settings import KB, MB, Settings

pytestmark = pytest.mark.unit

BLOCK = 4096
ETAG = '"0x8DC0FFEE"'


def key(index: int = 0, etag: str = ETAG, name: str = "data/train.bin") -> BlockKey:
    return BlockKey(ObjectId("acct/container", name, etag, 1 << 30), index)


def block(seed: int, size: int = BLOCK) -> bytes:
    return random.Random(seed).randbytes(size)


FILE = len(encode_header(key(), block(0))) + BLOCK  # bytes one block takes on disk


def files(root: Path) -> list[Path]:
    return sorted(Path(top, name) for top, _, names in os.walk(root) for name in names)


def dir_size(root: Path) -> int:
    """Bytes of every file under root, temp files included (writers may be busy)."""
    total = 0
    for path in files(root):
        with contextlib.suppress(FileNotFoundError):  # renamed or pruned meanwhile
            total += path.lstat().st_size
    return total


class Gate:
    """A `limit` callable whose calls wait until the gate opens."""

    def __init__(self, limit: int = 64 * MB) -> None:
        self.limit = limit
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, free: int, used: int) -> int:
        self.entered.set()
        assert self.opened.wait(60), "the test never opened the gate"
        return self.limit


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., DiskCache]]:
    caches: list[DiskCache] = []
    gates: list[Gate] = []

    def build(root: Path | None = None, **kw: Any) -> DiskCache:
        options: dict[str, Any] = {
            "limit": lambda free, used: 64 * MB,
            "prune_threshold": 1.0,
            "prune_target": 0.7,
            "write_threads": 1,
            "max_queue_bytes": 64 * MB,
        }
        options.update(kw)
        if isinstance(options["limit"], Gate):
            gates.append(options["limit"])
        cache = DiskCache(root or tmp_path / "blocks", **options)
        caches.append(cache)
        return cache

    yield build
    for gate in gates:
        gate.opened.set()
    for cache in caches:
        cache.close()


def settle(cache: DiskCache) -> None:
    assert cache.flush(timeout=30)


# --- the file ------------------------------------------------------------------------


def test_block_file_layout(make: Callable[..., DiskCache]) -> None:
    cache = make()
    cache.put(key(), block(1))
    settle(cache)
    path = cache.path_of(key())
    assert files(cache.root) == [path]
    name = path.name.removesuffix(".blk")
    assert path.parent.name == name[:2] and path.parent.parent == cache.root
    raw = path.read_bytes()
    assert raw.startswith(MAGIC)
    assert raw.endswith(block(1)) and len(raw) == FILE
    assert cache.used_bytes == FILE
    assert list((cache.root / TMP_DIR).iterdir()) == []


def _flip_data(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 1])


def _etag(raw: bytes) -> bytes:
    return raw.replace(ETAG.encode(), ETAG.replace("C0FFEE", "C0FFEF").encode())


def _version(raw: bytes) -> bytes:
    return raw[:8] + struct.pack("<H", FORMAT_VERSION + 1) + raw[10:]


def _index(raw: bytes) -> bytes:
    fields = list(HEADER.unpack(raw[: HEADER.size]))
    fields[5] += 1
    return HEADER.pack(*fields) + raw[HEADER.size :]


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "flipped data byte": _flip_data,
    "flipped magic byte": lambda raw: b"X" + raw[1:],
    "truncated": lambda raw: raw[:-100],
    "truncated header": lambda raw: raw[:10],
    "empty": lambda raw: b"",
    "trailing bytes": lambda raw: raw + b"\0",
    "other etag in header": _etag,
    "other format version": _version,
    "other block index": _index,
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_damaged_block_is_a_miss_and_is_removed(
    make: Callable[..., DiskCache], damage: Callable[[bytes], bytes]
) -> None:
    cache = make()
    cache.put(key(), block(1))
    cache.put(key(1), block(2))
    settle(cache)
    path = cache.path_of(key())
    path.write_bytes(damage(path.read_bytes()))
    assert cache.get(key()) is None
    assert not path.exists()
    assert cache.used_bytes == FILE  # only the other block is still counted
    assert cache.get(key(1)) == block(2)
    cache.put(key(), block(1))  # and the block can be cached again
    settle(cache)
    assert cache.get(key()) == block(1)


def test_a_vanished_file_is_a_miss_and_uncounted(make: Callable[..., DiskCache]) -> None:
    cache = make()
    cache.put(key(), block(1))
    settle(cache)
    cache.path_of(key()).unlink()
    assert cache.contains(key())  # the index cannot know yet
    assert cache.get(key()) is None
    assert not cache.contains(key())
    assert cache.used_bytes == 0


def test_a_folder_removed_behind_its_back_is_made_again(
    make: Callable[..., DiskCache], tmp_path: Path
) -> None:
    """Writers make a leaf folder only when the rename finds none (no mkdir
    per block): one removed meanwhile is made again and the block lands."""
    cache = make()
    first = key(0)
    cache.put(first, block(1))
    settle(cache)
    folder = cache.path_of(first).parent
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    assert cache.get(first) is None  # gone: a miss, uncounted
    again = next(k for k in map(key, range(1, 4096)) if cache.path_of(k).parent == folder)
    cache.put(again, block(2))
    settle(cache)
    assert cache.get(again) == block(2)
    assert cache.path_of(again).is_file()


@pytest.mark.parametrize("size", [64 * 1024, 2 * MB, 2 * MB - 1, 300_001])
def test_big_blocks_round_trip_through_o_direct(make: Callable[..., DiskCache], size: int) -> None:
    """Blocks >= DIRECT_MIN are written paged with one O_DIRECT write: the
    header and the data each padded with zeros to whole pages; they read back
    whole (after a restart too)."""
    cache = make(write_threads=2)
    blocks = {i: block(i, size) for i in range(4)}
    for i, data in blocks.items():
        cache.put(key(i), data)
    settle(cache)
    for i, data in blocks.items():
        path = cache.path_of(key(i))
        header = encode_header(key(i), data)
        raw = path.read_bytes()
        pages = -(-len(header) // 4096) * 4096
        assert len(raw) == pages + -(-size // 4096) * 4096
        assert raw[: len(header)] == header and raw[pages : pages + size] == data
        assert not raw[len(header) : pages].strip(b"\0") and not raw[pages + size :].strip(b"\0")
        assert cache.get(key(i)) == data
    assert cache._direct  # the test's folder (ext4 or the like) takes O_DIRECT
    again = make(cache.root)  # a restart reads them from the disk, not a queue
    assert again.wait_ready(10)
    assert [again.get(key(i)) for i in blocks] == list(blocks.values())


def test_without_o_direct_writes_are_buffered(
    make: Callable[..., DiskCache], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refuse_direct(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")  # what tmpfs answers
        return real_open(path, flags, *args)

    monkeypatch.setattr(disk_module.os, "open", refuse_direct)
    cache = make()
    data = block(3, 256 * 1024)
    cache.put(key(), data)
    settle(cache)
    assert not cache._direct
    assert cache.get(key()) == data


def test_a_failed_write_leaves_nothing_counted(make: Callable[..., DiskCache]) -> None:
    cache = make()
    (cache.root / TMP_DIR).rmdir()  # the writer cannot create its temp file
    cache.put(key(), block(1))
    settle(cache)
    assert cache.get(key()) is None
    assert cache.used_bytes == 0
    assert files(cache.root) == []


# --- the bound -----------------------------------------------------------------------


def measured(root: Path, limit: int) -> Callable[[int, int], int]:
    """A `limit` that also checks the directory against it before every write."""

    def check(free: int, used: int) -> int:
        assert dir_size(root) <= limit
        return limit

    return check


@pytest.mark.parametrize(
    ("threshold", "target", "evicted", "kept"),
    [(1.0, 0.5, 6, [6, 7, 8, 9, 10]), (0.5, 0.3, 3, [3, 4, 5])],
)
def test_pruning_from_threshold_to_target(
    make: Callable[..., DiskCache],
    tmp_path: Path,
    threshold: float,
    target: float,
    evicted: int,
    kept: list[int],
) -> None:
    # limit 10 files. threshold 1.0: the 11th write prunes to 0.5 × 10 = 5 files
    # including itself (6 go). threshold 0.5: the 6th write exceeds 5 files and
    # prunes to 3 including itself (3 go).
    root, stats = tmp_path / "blocks", MountStats()
    writes = 11 if threshold == 1.0 else 6
    cache = make(
        root,
        limit=measured(root, 10 * FILE),
        prune_threshold=threshold,
        prune_target=target,
        stats=stats,
    )
    for i in range(writes):
        cache.put(key(i), block(i))
        settle(cache)
    assert stats.disk_evictions == evicted
    assert [i for i in range(writes) if cache.get(key(i)) is not None] == kept
    assert dir_size(root) == len(kept) * FILE == cache.used_bytes


def test_recently_read_blocks_survive_pruning(
    make: Callable[..., DiskCache], tmp_path: Path
) -> None:
    root = tmp_path / "blocks"
    cache = make(root, limit=measured(root, 5 * FILE), prune_target=0.6)
    for i in range(30):
        cache.put(key(i), block(i))
        settle(cache)
        assert cache.get(key(0)) == block(0)  # block 0 stays the most recent
        assert dir_size(root) <= 5 * FILE
    assert cache.get(key(29)) == block(29)


def test_a_block_larger_than_the_bound_is_dropped_without_pruning(
    make: Callable[..., DiskCache],
) -> None:
    stats = MountStats()
    cache = make(limit=lambda free, used: 3 * FILE, stats=stats)
    cache.put(key(0), block(0))
    cache.put(key(1), block(1, 3 * FILE))
    settle(cache)
    assert cache.get(key(1)) is None
    assert cache.get(key(0)) == block(0)
    assert stats.disk_evictions == 0


@pytest.mark.parametrize(
    ("env", "bound"),
    [
        # negative: leave 700 KB of the 1 MiB disk free (more than the reserve)
        (
            {"DATASET_MOUNT_CACHE_SIZE": "-700KB", "DATASET_RESERVED_FREE_DISK_SPACE": "100KB"},
            MB - 700 * KB,
        ),
        # the reserve wins when it is the larger of the two
        (
            {"DATASET_MOUNT_CACHE_SIZE": "-100KB", "DATASET_RESERVED_FREE_DISK_SPACE": "900KB"},
            MB - 900 * KB,
        ),
        # positive: a plain cap
        ({"DATASET_MOUNT_CACHE_SIZE": "200KB", "DATASET_RESERVED_FREE_DISK_SPACE": "0"}, 200 * KB),
        # unset: everything but the reserve
        ({"DATASET_RESERVED_FREE_DISK_SPACE": "600KB"}, MB - 600 * KB),
    ],
)
def test_cache_size_setting_on_a_small_disk(
    make: Callable[..., DiskCache], tmp_path: Path, env: dict[str, str], bound: int
) -> None:
    settings = Settings.from_env(env, cache_dir=tmp_path)
    root, disk = tmp_path / "blocks", MB  # a 1 MiB disk that only the cache uses

    def free() -> int:
        used = dir_size(root)
        assert used <= bound  # checked before every write
        return disk - used

    cache = make(root, limit=settings.cache_limit, free_bytes=free, write_threads=2)
    for i in range(100):  # 400 KiB of blocks: more than any bound above
        cache.put(key(i), block(i))
    settle(cache)
    assert 0.6 * bound < dir_size(root) <= bound  # pruned to ~0.7, then filled again
    for i in range(90):  # reads move the LRU order; writes still stay inside
        cache.get(key(i))
        cache.put(key(1000 + i), block(i))
    settle(cache)
    assert dir_size(root) <= bound
    assert cache.used_bytes == dir_size(root)


def test_many_writers_never_exceed_the_bound(
    make: Callable[..., DiskCache], tmp_path: Path
) -> None:
    root, stats = tmp_path / "blocks", MountStats()
    cache = make(root, limit=measured(root, 8 * FILE), write_threads=4, stats=stats)
    for i in range(200):
        cache.put(key(i), block(i))
    settle(cache)
    assert dir_size(root) <= 8 * FILE
    assert cache.used_bytes == dir_size(root)
    assert stats.disk_evictions > 0


# --- the queue -----------------------------------------------------------------------


def test_full_queue_drops_blocks_and_never_blocks_the_reader(
    make: Callable[..., DiskCache],
) -> None:
    stats, gate = MountStats(), Gate()
    cache = make(limit=gate, max_queue_bytes=4 * BLOCK, stats=stats)
    cache.put(key(0), block(0))
    assert gate.entered.wait(30)  # the only writer is now stuck in block 0
    for i in range(1, 6):  # 3 more fit (block 0 still counts), 2 are dropped
        cache.put(key(i), block(i))
    assert stats.disk_queue_dropped == 2
    assert cache.queued_bytes == 4 * BLOCK
    cache.put(key(0), block(0))  # already queued (or being written): neither again nor dropped
    cache.put(key(3), block(3))
    assert stats.disk_queue_dropped == 2
    assert cache.queued_bytes == 4 * BLOCK
    # Queued blocks are served from the queue while the writer is stuck.
    assert [cache.get(key(i)) == block(i) for i in range(6)] == [True] * 4 + [False] * 2
    assert cache.contains(key(3)) and not cache.contains(key(4))
    gate.opened.set()
    settle(cache)
    assert len(files(cache.root)) == 4
    assert cache.queued_bytes == 0


def test_a_zero_queue_caches_nothing(make: Callable[..., DiskCache]) -> None:
    stats = MountStats()
    cache = make(max_queue_bytes=0, stats=stats)
    cache.put(key(), block(1))
    settle(cache)
    assert cache.get(key()) is None
    assert stats.disk_queue_dropped == 1


def test_close_abandons_the_queue_promptly(make: Callable[..., DiskCache]) -> None:
    gate = Gate()
    cache = make(limit=gate)
    for i in range(5):
        cache.put(key(i), block(i))
    assert gate.entered.wait(30)
    closer = threading.Thread(target=cache.close)
    closer.start()
    for _ in range(3000):  # close() drops the 4 queued blocks at once ...
        if cache.queued_bytes == BLOCK:
            break
        closer.join(0.01)
    assert cache.queued_bytes == BLOCK
    gate.opened.set()  # ... and waits only for the block being written
    closer.join(30)
    assert not closer.is_alive()
    assert len(files(cache.root)) <= 1
    cache.put(key(9), block(9))  # a put after close is ignored
    assert cache.queued_bytes == 0


# --- restart -------------------------------------------------------------------------


def test_restart_reuses_blocks_and_removes_temp_files(
    make: Callable[..., DiskCache], tmp_path: Path
) -> None:
    root = tmp_path / "blocks"
    first = make(root)
    for i in range(6):
        first.put(key(i), block(i))
    settle(first)
    first.close()
    leftover = root / TMP_DIR / "0123.140000.tmp"
    leftover.write_bytes(b"half a block")
    foreign = root / "ab" / "cd" / "notes.txt"
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_bytes(b"not ours")
    old = root / "ab" / "cd" / ("abcd" + "0" * 28 + ".blk")  # the two-level layout of 0.x
    old.write_bytes(b"an old block")
    old_leaf = root / "ab" / "ce"
    old_leaf.mkdir()
    (old_leaf / ("abce" + "1" * 28 + ".blk")).write_bytes(b"another")

    second = make(root)
    assert not leftover.exists()
    assert second.wait_ready(30)
    assert second.used_bytes == 6 * FILE  # the foreign file is neither counted nor removed
    assert all(second.contains(key(i)) for i in range(6))
    assert [second.get(key(i)) for i in range(6)] == [block(i) for i in range(6)]
    assert foreign.exists()
    assert not old.exists() and not old_leaf.exists()  # old blocks and empty old folders go


def test_restart_gets_work_before_the_index_is_built(
    make: Callable[..., DiskCache], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "blocks"
    first = make(root)
    for i in range(3):
        first.put(key(i), block(i))
    settle(first)
    first.close()

    gate = threading.Event()
    original = DiskCache._index_existing

    def slow_index(self: DiskCache) -> None:
        assert gate.wait(30)
        original(self)

    monkeypatch.setattr(DiskCache, "_index_existing", slow_index)
    second = make(root)
    try:
        assert second.get(key(1)) == block(1)  # found by its path
        assert second.contains(key(2))
        second.put(key(7), block(7))
        assert not second.flush(timeout=0.05)  # writers wait for the index
    finally:
        gate.set()
    assert second.wait_ready(30)
    settle(second)
    assert second.used_bytes == 4 * FILE == dir_size(root)  # block 1 not counted twice


def test_restart_prunes_the_oldest_files_first(
    make: Callable[..., DiskCache], tmp_path: Path
) -> None:
    root = tmp_path / "blocks"
    first = make(root)
    for i in range(4):
        first.put(key(i), block(i))
    settle(first)
    first.close()
    for age, i in enumerate([2, 0, 3, 1]):  # 2 is the oldest, 1 the newest
        os.utime(first.path_of(key(i)), ns=(10**18 + age, 10**18 + age))

    second = make(root, limit=lambda free, used: 4 * FILE, prune_target=0.75)
    assert second.wait_ready(30)
    second.put(key(9), block(9))  # prunes to 3 files including itself: 2 and 0 go
    settle(second)
    assert [i for i in (0, 1, 2, 3, 9) if second.get(key(i)) is not None] == [1, 3, 9]


def test_bad_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        DiskCache(
            tmp_path,
            limit=lambda f, u: 0,
            prune_threshold=0.5,
            prune_target=0.7,
            write_threads=1,
            max_queue_bytes=0,
        )


def test_module_constants_describe_the_header() -> None:
    raw = encode_header(key(3), block(1))
    fields = HEADER.unpack(raw[: HEADER.size])
    assert fields[:2] == (MAGIC, FORMAT_VERSION)
    assert fields[5:8] == (3, 1 << 30, BLOCK)
    assert disk_module.block_name(key(3)) != disk_module.block_name(key(3, etag='"other"'))
