"""Copies of a block's bytes that let other threads run: a FUSE reply filled
from a cached block, a block staged for an O_DIRECT write; and the
uninitialised, page-aligned buffers blocks are fetched into (`empty`), which
the disk tier's O_DIRECT write sends as they are.

A memoryview slice assignment holds the GIL for the whole memcpy; numpy's
array assignment releases it around the memcpy but costs more per call, so
small copies stay on the slice assignment (docs/design/ro_mount.md,
"Fetch buffers").

No threads of its own; safe from any thread (the caller owns `dst`).
"""

from __future__ import annotations

import ctypes

import numpy as np

from datamount.read.blocks import BlockData

# Below this, numpy's call overhead is more than the copy holds the GIL.
# Why 64 KiB: docs/design/ro_mount.md ("Fetch buffers").
GIL_FREE_MIN = 64 * 1024
PAGE = 4096  # O_DIRECT's alignment of a buffer's address, offset and length


def empty(size: int) -> memoryview:
    """A writable buffer of `size` uninitialised bytes (numpy.empty: malloc
    without a memset). From GIL_FREE_MIN bytes it starts on a page (4 KiB more
    are allocated), so an O_DIRECT write can take it without a copy into an
    aligned buffer (docs/design/cache.md, "O_DIRECT block files")."""
    if size < GIL_FREE_MIN:
        return np.empty(size, np.uint8).data
    raw = np.empty(size + PAGE, np.uint8)
    start = -_address(raw) % PAGE
    return raw[start : start + size].data


def page_aligned(view: BlockData) -> bool:
    """Whether `view` starts on a page."""
    obj = view.obj if isinstance(view, memoryview) else None
    if isinstance(obj, np.ndarray) and obj.nbytes == len(view) and obj.flags.writeable:
        return _address(obj) % PAGE == 0  # the whole array: it starts where the view does
    return bool(np.frombuffer(view, np.uint8).__array_interface__["data"][0] % PAGE == 0)


def _address(array: np.ndarray) -> int:
    """Where a writable array's bytes start (cheaper than __array_interface__:
    docs/design/ro_mount.md, "Fetch buffers")."""
    return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]


def copy_into(dst: memoryview, src: BlockData) -> None:
    """dst[:] = src (equal lengths), without the GIL for large copies."""
    if len(src) < GIL_FREE_MIN:
        dst[:] = src
    else:
        np.frombuffer(dst, np.uint8)[:] = np.frombuffer(src, np.uint8)
