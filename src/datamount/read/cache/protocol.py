"""The BlockCache protocol (mountpoint-s3's data_cache.rs: three methods).

A cache maps BlockKey (object version + block index) to the block's bytes.
`get` returns None on a miss; an error inside a tier is a miss, never an
exception to the reader. `put` may drop the block (a full queue, no room).
Implementations are thread-safe.
"""

from __future__ import annotations

from typing import Protocol

from datamount.read.blocks import BlockData, BlockKey


class BlockCache(Protocol):
    def get(self, key: BlockKey) -> BlockData | None: ...

    def put(self, key: BlockKey, data: BlockData) -> None: ...

    def contains(self, key: BlockKey) -> bool: ...

    def close(self) -> None: ...


class NoCache:
    """Caches nothing (both tiers disabled)."""

    def get(self, key: BlockKey) -> BlockData | None:
        return None

    def put(self, key: BlockKey, data: BlockData) -> None:
        return None

    def contains(self, key: BlockKey) -> bool:
        return False

    def close(self) -> None:
        return None
