"""Write-behind of small files (transfer.behind): the slabs, and a download
whose local writes are stalled keeps its GETs going."""

from __future__ import annotations

import mmap
import random
import threading
from pathlib import Path

import pytest

from datamount.errors import StorageError
from datamount.storage.memory import MemoryStore
from datamount.transfer import partfile
from datamount.transfer.behind import Slabs
from datamount.transfer.downloader import BEHIND_SLABS_PER_THREAD, Downloader, DownloadOptions

pytestmark = pytest.mark.unit

rng = random.Random(5)


def test_slabs_are_page_aligned_and_bounded() -> None:
    slabs = Slabs(3, 5000)
    assert slabs.size == 2 * mmap.PAGESIZE and slabs.available == 3
    taken = [slabs.take() for _ in range(3)]
    assert slabs.available == 0
    for view in taken:
        assert len(view) == slabs.size
        view[:4] = b"abcd"  # writable
    addresses = {id(view.obj) for view in taken}
    assert len(addresses) == 1  # carved out of one mmap
    got: list[memoryview] = []
    waiter = threading.Thread(target=lambda: got.append(slabs.take()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # every slab is out: take waits
    slabs.give(taken[1])
    waiter.join(5)
    assert got and got[0] is taken[1]


@pytest.mark.parametrize("count,size", [(0, 10), (2, 0)])
def test_slabs_refuse_an_empty_pool(count: int, size: int) -> None:
    with pytest.raises(ValueError):
        Slabs(count, size)


class CountingStore(MemoryStore):
    """A MemoryStore that counts whole reads and opens `gate` after `until` of them."""

    def __init__(self, objects: dict[str, bytes], until: int) -> None:
        super().__init__(objects)
        self.reads = 0
        self.until = until
        self.gate = threading.Event()
        self._count_lock = threading.Lock()

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        n = super().read_into(key, offset, buffer, etag=etag)
        with self._count_lock:
            self.reads += 1
            if self.reads >= self.until:
                self.gate.set()
        return n


def test_stalled_disk_writes_hold_no_get_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every local write waits until all files were fetched: with the writes on
    the fetch threads this would stop after `threads` GETs (the gate's timeout)."""
    threads = 2
    files = threads * BEHIND_SLABS_PER_THREAD  # as many files as slabs
    blobs = {f"d/f{i:02d}.bin": rng.randbytes(4096 * (1 + i % 3)) for i in range(files)}
    store = CountingStore(blobs, until=files)
    write = partfile.PartFile.write

    def stalled(self: partfile.PartFile, view: memoryview, offset: int) -> None:
        assert store.gate.wait(10), "the GETs stopped while writes waited"
        write(self, view, offset)

    monkeypatch.setattr(partfile.PartFile, "write", stalled)
    options = DownloadOptions(threads=threads, reserved_free_disk_space=0)
    result = Downloader(store, options).download("d/", tmp_path, is_file=False, source_id="t")
    assert result.files == files and store.reads == files
    for rel, body in blobs.items():
        assert (tmp_path / rel.removeprefix("d/")).read_bytes() == body
    assert not list(tmp_path.rglob("*.part"))


def test_a_failed_fetch_leaves_no_part_and_no_slab_out(tmp_path: Path) -> None:
    blobs = {f"f{i}.bin": rng.randbytes(1000) for i in range(6)}
    store = MemoryStore(blobs)
    downloader = Downloader(store, DownloadOptions(threads=2, reserved_free_disk_space=0))
    original = store.read_into

    def failing(key: str, offset: int, buffer: memoryview, *, etag: str | None = None) -> int:
        if key == "f3.bin":
            raise StorageError("f3.bin: refused", transient=False)
        return original(key, offset, buffer, etag=etag)

    store.read_into = failing  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="refused"):
        downloader.download("", tmp_path, is_file=False, source_id="t")
    assert not list(tmp_path.rglob("*.part"))
    assert downloader._slabs.available == downloader._slabs.count
