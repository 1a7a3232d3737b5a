"""The two-tier block cache written as one more BlockCache (mountpoint-s3's
data_cache/multilevel_cache.rs): RAM first, then disk.

- get: RAM, then disk; a disk hit is promoted to RAM (a RAM put is a dict
  insert, so it is done inline rather than in the background).
- put: both tiers; the disk put only enqueues (disk.py), so it never waits for I/O.
- contains: either tier.
- An exception from a tier is logged and treated as a miss (or a skipped put),
  never raised to the reader.

Counting lives here, and only here, for lookups: each `get` counts exactly one
of `ram_hits`, `disk_hits`, `misses`. The tiers count what only they can see
(`ram_evictions`, `disk_evictions`, `disk_queue_dropped`). So the composition
root always builds a TieredCache, with `NoCache` for a disabled tier, and the
hit counters mean the same in every configuration. `contains` counts nothing.

No threads of its own.
"""

from __future__ import annotations

import logging

from datamount.read.blocks import BlockData, BlockKey
from datamount.read.cache.protocol import BlockCache
from datamount.read.stats import MountStats

log = logging.getLogger("datamount.read.cache.tiered")


class TieredCache:
    def __init__(self, ram: BlockCache, disk: BlockCache, stats: MountStats | None = None) -> None:
        self.ram = ram
        self.disk = disk
        self._stats = stats if stats is not None else MountStats()

    @property
    def stats(self) -> MountStats:
        return self._stats

    def get(self, key: BlockKey) -> BlockData | None:
        data = _safe_get(self.ram, key)
        if data is not None:
            self._stats.add(ram_hits=1)
            return data
        data = _safe_get(self.disk, key)
        if data is None:
            self._stats.add(misses=1)
            return None
        self._stats.add(disk_hits=1)
        _safe_put(self.ram, key, data)
        return data

    def put(self, key: BlockKey, data: BlockData) -> None:
        _safe_put(self.ram, key, data)
        _safe_put(self.disk, key, data)

    def contains(self, key: BlockKey) -> bool:
        return _safe_contains(self.ram, key) or _safe_contains(self.disk, key)

    def close(self) -> None:
        for tier in (self.ram, self.disk):
            try:
                tier.close()
            except Exception:
                log.exception("closing the %s cache tier failed", type(tier).__name__)


def _safe_get(tier: BlockCache, key: BlockKey) -> BlockData | None:
    try:
        return tier.get(key)
    except Exception:
        log.exception("%s.get failed: treated as a miss", type(tier).__name__)
        return None


def _safe_put(tier: BlockCache, key: BlockKey, data: BlockData) -> None:
    try:
        tier.put(key, data)
    except Exception:
        log.exception("%s.put failed: block not cached there", type(tier).__name__)


def _safe_contains(tier: BlockCache, key: BlockKey) -> bool:
    try:
        return tier.contains(key)
    except Exception:
        log.exception("%s.contains failed: treated as absent", type(tier).__name__)
        return False
