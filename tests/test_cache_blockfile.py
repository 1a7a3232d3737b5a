"""The disk tier's block files (read/cache/blockfile.py): unnamed temp files
linked in place, the named-temp fallback, a stale file under the final name."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache import blockfile
from datamount.read.cache.blockfile import TMP_DIR, BlockFiles, block_name, encode_header


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
