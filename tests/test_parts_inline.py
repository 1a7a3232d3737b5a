"""Part reads on the reader's thread (read/parts.py `read_part_into`): a random
read into a buffer that is one granted part of one block is fetched by the
reader's own thread straight into that buffer; a read over two blocks, or
one whose part starts before it, still goes through the scheduler's workers.
The bytes are a slice of the source every time, and the counters are those
of a part read."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator

import pytest

from datamount.storage.memory import MemoryStore
from test_dense_fill import BS, DATA, Rig

pytestmark = pytest.mark.unit


class ThreadedStore(MemoryStore):
    """A MemoryStore that records the thread of every read_into."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        super().__init__(objects)
        self.threads: list[int] = []

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        self.threads.append(threading.get_ident())
        return super().read_into(key, offset, buffer, etag=etag)


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig(part_align=128)  # 1 KiB blocks: parts rounded out to 128 bytes
    made.store = made.fetcher.store = ThreadedStore({"f": DATA})
    yield made
    made.close()


def read_into(rig: Rig, offset: int, size: int) -> bytes:
    handle = rig.reader.open(rig.obj)
    try:
        view = memoryview(bytearray(size))
        n = handle.read_into(offset, view)
        return bytes(view[:n])
    finally:
        handle.close()


def test_an_aligned_random_read_of_one_block_is_fetched_on_the_readers_thread(
    rig: Rig,
) -> None:
    offset = 40 * BS + 256  # on a part boundary, far from the start: random
    assert read_into(rig, offset, 256) == DATA[offset : offset + 256]
    assert rig.store.threads == [threading.get_ident()]
    snap = rig.stats.snapshot()
    assert snap["part_reads"] == snap["fetch_requests"] == snap["misses"] == 1
    assert snap["bytes_fetched"] == 256 and snap["blocks_fetched"] == 0
    assert not rig.cache.blocks  # a part is never cached


def test_a_read_at_the_end_of_the_file_returns_only_the_bytes_left(rig: Rig) -> None:
    offset = len(DATA) - len(DATA) % BS + 128  # in the last (short) block
    assert read_into(rig, offset, 1024) == DATA[offset:]
    assert rig.store.threads == [threading.get_ident()]
    assert rig.stats.snapshot()["bytes_fetched"] == len(DATA) - offset


def test_an_unaligned_or_two_block_random_read_goes_through_the_workers(rig: Rig) -> None:
    offset = 60 * BS + 100  # its part starts before it: fetched into a buffer of its own
    assert read_into(rig, offset, 100) == DATA[offset : offset + 100]
    across = 70 * BS - 64  # two parts, fetched in parallel
    assert read_into(rig, across, 128) == DATA[across : across + 128]
    assert len(rig.store.threads) == 3
    assert threading.get_ident() not in rig.store.threads
    assert rig.stats.snapshot()["part_reads"] == 3


def test_a_part_read_after_the_fetcher_closed_is_eio(rig: Rig) -> None:
    handle = rig.reader.open(rig.obj)
    rig.fetcher.close()
    with pytest.raises(OSError) as caught:
        handle.read_into(80 * BS, memoryview(bytearray(128)))
    assert caught.value.errno == errno.EIO
    assert rig.store.threads == []
