"""Pure block arithmetic: which fixed-size blocks a byte range touches, and
the identity of a cached block. No I/O, no threads; imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

# A block's bytes as the caches hold them: `bytes`, or a read-only memoryview of
# the buffer it was fetched into (read/fetch.py: never copied out of it).
BlockData: TypeAlias = bytes | memoryview


@dataclass(frozen=True)
class ObjectId:
    """One version of one object: every open handle and every cached block is
    pinned to it, so a changed blob is never mixed with its old bytes."""

    store: str  # the store's identity (StorageLocation.store_root): account + container
    key: str
    etag: str
    size: int


@dataclass(frozen=True)
class BlockKey:
    obj: ObjectId
    index: int


def block_count(size: int, block_size: int) -> int:
    return (size + block_size - 1) // block_size


def block_span(index: int, size: int, block_size: int) -> tuple[int, int]:
    """(offset, length) of block `index` of an object of `size` bytes."""
    start = index * block_size
    return start, max(0, min(block_size, size - start))


def blocks_for(offset: int, length: int, size: int, block_size: int) -> range:
    """Indexes of the blocks that hold [offset, offset+length) clipped to the object."""
    end = min(offset + length, size)
    if length <= 0 or offset >= end:
        return range(0)
    return range(offset // block_size, (end - 1) // block_size + 1)
