"""The disk tier's block files (read/cache/blockfile.py): unnamed temp files
linked in place, the named-temp fallback, a stale file under the final name,
the O_DIRECT write from a block's own page-aligned buffer."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datamount.read import copy
from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache import blockfile
from datamount.read.cache.blockfile import TMP_DIR, BlockFiles, block_name, encode_header

pytestmark = pytest.mark.unit


def key(index: int = 0) -> BlockKey:
    return BlockKey(ObjectId("acct/container", "data/x.bin", '"0x1"', 1 << 20), index)


def make(tmp_path: Path) -> BlockFiles:
    (tmp_path / TMP_DIR).mkdir(parents=True, exist_ok=True)
    return BlockFiles(tmp_path)


@pytest.mark.parametrize("size", [1000, 256 * 1024, 256 * 1024 + 100])
def test_a_written_block_reads_back_and_leaves_no_temp_file(tmp_path: Path, size: int) -> None:
    files = make(tmp_path)
    data = random.Random(size).randbytes(size)
    name = block_name(key())
    header = encode_header(key(), data)
    written = files.write(name, header, data)
    files.close()
    assert files.tmpfile  # ext4 or the like takes O_TMPFILE
    paged = size >= blockfile.DIRECT_MIN  # written with O_DIRECT: whole pages
    assert written == files.file_size(len(header), size) == os.path.getsize(files.path(name))
    assert written == (
        -(-len(header) // 4096) * 4096 + -(-size // 4096) * 4096 if paged else len(header) + size
    )
    assert blockfile.read(files.path(name), key()) == (data, written)
    assert blockfile.read(files.path(name), key(1)) is None  # another block's key
    assert list((tmp_path / TMP_DIR).iterdir()) == []


def test_without_o_tmpfile_a_named_temp_file_is_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refuse_tmpfile(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args)

    monkeypatch.setattr(blockfile.os, "open", refuse_tmpfile)
    monkeypatch.setattr(blockfile, "write_file", lambda *args: errno.EOPNOTSUPP)
    files = make(tmp_path)
    data = random.Random(1).randbytes(300_001)
    for i in range(3):
        files.write(block_name(key(i)), encode_header(key(i), data), data)
    files.close()
    assert not files.tmpfile
    assert all(blockfile.read(files.path(block_name(key(i))), key(i)) for i in range(3))
    assert list((tmp_path / TMP_DIR).iterdir()) == []


def test_a_stale_file_under_the_final_name_is_replaced(tmp_path: Path) -> None:
    files = make(tmp_path)
    name = block_name(key())
    final = Path(files.path(name))
    final.parent.mkdir()
    final.write_bytes(b"left by a crash")
    data = b"x" * 5000
    files.write(name, encode_header(key(), data), data)
    files.close()
    found = blockfile.read(str(final), key())
    assert found is not None and found[0] == data


@pytest.mark.parametrize("paged", [False, True])
def test_either_layout_reads_back_and_any_other_size_or_a_flipped_data_byte_is_refused(
    tmp_path: Path, paged: bool
) -> None:
    """The file size says which layout a block file has (compact: written by
    buffered writes and by earlier versions; paged: O_DIRECT)."""
    data = random.Random(7).randbytes(300_001)
    header = encode_header(key(), data)
    offset, size = blockfile.layout(len(header), len(data), paged)
    raw = bytearray(size)
    raw[: len(header)] = header
    raw[offset : offset + len(data)] = data
    path = tmp_path / "b.blk"
    path.write_bytes(raw)
    assert blockfile.read(str(path), key()) == (data, size)
    path.write_bytes(raw + b"\0")  # neither layout's size
    assert blockfile.read(str(path), key()) is None
    raw[offset + 12345] ^= 1
    path.write_bytes(raw)
    assert blockfile.read(str(path), key()) is None


def aligned_block(size: int, seed: int = 0) -> memoryview:
    """A block as the fetcher makes it: its own page-aligned buffer."""
    view = copy.empty(size)
    view[:] = random.Random(seed).randbytes(size)
    return view.toreadonly()


def address(view: Any) -> int:
    return int(np.frombuffer(view, np.uint8).__array_interface__["data"][0])


@pytest.mark.parametrize("size", [64 * 1024 - 1, 64 * 1024, 2 << 20, (2 << 20) - 1, 300_001])
def test_empty_buffers_from_64_kib_start_on_a_page(size: int) -> None:
    view = copy.empty(size)
    assert len(view) == size and view.format == "B" and not view.readonly
    # Other memory (a bytes object starts on a page by chance, 1 in 256 of
    # malloc's 16-byte steps): odd by construction.
    assert not copy.page_aligned(memoryview(bytearray(size + 1))[1:])
    if size < copy.GIL_FREE_MIN:  # plain malloc: on a page only by chance
        return
    assert address(view) % 4096 == 0 and copy.page_aligned(view)
    readonly = view.toreadonly()  # as the caches keep a block: still its array's start
    assert copy.page_aligned(readonly)
    assert not copy.page_aligned(readonly[1:])  # a slice of it: its own start counts
    assert copy.page_aligned(readonly[4096:])


@pytest.mark.parametrize("size", [64 * 1024, 2 << 20, (2 << 20) - 1, 300_001])
def test_an_aligned_block_is_written_from_its_own_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """One write of the header page, the block's whole pages from its own
    buffer (no copy), the last partial page copied; the file is the paged
    layout byte for byte."""
    calls: list[list[int]] = []
    real = blockfile.write_file

    def spy(folder: str, direct: bool, views: list[memoryview], root: int, name: str) -> int:
        calls.append([address(v) for v in views])
        assert direct
        return real(folder, direct, views, root, name)

    monkeypatch.setattr(blockfile, "write_file", spy)
    files = make(tmp_path)
    Path(files.path(block_name(key()))).parent.mkdir()  # not the folder's first block
    data = aligned_block(size, size)
    header = encode_header(key(), data)
    written = files.write(block_name(key()), header, data)
    files.close()
    assert len(calls) == 1 and calls[0][1] == address(data)
    assert len(calls[0]) == (2 if size % 4096 == 0 else 3)
    raw = Path(files.path(block_name(key()))).read_bytes()
    pages = -(-len(header) // 4096) * 4096
    assert len(raw) == written == pages + -(-size // 4096) * 4096
    assert raw[: len(header)] == header and raw[pages : pages + size] == bytes(data)
    assert not raw[len(header) : pages].strip(b"\0") and not raw[pages + size :].strip(b"\0")
    assert blockfile.read(files.path(block_name(key())), key()) == (bytes(data), written)


def test_an_unaligned_block_is_copied_and_a_refused_buffer_falls_back_to_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.pwritev

    def refuse(fd: int, views: list[memoryview], offset: int) -> int:
        if len(views) == 1:  # one aligned buffer: taken
            return real(fd, views, offset)
        calls.append(len(views))
        raise OSError(errno.EINVAL, "Invalid argument")  # a device wanting more alignment

    monkeypatch.setattr(blockfile.os, "pwritev", refuse)
    # the one-call write meets the same device: refused, the steps take over
    monkeypatch.setattr(blockfile, "write_file", lambda *args: errno.EINVAL)
    files = make(tmp_path)
    unaligned = random.Random(1).randbytes(300_001)  # bytes: never page-aligned here
    files.write(block_name(key(0)), encode_header(key(0), unaligned), unaligned)
    assert calls == [] and files.vectored
    data = aligned_block(300_001, 2)
    files.write(block_name(key(1)), encode_header(key(1), data), data)
    files.close()
    assert calls == [3] and not files.vectored  # refused once, then copies
    assert blockfile.read(files.path(block_name(key(0))), key(0))[0] == unaligned  # type: ignore[index]
    assert blockfile.read(files.path(block_name(key(1))), key(1))[0] == bytes(data)  # type: ignore[index]


def test_a_short_vectored_write_goes_on_from_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev

    def short(fd: int, views: list[memoryview], offset: int) -> int:
        left, part = 1000, []  # at most 1000 bytes a call, across segment ends
        for v in views:
            part.append(v[:left])
            left -= len(part[-1])
            if not left:
                break
        return real(fd, part, offset)

    monkeypatch.setattr(blockfile.os, "pwritev", short)
    views = [memoryview(b"a" * 700), memoryview(b"b" * 1500), memoryview(b"c" * 3)]
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        blockfile._writev_all(fd, views, 10)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == bytes(10) + b"a" * 700 + b"b" * 1500 + b"c" * 3


def test_the_one_call_write_links_a_whole_private_file_or_leaves_nothing(tmp_path: Path) -> None:
    """read/copy.py write_file: O_TMPFILE, pwritev from 0, linkat under the
    root's folder; a missing folder is its errno, with no file left."""
    (tmp_path / TMP_DIR).mkdir()
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pieces = [memoryview(b"head"), memoryview(b""), memoryview(b"data" * 1000)]
        assert (
            copy.write_file(str(tmp_path / TMP_DIR), False, pieces, root, "ab/c.blk")
            == errno.ENOENT
        )
        assert list(tmp_path.rglob("*")) == [tmp_path / TMP_DIR]
        (tmp_path / "ab").mkdir()
        assert copy.write_file(str(tmp_path / TMP_DIR), False, pieces, root, "ab/c.blk") == 0
        final = tmp_path / "ab" / "c.blk"
        assert final.read_bytes() == b"head" + b"data" * 1000
        assert final.stat().st_mode & 0o777 == 0o600
        assert (
            copy.write_file(str(tmp_path / TMP_DIR), False, pieces, root, "ab/c.blk")
            == errno.EEXIST
        )
        assert list((tmp_path / TMP_DIR).iterdir()) == []
    finally:
        os.close(root)


def test_a_folders_first_block_takes_the_steps_and_the_next_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: list[int] = []
    real = blockfile.write_file

    def spy(*args: Any) -> int:
        results.append(real(*args))
        return results[-1]

    monkeypatch.setattr(blockfile, "write_file", spy)
    files = make(tmp_path)
    first = key(0)
    data = aligned_block(300_001)
    files.write(block_name(first), encode_header(first, data), data)
    same_folder = next(
        k
        for k in (BlockKey(first.obj, i) for i in range(1, 5000))
        if block_name(k)[:2] == block_name(first)[:2]
    )
    files.write(block_name(same_folder), encode_header(same_folder, data), data)
    files.close()
    assert results == [errno.ENOENT, 0]
    for k in (first, same_folder):
        assert blockfile.read(files.path(block_name(k)), k) == (
            bytes(data),
            files.file_size(len(encode_header(k, data)), len(data)),
        )
