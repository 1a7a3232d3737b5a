"""File-ahead prefetch: the pure policies (opens in -> files to fetch out;
hints in -> files out; the window's file and byte bounds), then the
prefetcher over an in-memory store, a real fetcher and a real filesystem
ops layer (no kernel): request counts and bytes equal to the source."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from datamount.fs.namespace import Namespace
from datamount.fs.ops import ReadOnlyFS
from datamount.mount.stack import MountReader, file_ahead
from datamount.read.ahead import FileAhead
from datamount.read.blocks import BlockKey
from datamount.read.cache.ram import MemoryCache
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.fileahead import AheadPlan, FolderOrder
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.reader import BlockReader
from datamount.read.stats import MountStats
from datamount.storage.memory import MemoryStore

pytestmark = pytest.mark.unit

NAMES = [f"f{i:03}" for i in range(100)]


def folder_order(opens: list[int], tolerance: int = 8) -> list[list[str] | None]:
    policy = FolderOrder(tolerance=tolerance)
    policy.add_listing("d", NAMES)
    return [policy.on_open("d", NAMES[i], lookahead=5) for i in opens]


# -- FolderOrder ---------------------------------------------------------------


def test_listing_order_turns_on_after_three_opens() -> None:
    out = folder_order([0, 1, 2, 3])
    assert out[:2] == [[], []]
    assert out[2] == ["f003", "f004", "f005", "f006", "f007"]
    assert out[3] == ["f004", "f005", "f006", "f007", "f008"]


def test_a_few_threads_out_of_order_keep_the_pattern() -> None:
    out = folder_order([1, 0, 3, 2, 5, 4, 7, 6])
    assert all(o is not None for o in out)
    assert out[-1] is not None and out[-1][:2] == ["f008", "f009"]
    # A file left behind by a slow thread stays wanted within the tolerance.
    out = folder_order([0, 2, 3, 4], tolerance=8)
    assert out[-1] is not None and out[-1][0] == "f001"


def test_a_jump_breaks_the_pattern_and_a_shuffle_never_starts_it() -> None:
    out = folder_order([0, 1, 2, 3, 60])
    assert out[-1] is None
    order = list(range(100))
    random.Random(5).shuffle(order)
    assert not any(folder_order(order))  # [] throughout: nothing to fetch


def test_a_listing_is_wanted_from_the_second_open_of_a_folder() -> None:
    policy = FolderOrder()
    assert policy.wants_listing("a", "x") is False
    assert policy.wants_listing("b", "x") is False
    assert policy.wants_listing("a", "y") is True
    policy.add_listing("a", ["x", "y"])
    assert policy.wants_listing("a", "z") is False
    assert policy.on_open("unknown", "x", 4) == []


# -- AheadPlan -----------------------------------------------------------------


def sized(plan: AheadPlan, size: int) -> None:
    for path in plan.unresolved():
        plan.resolve(path, size)


def test_window_is_bounded_by_files_and_bytes() -> None:
    plan = AheadPlan(max_files=4, max_bytes=1000)
    plan.replace(NAMES[:20], "hints")
    assert plan.unresolved() == NAMES[:4]  # only the window's reach is looked up
    sized(plan, 100)
    assert plan.due() == NAMES[:4]
    assert plan.due() == []  # full: 4 files ahead
    assert plan.opened("f000") == (True, [])
    sized(plan, 100)
    assert plan.due() == ["f004"]
    bytes_plan = AheadPlan(max_files=10, max_bytes=250)
    bytes_plan.replace(NAMES[:20], "hints")
    sized(bytes_plan, 100)
    assert bytes_plan.due() == ["f000", "f001"]  # 300 bytes would not fit
    assert bytes_plan.ahead() == (2, 200)


def test_hints_in_order_and_skipped_hints_are_dropped() -> None:
    plan = AheadPlan(max_files=3, max_bytes=10_000, tolerance=1)
    plan.replace(["c", "a", "b"], "hints")
    plan.extend(["e", "d", "a"], "hints")  # a known path is not planned twice
    assert plan.paths() == ["c", "a", "b", "e", "d"]
    sized(plan, 10)
    assert plan.due() == ["c", "a", "b"]
    # The reader skips c and a: a is within the tolerance, c is dropped.
    assert plan.opened("b") == (True, ["c"])
    assert plan.paths() == ["a", "e", "d"]
    plan.undo("a")
    sized(plan, 10)
    assert plan.due() == ["a", "e", "d"]  # nothing is ahead now: three fit


def test_opens_elsewhere_drop_the_plan_and_big_files_are_not_fetched() -> None:
    plan = AheadPlan(max_files=2, max_bytes=1000, max_file_bytes=100, max_misses=2)
    plan.replace(["a", "big", "empty", "b", "c"], "hints")
    plan.resolve("a", 10)
    plan.resolve("big", 500)
    plan.resolve("empty", 0)
    plan.resolve("b", 10)
    plan.resolve("missing", None)  # not planned: nothing happens
    assert plan.due() == ["a", "b"]  # big is read by the block prefetch, not whole
    assert plan.opened("x") == (False, [])
    assert plan.opened("y") == (False, [])
    assert plan.opened("z") == (False, ["a", "b"])  # the third miss: the reader left
    assert len(plan) == 0


# -- the prefetcher over a real fetcher, namespace and ops ---------------------

BS = 4096


class Rig:
    def __init__(self, files: dict[str, bytes], *, budget: int = 64 * BS) -> None:
        self.store = MemoryStore(files)
        self.stats = MountStats()
        self.scheduler = Scheduler(4)
        cache = MemoryCache(1 << 24, self.stats)
        self.fetcher = BlockFetcher(
            self.store, cache, BS, self.scheduler, self.stats, memory_budget=budget
        )
        self.namespace = Namespace(self.store, "data")
        self.fs = ReadOnlyFS(self.namespace, BlockReader(self.fetcher, BS, 4), store_id="mem")
        reader = MountReader(self.fs.reader, [], self.fetcher.budget, self.fetcher)
        ahead = file_ahead(reader, self.stats, self.namespace, "mem")
        assert ahead is not None
        self.ahead: FileAhead = ahead
        self.fs.on_open = ahead.opened

    def read(self, rel: str) -> bytes:
        opened = self.fs.open("/" + rel, 0)
        self.ahead.wait_idle()
        wait_quiet(self.scheduler)
        try:
            return self.fs.read(opened.fh, 0, 1 << 20)
        finally:
            self.fs.release(opened.fh)

    def gets(self) -> int:
        return self.store.requests["read"]

    def close(self) -> None:
        self.ahead.close()
        self.fetcher.close()
        self.scheduler.close()


def wait_quiet(scheduler: Scheduler) -> None:
    import time

    deadline = time.monotonic() + 5
    while scheduler.queued() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.02)  # the last running fetch


FILES = {f"data/d/{n}": random.Random(n).randbytes(random.Random(n).randrange(1, 3 * BS)) for n in NAMES[:40]}  # fmt: skip


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig(FILES)
    yield made
    made.close()


def test_listing_order_fetches_the_next_files_before_their_open(rig: Rig) -> None:
    names = NAMES[:40]
    for name in names[:3]:
        assert rig.read(f"d/{name}") == FILES[f"data/d/{name}"]
    assert rig.stats.files_prefetched > 0
    before = rig.gets()
    for name in names[3:]:
        assert rig.read(f"d/{name}") == FILES[f"data/d/{name}"]
    snap = rig.stats.snapshot()
    # Every file after the third was fetched ahead: no demand request for any.
    assert snap["files_prefetch_used"] == 37
    assert snap["files_prefetch_wasted"] == 0
    assert rig.gets() - before <= snap["fetch_requests"]
    total = sum(len(v) for v in FILES.values())
    assert snap["bytes_fetched"] == total  # nothing fetched twice, nothing extra


def shuffled(names: list[str]) -> list[str]:
    """A shuffle of `names` that nowhere looks like listing order (over 40
    files, 3 opens within 9 positions forward happen by chance; over 2,000
    almost never)."""
    for seed in range(100):
        order = list(names)
        random.Random(seed).shuffle(order)
        if not any(folder_order([NAMES.index(n) for n in order])):
            return order
    raise AssertionError("no such shuffle")


def test_a_shuffled_order_fetches_nothing_ahead_without_hints(rig: Rig) -> None:
    order = shuffled(NAMES[:40])
    for name in order:
        assert rig.read(f"d/{name}") == FILES[f"data/d/{name}"]
    snap = rig.stats.snapshot()
    assert snap["files_prefetched"] == 0
    assert snap["bytes_fetched"] == sum(len(v) for v in FILES.values())


def test_hints_fetch_a_shuffled_order_ahead(rig: Rig) -> None:
    order = NAMES[:40]
    random.Random(3).shuffle(order)
    rig.ahead.hint([f"d/{n}" for n in order] + ["../data/d/f000", "d/./x", "d//y"])
    rig.ahead.wait_idle()
    wait_quiet(rig.scheduler)
    assert rig.ahead.plan.paths() == [f"d/{n}" for n in order]  # no '.', '..' or '//' path
    for name in order:
        assert rig.read(f"d/{name}") == FILES[f"data/d/{name}"]
    snap = rig.stats.snapshot()
    assert snap["hinted_files"] == 40
    assert snap["files_prefetch_used"] == 40
    assert snap["misses"] == 0  # no read waited for storage
    assert snap["bytes_fetched"] == sum(len(v) for v in FILES.values())


def test_hints_the_reader_skips_are_dropped_and_the_window_holds(rig: Rig) -> None:
    order = NAMES[:40]
    rig.ahead.hint([f"d/{n}" for n in order])
    rig.ahead.wait_idle()
    wait_quiet(rig.scheduler)
    files, nbytes = rig.ahead.plan.ahead()
    assert files <= rig.ahead.plan.max_files and nbytes <= rig.ahead.plan.max_bytes
    assert rig.stats.bytes_fetched <= rig.ahead.plan.max_bytes
    # The reader jumps to the 30th file: what was fetched before it is wasted.
    assert rig.read("d/" + order[30]) == FILES["data/d/" + order[30]]
    snap = rig.stats.snapshot()
    assert snap["files_prefetch_wasted"] > 0
    # Files up to 8 before the jump stay (a loader's threads reorder a little).
    assert rig.ahead.plan.paths()[:9] == ["d/" + n for n in order[22:30] + order[31:32]]
    ahead, _ = rig.ahead.plan.ahead()
    fetched = snap["files_prefetched"]
    assert snap["files_prefetch_wasted"] + snap["files_prefetch_used"] + ahead == fetched


def test_a_spent_budget_holds_files_back_until_the_next_opens() -> None:
    files = {f"data/d/{n}": random.Random(n).randbytes(2 * BS) for n in NAMES[:10]}
    rig = Rig(files, budget=8 * BS)  # the prefetch share: 6 blocks
    rig.ahead.close()
    resolve = rig.ahead._resolve
    ahead = FileAhead(rig.fetcher, rig.stats, resolve, None, max_files=10, max_bytes=100 * BS)
    rig.ahead, rig.fs.on_open = ahead, ahead.opened
    try:
        ahead.hint([f"d/{n}" for n in NAMES[:10]])
        ahead.wait_idle()
        wait_quiet(rig.scheduler)
        taken = rig.stats.files_prefetched
        assert 1 <= taken <= 3  # 2-block files in a 6-block share
        assert ahead.plan.ahead()[0] == taken  # the refused ones are not counted ahead
        for name in NAMES[:10]:
            assert rig.read(f"d/{name}") == files[f"data/d/{name}"]
        assert rig.stats.files_prefetched > taken  # the rest came as the reader advanced
        assert rig.stats.bytes_fetched == sum(len(v) for v in files.values())
    finally:
        rig.close()


def test_files_read_from_the_disk_tier_make_way_and_small_ones_are_announced() -> None:
    """The native FUSE loop reads a prefetched file from the disk tier, never
    through the fetcher: at the file's open its held blocks count as read and
    make way (else the hold keeps them HOLD_SECONDS and the window stays full);
    a one-block file is announced once, when its block file is written."""
    files = {f"data/d/{n}": random.Random(n).randbytes(BS - 7) for n in NAMES[:30]}
    files["data/d/zbig"] = random.Random(1).randbytes(2 * BS)
    rig = Rig(files, budget=8 * BS)  # the prefetch share: 6 blocks
    rig.ahead.close()
    resolve = rig.ahead._resolve
    announced: list[str] = []
    ahead = FileAhead(rig.fetcher, rig.stats, resolve, None, max_files=10, max_bytes=100 * BS,
                      on_disk=lambda key: True)  # fmt: skip
    ahead.on_cached = lambda path, obj: announced.append(path)
    rig.ahead, rig.fs.on_open = ahead, ahead.opened
    rels = [f"d/{n}" for n in NAMES[:30]]
    try:
        ahead.hint(rels)
        for rel in rels:
            ahead.wait_idle()
            wait_quiet(rig.scheduler)
            obj = resolve(rel)
            assert obj is not None
            ahead.written(BlockKey(obj, 0))  # the disk tier wrote it...
            ahead.written(BlockKey(obj, 0))  # ...(told once)
            opened = rig.fs.open("/" + rel, 0)  # ...and the native loop reads it there
            rig.fs.release(opened.fh)
        ahead.wait_idle()
        big = resolve("d/zbig")
        assert big is not None
        ahead.written(BlockKey(big, 0))  # not fetched ahead, and of two blocks
        snap = rig.stats.snapshot()
        assert announced == rels
        assert snap["files_prefetched"] == snap["files_prefetch_used"] == 30
        assert snap["prefetch_used"] == 30
        assert snap["bytes_fetched"] == 30 * (BS - 7)
    finally:
        rig.close()


def test_a_reader_of_every_4th_file_is_no_folder_order() -> None:
    """One shard of a folder (RANK 0 of 4, in listing order): the files in
    between are other nodes' and must not be fetched beyond a first window."""
    names = [f"f{i:04}" for i in range(400)]
    policy = FolderOrder()
    policy.add_listing("d", names)
    wanted: set[str] = set()
    for i in range(0, 400, 4):
        got = policy.on_open("d", names[i], lookahead=32)
        wanted |= set(got or ())
    others = {n for k, n in enumerate(names) if k % 4}
    assert len(wanted & others) <= 32 + 8  # one window (+ tolerance) at most, then never again
    # every 2nd file: the same
    policy = FolderOrder()
    policy.add_listing("d", names)
    wanted = set()
    for i in range(0, 400, 2):
        wanted |= set(policy.on_open("d", names[i], lookahead=32) or ())
    assert len(wanted & {n for k, n in enumerate(names) if k % 2}) <= 32 + 8
    # a contiguous reader, 8 threads a little out of order, keeps it all along
    policy = FolderOrder()
    policy.add_listing("d", names)
    order = [j for i in range(0, 400, 8) for j in reversed(range(i, min(i + 8, 400)))]
    outs = [policy.on_open("d", names[i], lookahead=32) for i in order]
    assert all(o is not None for o in outs) and outs[-1] == []
