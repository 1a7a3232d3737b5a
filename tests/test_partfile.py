"""transfer.partfile, the `.part` file the Downloader and its worker
processes share: bytes land by position whatever the alignment, O_DIRECT is
used where the filesystem takes it and dropped (for the rest of the
download) where it does not, a size mismatch is a DataError, a short read a
StorageError, and a blob that keeps changing gives up after max_restarts."""

from __future__ import annotations

import errno
import logging
import os
import random
from pathlib import Path
from typing import Any

import pytest

from datamount.errors import DataError, StorageError
from datamount.storage.memory import MemoryStore
from datamount.transfer import partfile
from datamount.transfer.partfile import (
    ALIGN,
    DIRECT_MIN,
    Buffers,
    DirectIO,
    PartFile,
    changed,
    read_range,
)

pytestmark = pytest.mark.unit


def fill(part: PartFile, body: bytes, step: int) -> None:
    """Write `body` in `step`s from a page-aligned buffer, as a download does."""
    buf = Buffers(step).get()
    for offset in range(0, len(body), step):
        chunk = body[offset : offset + step]
        buf[: len(chunk)] = chunk
        part.write(buf[: len(chunk)], offset)


@pytest.mark.parametrize(
    "size", [0, 1, ALIGN, DIRECT_MIN - 1, DIRECT_MIN, 3 * DIRECT_MIN + 5, 4 * DIRECT_MIN]
)
def test_bytes_land_by_position_aligned_or_not(tmp_path: Path, size: int) -> None:
    body = random.Random(size).randbytes(size)
    part = PartFile(tmp_path / ".f.part")
    direct = DirectIO(True)
    part.open(size, direct)
    try:
        if direct.enabled and size >= DIRECT_MIN:  # ext4 and the like take O_DIRECT
            aligned = size % ALIGN == 0
            assert bool(os.O_DIRECT & _flags(part.fd)) == aligned  # every write aligned
            assert (part.dfd >= 0) == (not aligned)  # else a second fd for the aligned ranges
        assert os.fstat(part.fd).st_size == size  # pre-sized
        fill(part, body, DIRECT_MIN // 2)
        assert part.check(size).st_size == size
    finally:
        part.close()
    assert (part.fd, part.dfd) == (-1, -1)
    assert (tmp_path / ".f.part").read_bytes() == body


def test_small_files_and_stores_without_ranges_stay_buffered(tmp_path: Path) -> None:
    part = PartFile(tmp_path / ".f.part")
    direct = DirectIO(True)
    part.open(4 * DIRECT_MIN, direct, ranges=False)
    try:
        assert part.dfd == -1
        assert not os.O_DIRECT & _flags(part.fd)
    finally:
        part.close()
    assert direct.enabled


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


def test_a_filesystem_refusing_o_direct_turns_it_off_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As tmpfs (before Linux 6.6) and some FUSE filesystems: EINVAL on
    O_DIRECT. One line says so; every later file is buffered, bytes equal."""
    real_open = os.open

    def refuse_direct(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(partfile.os, "open", refuse_direct)
    log = logging.getLogger("datamount.transfer.download")
    caplog.set_level("INFO", logger=log.name)
    direct = DirectIO(True, log)
    for name, size in (("a", 2 * DIRECT_MIN), ("b", 2 * DIRECT_MIN + 1), ("c", 4 * DIRECT_MIN)):
        body = random.Random(size).randbytes(size)
        part = PartFile(tmp_path / f".{name}.part")
        part.open(size, direct)
        assert part.dfd == -1
        fill(part, body, ALIGN)
        part.check(size)
        part.close()
        assert (tmp_path / f".{name}.part").read_bytes() == body
    assert not direct.enabled
    assert caplog.text.count("O_DIRECT unavailable in") == 1
    assert f"O_DIRECT unavailable in {tmp_path} (Invalid argument): buffered writes" in caplog.text


def test_a_size_mismatch_is_a_data_error_and_closes(tmp_path: Path) -> None:
    part = PartFile(tmp_path / ".f.part")
    part.open(10, DirectIO(False))
    os.ftruncate(part.fd, 7)
    with pytest.raises(DataError, match=r"\.f\.part: size 7 after download, expected 10"):
        part.check(10)
    assert part.fd == -1


def test_reopen_truncates_for_a_restart(tmp_path: Path) -> None:
    part = PartFile(tmp_path / ".f.part")
    part.open(8, DirectIO(False))
    part.write(memoryview(b"old-data"), 0)
    part.open(3, DirectIO(False))  # the new version, from nothing
    part.write(memoryview(b"new"), 0)
    part.check(3)
    part.close()
    assert (tmp_path / ".f.part").read_bytes() == b"new"


def test_buffers_are_page_aligned_and_one_per_thread() -> None:
    import threading

    buffers = Buffers(3 * ALIGN)
    mine = buffers.get()
    assert buffers.get() is mine and len(mine) == 3 * ALIGN
    other: list[memoryview] = []
    thread = threading.Thread(target=lambda: other.append(buffers.get()))
    thread.start()
    thread.join()
    assert other[0].obj is not mine.obj


def test_read_range_fills_the_view_and_refuses_a_short_read() -> None:
    store = MemoryStore({"k": b"0123456789"})
    etag = store.stat("k").etag
    view = memoryview(bytearray(4))
    read_range(store, "k", 3, view, etag)
    assert bytes(view) == b"3456"
    with pytest.raises(StorageError, match=r"k: short read at 8 \(2 of 4 bytes\)"):
        read_range(store, "k", 8, view, etag)


def test_changed_gives_the_new_version_until_max_restarts() -> None:
    store = MemoryStore({"k": b"abc"})
    assert changed(store, "k", 3, 3).size == 3
    with pytest.raises(DataError, match="k: changed 4 times during the download; giving up"):
        changed(store, "k", 4, 3)


def test_o_direct_files_get_their_blocks_allocated_up_front(tmp_path: Path) -> None:
    """Where O_DIRECT is taken, the .part's blocks are allocated at open
    (concurrent O_DIRECT writes into a sparse ext4 file queue on its inode
    lock); a buffered .part, or one of a single range, stays sparse until
    written. Bytes land as before."""
    size = partfile.ALLOCATE_ABOVE + 4 * DIRECT_MIN
    direct = DirectIO(True)
    part = PartFile(tmp_path / ".d.part")
    part.open(size, direct)
    try:
        if not direct.enabled:
            pytest.skip("this filesystem refuses O_DIRECT")
        st = os.fstat(part.fd)
        if st.st_blocks * 512 < size:
            pytest.skip("this filesystem does not allocate (fallocate refused)")
        assert st.st_size == size
        body = random.Random(5).randbytes(size)
        fill(part, body, 1 << 20)
        part.check(size)
    finally:
        part.close()
    assert (tmp_path / ".d.part").read_bytes() == body
    for name, length, ranges in (("b", size, False), ("s", partfile.ALLOCATE_ABOVE, True)):
        sparse = PartFile(tmp_path / f".{name}.part")
        sparse.open(length, direct, ranges=ranges)  # buffered, or a single range
        try:
            st = os.fstat(sparse.fd)
            assert (st.st_size, st.st_blocks) == (length, 0)
        finally:
            sparse.close()


def test_allocate_refused_is_false_and_the_caller_truncates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partfile, "_fallocate", lambda: None)  # no fallocate(2) here
    direct = DirectIO(True)
    part = PartFile(tmp_path / ".n.part")
    size = 2 * partfile.ALLOCATE_ABOVE
    part.open(size, direct)
    try:
        st = os.fstat(part.fd)
        assert (st.st_size, st.st_blocks) == (size, 0)
    finally:
        part.close()
