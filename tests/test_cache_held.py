"""HeldBlocks, the fetcher's hold: the prefetch share, recently read blocks
giving way to prefetch, unread blocks only after HOLD_SECONDS, and every
byte of it in the budget's PREFETCH area."""

from __future__ import annotations

import pytest

from datamount.budget import DEMAND, PREFETCH, MemoryBudget
from datamount.read.blocks import BlockKey
from datamount.read.cache.held import HeldBlocks
from datamount.read.stats import MountStats
from datamount.storage.memory import MemoryStore
from test_reader_fakes import object_id, source

pytestmark = pytest.mark.unit

BS = 100


def rig(limit: int = 8 * BS) -> tuple[HeldBlocks, MemoryBudget, list[float], MountStats]:
    budget = MemoryBudget({PREFETCH: limit, DEMAND: 0})
    now, stats = [0.0], MountStats()
    return HeldBlocks(budget, stats, hold_seconds=30, clock=lambda: now[0]), budget, now, stats


def keys(n: int) -> list[BlockKey]:
    obj = object_id(MemoryStore({"f": source(n * BS)}), "f")
    return [BlockKey(obj, i) for i in range(n)]


def test_prefetch_takes_its_share_and_unread_blocks_expire_only_after_the_hold() -> None:
    held, budget, now, stats = rig()
    k = keys(10)
    for key in k[:6]:
        assert held.admit(BS)  # 3/4 of 8 blocks
        held.keep_unread(key, source(BS))
    assert not held.admit(BS)
    assert budget.in_use(PREFETCH) == held.in_use() == 6 * BS
    now[0] = 31.0
    assert held.admit(BS)  # the oldest unread block gave way, wasted
    assert stats.snapshot()["prefetch_wasted"] == 1 and k[0] not in held
    assert held.take(k[1]) == source(BS) and stats.snapshot()["prefetch_used"] == 1
    held.clear()  # the 4 still unread are wasted; the one in flight keeps its bytes...
    assert budget.in_use() == BS and stats.snapshot()["prefetch_wasted"] == 5
    held.unadmit(BS)  # ...until it ends
    assert budget.in_use() == 0


def test_recent_blocks_give_way_to_prefetch_and_to_the_whole_budget() -> None:
    held, budget, _, _ = rig()
    k = keys(10)
    for key in k[:8]:
        held.hold_recent(key, source(BS))
    assert held.in_use() == 8 * BS
    assert held.admit(2 * BS)  # two recently read blocks make way
    assert k[0] not in held and k[1] not in held and held.in_use() == 8 * BS
    held.unadmit(2 * BS)
    budget.reserve(DEMAND, 2 * BS)  # demand reads hold the last of the total
    held.hold_recent(k[9], source(BS))
    assert k[9] not in held  # no room: not held, nothing taken
    assert budget.in_use(PREFETCH) == held.in_use() == 6 * BS
    budget.release(DEMAND, 2 * BS)
    held.clear()
    assert budget.in_use() == 0


def test_shut_says_exactly_when_admit_would_refuse_without_touching_anything() -> None:
    held, budget, now, stats = rig()
    k = keys(10)
    assert not held.shut()
    for key in k[:6]:  # the prefetch share, 6 blocks, all unread
        assert held.admit(BS)
        held.keep_unread(key, source(BS))
    assert held.shut() and not held.admit(1)
    assert budget.in_use(PREFETCH) == 6 * BS and stats.snapshot()["prefetch_wasted"] == 0
    now[0] = 31.0  # the oldest unread block may now make way
    assert not held.shut()
    assert held.admit(BS)
    held.clear()
