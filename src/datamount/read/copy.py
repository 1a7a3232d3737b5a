"""Copies of a block's bytes that let other threads run: a FUSE reply filled
from a cached block, a block staged for an O_DIRECT write.

A memoryview slice assignment holds the GIL for the whole memcpy (~0.2 ms per
MiB on this VM: 0.2 GIL-s per GiB for each copy of a cold sequential read).
numpy's array assignment releases it around the memcpy; its call costs ~2 us
against ~0.6 us, so small copies stay on the slice assignment.

No threads of its own; safe from any thread (the caller owns `dst`).
"""

from __future__ import annotations

import numpy as np

from datamount.read.blocks import BlockData

# Below this, numpy's call overhead (~2 us) is more than the copy holds the GIL.
GIL_FREE_MIN = 64 * 1024


def copy_into(dst: memoryview, src: BlockData) -> None:
    """dst[:] = src (equal lengths), without the GIL for large copies."""
    if len(src) < GIL_FREE_MIN:
        dst[:] = src
    else:
        np.frombuffer(dst, np.uint8)[:] = np.frombuffer(src, np.uint8)
