"""read/copy.py (the C module read/_buffers.c): copy_into equals a slice
assignment, below and above the size from which it runs without the GIL;
`empty` gives writable buffers of the size asked, page-aligned from that
size; the mount daemon's modules do not import numpy."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from datamount.read.copy import GIL_FREE_MIN, copy_into, empty, page_aligned

pytestmark = pytest.mark.unit

SOURCE = random.Random(5).randbytes(3 * GIL_FREE_MIN + 17)


@pytest.mark.parametrize("size", [0, 1, GIL_FREE_MIN - 1, GIL_FREE_MIN, 3 * GIL_FREE_MIN + 17])
@pytest.mark.parametrize("kind", ["bytes", "readonly view", "numpy view", "empty"])
def test_copy_into_equals_the_source_slice(size: int, kind: str) -> None:
    data = SOURCE[:size]
    if kind == "readonly view":
        src = memoryview(bytearray(data)).toreadonly()
    elif kind == "numpy view":
        src = np.frombuffer(data, np.uint8).copy().data.toreadonly()
    elif kind == "empty":
        src = empty(size)
        src[:] = data
    else:
        src = data
    out = bytearray(b"\xee") * (size + 8)
    copy_into(memoryview(out)[4 : 4 + size], src)
    assert out[4 : 4 + size] == data
    assert out[:4] == out[4 + size :] == b"\xee" * 4  # nothing written outside dst


def test_copy_into_refuses_unequal_lengths_readonly_targets_and_strides() -> None:
    with pytest.raises(ValueError, match="65537 bytes into 65536"):
        copy_into(memoryview(bytearray(GIL_FREE_MIN)), SOURCE[: GIL_FREE_MIN + 1])
    with pytest.raises(ValueError):
        copy_into(memoryview(bytearray(10)), SOURCE[:11])
    with pytest.raises(BufferError):  # bytes are not writable
        copy_into(bytes(10), SOURCE[:10])  # type: ignore[arg-type]
    with pytest.raises(BufferError):  # every other byte: not one run of memory
        copy_into(memoryview(bytearray(20))[::2], SOURCE[:10])


@pytest.mark.parametrize("size", [0, 1, 4095, GIL_FREE_MIN - 1, GIL_FREE_MIN, 2 << 20])
def test_empty_is_writable_of_its_size_and_page_aligned_when_large(size: int) -> None:
    views = [empty(size) for _ in range(4)]
    for n, view in enumerate(views):
        assert (len(view), view.readonly, view.format, view.itemsize) == (size, False, "B", 1)
        view[:] = bytes([n]) * size
        if size >= GIL_FREE_MIN:
            assert page_aligned(view)
            assert not page_aligned(view[1:])
    for n, view in enumerate(views):  # each its own memory
        assert bytes(view) == bytes([n]) * size


def test_the_mount_daemon_does_not_import_numpy() -> None:
    code = "import sys, datamount.mount.serve; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_block_buffers_reuse_the_heap_instead_of_a_fresh_mapping_each() -> None:
    """A freed 2 MiB buffer's memory serves the next one: filling 20 buffers
    one after another faults in about one buffer's pages, not 20 buffers'
    (a fresh mmap per buffer faulted every 4 KiB page: 512 per buffer). In a
    process of its own, where nothing else has tuned malloc."""
    code = """if True:
        import resource
        from datamount.read import _buffers
        data = bytes(2 << 20)
        def fill():
            view = _buffers.empty(2 << 20)
            view[:] = data
        fill()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            fill()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) < 2 * 512, out.stdout  # 20 fresh mappings: > 10,000
