"""Copies of a block's bytes that let other threads run: a FUSE reply filled
from a cached block, a block staged for an O_DIRECT write; the
uninitialised, page-aligned buffers blocks are fetched into (`empty`), which
the disk tier's O_DIRECT write sends as they are; and that write itself
(`write_file`).

A memoryview slice assignment holds the GIL for the whole memcpy; the C
module `_buffers` (read/_buffers.c) releases it around the memcpy from
GIL_FREE_MIN bytes, where that is cheaper than holding it
(docs/design/ro_mount.md, "Fetch buffers").

No threads of its own; safe from any thread (the caller owns `dst`).
"""

from __future__ import annotations

from datamount.read import _buffers
from datamount.read.blocks import BlockData

# From this size a copy runs without the GIL, and `empty` starts on a page.
# Why 64 KiB: docs/design/ro_mount.md ("Fetch buffers").
GIL_FREE_MIN = _buffers.GIL_FREE_MIN
PAGE = _buffers.PAGE  # O_DIRECT's alignment of a buffer's address, offset and length


# empty(size): a writable memoryview of `size` uninitialised bytes (malloc
# without a memset). From GIL_FREE_MIN bytes it starts on a page, so an
# O_DIRECT write can take it without a copy into an aligned buffer
# (docs/design/cache.md, "O_DIRECT block files").
# copy_into(dst, src): dst[:] = src (equal lengths, else ValueError), without
# the GIL for large copies.
# Both are the C functions themselves: no Python frame on the read path.
empty = _buffers.empty
copy_into = _buffers.copy_into
# write_file(folder, direct, pieces, root_fd, name): a block file's usual
# write (O_TMPFILE, pwritev, linkat) in one call without the GIL, instead of
# four calls that each give the GIL up and take it back; 0, or the errno of
# the step that failed, with nothing left behind (read/cache/blockfile.py
# then takes its own steps, which know every fallback).
write_file = _buffers.write_file


def page_aligned(view: BlockData) -> bool:
    """Whether `view` starts on a page."""
    return _buffers.address(view) % PAGE == 0
