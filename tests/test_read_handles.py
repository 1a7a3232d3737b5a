"""Every ReadHandle implementation, one suite: `read_into(offset, view)` fills
the view with exactly `read(offset, len(view))` (a slice of the source) and
returns its length, at and past the end of the file, for the block, direct,
whole-file and staged (rw) handles. And the read-only path (fs/ops.py, read/)
imports nothing of the write path."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from datamount.fs.staged import StagedView
from datamount.read.reader import DirectReader, ReadHandle
from datamount.read.wholefile import WholeFileReader
from datamount.storage.memory import MemoryStore
from datamount.transfer.downloader import DownloadOptions
from datamount.write.writeback import WriteBack, WriteBackOptions
from test_reader_fakes import block_stack, object_id, source

pytestmark = pytest.mark.unit

BS = 1024
DATA = source(5 * BS + 17)
RANGES = [(0, 0), (0, 1), (0, BS), (BS - 3, 10), (7, 3 * BS), (5 * BS, 100), (len(DATA), 9),
          (len(DATA) + 50, 4)]  # fmt: skip


@contextmanager
def handle_of(kind: str, tmp_path: Path) -> Iterator[ReadHandle]:
    store = MemoryStore({"f": DATA})
    obj = object_id(store, "f")
    if kind == "block":
        with block_stack(store, block_size=BS, window=4) as s:
            handle = s.reader.open(obj)
            yield handle
            handle.close()
    elif kind == "direct":
        yield DirectReader(store).open(obj)
    elif kind == "wholefile":
        options = DownloadOptions(threads=2, range_size=2 * BS, reserved_free_disk_space=0)
        reader = WholeFileReader(
            store, tmp_path / "cache", options, lambda free, used: 1 << 40, DirectReader(store)
        )
        handle = reader.open(obj)
        yield handle
        handle.close()
        reader.close()
    else:
        writeback = WriteBack(store, tmp_path / "staging", WriteBackOptions(block_size=BS))
        staged = writeback.create("f")
        writeback.write(staged, DATA, 0)
        yield StagedView(staged)
        writeback.discard(staged)
        writeback.close()


@pytest.mark.parametrize("kind", ["block", "direct", "wholefile", "staged"])
def test_read_into_is_read_into_a_buffer(kind: str, tmp_path: Path) -> None:
    rng = random.Random(3)
    ranges = RANGES + [(rng.randrange(len(DATA)), rng.randrange(4 * BS)) for _ in range(40)]
    with handle_of(kind, tmp_path) as handle:
        for offset, size in ranges:
            expected = DATA[offset : offset + size]
            assert handle.read(offset, size) == expected
            buf = bytearray(b"\xee" * (size + 8))
            n = handle.read_into(offset, memoryview(buf)[:size])
            assert n == len(expected)
            assert bytes(buf[:n]) == expected
            assert buf[n:] == b"\xee" * (size + 8 - n)  # nothing past what was read


def test_the_read_only_path_imports_nothing_of_the_write_path() -> None:
    code = """
import json, pkgutil, importlib, sys
import datamount.read
import datamount.fs.ops
for m in pkgutil.walk_packages(datamount.read.__path__, "datamount.read."):
    importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    loaded = json.loads(out)
    assert "datamount.fs.ops" in loaded and "datamount.read.wholefile" in loaded
    assert [m for m in loaded if m.startswith("datamount.write")] == []
    assert "datamount.fs.writable" not in loaded and "datamount.fs.staged" not in loaded
    assert "datamount.fs._lowlevel" not in loaded  # only fs.lowlevel loads libfuse
