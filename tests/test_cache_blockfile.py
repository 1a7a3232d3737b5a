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
    files.write(name, encode_header(key(), data), data)
    files.close()
    assert files.tmpfile  # ext4 or the like takes O_TMPFILE
    assert blockfile.read(files.path(name), key()) == (data, len(encode_header(key(), data)) + size)
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
