"""The BlockFetcher's hold: prefetched blocks not yet read, and recently read
blocks, in the PREFETCH area of the mount's MemoryBudget (budget.py).

Not a BlockCache: it holds what the fetcher owns on its way to a reader, and
it accounts for the prefetches in flight too (they hold their bytes of the
area from admission on, and those bytes then hold the block until it is read).

- Prefetched blocks are held until read, because with the RAM tier disabled
  (DATASET_MOUNT_MEMORY_CACHE_SIZE=0, or NoCache) a prefetched block would
  otherwise be gone before its reader arrives. An unread block gives way to
  a new prefetch only after HOLD_SECONDS.
- Recently read blocks are held in an LRU because the kernel's 1 MiB reads
  hit each 2 MiB block twice; they give way to prefetch at once.
- Prefetch (in flight + unread) may take PREFETCH_SHARE of the area, so read
  blocks always keep the rest. Everything is taken from the budget too, so
  when the disk queue, uploads and demand reads hold the whole total, the
  hold gets nothing more.
- Held blocks are the same `bytes` objects the RAM tier keeps, so holding
  them costs memory only once the RAM tier has dropped them.
- Counts prefetch_used (a prefetched block later read) and prefetch_wasted
  (best effort: dropped from the hold unread, forgotten after
  TRACKED_PREFETCHES newer prefetches, or still unread at close).

Threads: none; no lock of its own. The fetcher calls it with its lock held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from datamount.budget import PREFETCH, MemoryBudget
from datamount.read.blocks import BlockData, BlockKey
from datamount.read.stats import MountStats

# An unread prefetched block is protected from eviction this long: a reader
# 32 blocks behind at 100 MB/s needs < 1 s to reach it; one that has not come
# in 30 s has moved on (or its file is open but idle).
HOLD_SECONDS = 30.0
# Prefetched-but-unread keys remembered for prefetch_used / prefetch_wasted
# (a key is ~100 bytes: 4096 of them is well under 1 MiB).
TRACKED_PREFETCHES = 4096
# Prefetch (in flight + unread) may take this share of the memory budget; the
# rest holds blocks being read. Without it, with the RAM tier off and a budget
# of one window, prefetch evicts the block a reader is halfway through and its
# second 1 MiB read fetches it again (docs/design/cache.md, "The prefetch
# share of the hold").
PREFETCH_SHARE = 0.75


class HeldBlocks:
    def __init__(
        self,
        budget: MemoryBudget,
        stats: MountStats,
        *,
        hold_seconds: float = HOLD_SECONDS,
        clock: Callable[[], float],
    ) -> None:
        self.budget = budget
        self.limit = budget.limit(PREFETCH)
        self.prefetch_cap = int(self.limit * PREFETCH_SHARE)
        self.hold_seconds = hold_seconds
        self._stats = stats
        self._clock = clock
        self._unread: OrderedDict[BlockKey, tuple[BlockData, float]] = OrderedDict()
        self._recent: OrderedDict[BlockKey, BlockData] = OrderedDict()
        self._tracked: OrderedDict[BlockKey, None] = OrderedDict()
        # Their sum is what the fetcher holds of the budget's PREFETCH area.
        self._ahead = 0  # bytes of prefetches queued or in flight, and of _unread
        self._recent_bytes = 0  # bytes of _recent

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._unread or key in self._recent

    def in_use(self) -> int:
        return self._ahead + self._recent_bytes

    # -- reads -------------------------------------------------------------

    def take(self, key: BlockKey) -> BlockData | None:
        """A held block for a reader (an unread one becomes recently read)."""
        entry = self._unread.pop(key, None)
        if entry is not None:
            self._to_recent(key, entry[0])
            self.note_read(key)
            return entry[0]
        data = self._recent.get(key)
        if data is not None:
            self._recent.move_to_end(key)
        return data

    def note_read(self, key: BlockKey) -> None:
        """`key` was read (from here or from the cache): a prefetch was used."""
        if self._tracked and key in self._tracked:
            del self._tracked[key]
            self._stats.add(prefetch_used=1)

    def hold_recent(self, key: BlockKey, data: BlockData) -> None:
        """Keep a block a reader just got, if there is room."""
        if key in self._recent:
            return
        self._evict_recent(self.limit - self._ahead - len(data))
        fits = self._ahead + self._recent_bytes + len(data) <= self.limit
        if fits and self.budget.try_reserve(PREFETCH, len(data)):
            self._recent[key] = data
            self._recent_bytes += len(data)

    # -- prefetches --------------------------------------------------------

    def shut(self, size: int = 1) -> bool:
        """No prefetch of `size` bytes (default: of any size) can be admitted now
        (admit would fail without a side effect): the prefetch share lacks them
        and no unread block is old enough to make way. A pure check, for offers
        that would only be refused."""
        if self._ahead + size <= self.prefetch_cap:
            return False
        if self._unread:
            _, since = next(iter(self._unread.values()))
            return since > self._clock() - self.hold_seconds
        return True

    def admit(self, size: int) -> bool:
        """Take `size` bytes for a prefetch, if the prefetch share has them
        (recently read blocks make way) and the whole budget has them."""
        if self._ahead + size > self.prefetch_cap:
            self._expire_unread(self._ahead + size - self.prefetch_cap)
            if self._ahead + size > self.prefetch_cap:
                return False
        self._evict_recent(self.limit - self._ahead - size)
        if not self.budget.try_reserve(PREFETCH, size):
            return False  # the disk queue, uploads or demand reads hold the rest
        self._ahead += size
        return True

    def unadmit(self, size: int) -> None:
        """A prefetch ended without a block to hold: its bytes go back."""
        self._ahead -= size
        self.budget.release(PREFETCH, size)

    def keep_unread(self, key: BlockKey, data: BlockData) -> None:
        """A prefetch nobody waits for arrived: the bytes it was admitted with
        (`len(data)`) now hold the block until it is read."""
        self._tracked[key] = None
        if len(self._tracked) > TRACKED_PREFETCHES:
            self._tracked.popitem(last=False)
            self._stats.add(prefetch_wasted=1)
        self._unread[key] = (data, self._clock())

    def abandon(self, key: BlockKey) -> None:
        """Its reader went away: an unread block goes first when room is needed."""
        entry = self._unread.pop(key, None)
        if entry is not None:
            self._to_recent(key, entry[0])
            self._recent.move_to_end(key, last=False)

    def clear(self) -> None:
        """Drop every held block (the fetcher closes): unread ones are wasted.
        Prefetches still in flight give their bytes back with `unadmit`."""
        self._stats.add(prefetch_wasted=len(self._tracked))
        self._tracked.clear()
        unread = sum(len(data) for data, _ in self._unread.values())
        self._ahead -= unread
        self._unread.clear()
        self._recent.clear()
        self.budget.release(PREFETCH, unread + self._recent_bytes)
        self._recent_bytes = 0

    # -- making room -------------------------------------------------------

    def _to_recent(self, key: BlockKey, data: BlockData) -> None:
        """An unread block was read (or abandoned): same bytes, other account."""
        self._ahead -= len(data)
        self._recent[key] = data
        self._recent_bytes += len(data)

    def _evict_recent(self, room: int) -> None:
        """Drop least recently read blocks until they fit in `room` bytes."""
        freed = 0
        while self._recent and self._recent_bytes > room:
            size = len(self._recent.popitem(last=False)[1])
            self._recent_bytes -= size
            freed += size
        self.budget.release(PREFETCH, freed)

    def _expire_unread(self, need: int) -> None:
        """Drop unread prefetched blocks held past HOLD_SECONDS, oldest first,
        until `need` bytes are free (or none is that old)."""
        expired = self._clock() - self.hold_seconds
        freed = 0
        while freed < need and self._unread:
            key, (data, since) = next(iter(self._unread.items()))
            if since > expired:
                break
            del self._unread[key]
            self._ahead -= len(data)
            freed += len(data)
            if key in self._tracked:
                del self._tracked[key]
                self._stats.add(prefetch_wasted=1)
        self.budget.release(PREFETCH, freed)
