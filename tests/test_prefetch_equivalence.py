"""The file-ahead structures of read/prefetch/fileahead.py against the plain
versions they replaced (kept here as the reference): on random sequences of
opens, hints, sizes and refusals, every answer and every state is the same,
so the O(1)-per-open bookkeeping fetches exactly what the O(window) one did."""

# ruff: noqa: E501

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from datamount.read.prefetch.fileahead import DENSITY, MIN_STREAK, TOLERANCE, AheadPlan, FolderOrder

pytestmark = pytest.mark.unit


@dataclass
class _OldFolder:
    names: list[str]  # file names of the listing, in listing order
    index: dict[str, int]
    hi: int = -1  # furthest listing position opened in this streak
    streak: int = 0
    opened: set[int] = field(default_factory=set)
    first: int = 0  # where the streak started
    count: int = 0  # distinct positions opened in the streak
    strict: bool = False  # a sparse reader was seen: only pos == hi + 1 counts


class OldFolderOrder:
    """Opens in, files to fetch out. Listings come from the caller
    (`listing(folder)` each time a folder is seen without one)."""

    def __init__(self, tolerance: int = TOLERANCE, min_streak: int = MIN_STREAK) -> None:
        if tolerance < 0 or min_streak < 1:
            raise ValueError("tolerance must be >= 0 and min_streak >= 1")
        self.tolerance = tolerance
        self.min_streak = min_streak
        self._folders: dict[str, _OldFolder] = {}
        self._last: dict[str, str] = {}  # folder -> name of its last open, before a listing

    def wants_listing(self, folder: str, name: str) -> bool:
        """Whether this open needs the folder's listing to be judged: only
        from the second open of a folder on (a reader opening one file per
        folder never lists anything)."""
        if folder in self._folders:
            return False
        if folder not in self._last:
            self._last[folder] = name
            return False
        return True

    def add_listing(self, folder: str, names: Sequence[str]) -> None:
        """The listing of `folder`; the open before it counts (the caller
        judges the open that asked for it with `on_open`)."""
        self._folders[folder] = _OldFolder(list(names), {n: i for i, n in enumerate(names)})
        first = self._last.pop(folder, None)
        if first is not None:
            self.on_open(folder, first, 0)

    def forget(self, folder: str) -> None:
        self._folders.pop(folder, None)
        self._last.pop(folder, None)

    def folders(self) -> int:
        return len(self._folders)

    def on_open(self, folder: str, name: str, lookahead: int) -> list[str] | None:
        """The files of `folder` to have ahead (up to `lookahead`, in listing
        order, the unopened ones from `tolerance` behind the furthest open
        on) when the folder is read in order; [] while the pattern is not
        (yet) established; None when this open breaks it."""
        state = self._folders.get(folder)
        if state is None:
            return []
        pos = state.index.get(name)
        if pos is None:  # not in the listing we hold (a new file): judge nothing
            return [] if state.streak < self.min_streak else self._tail(state, lookahead)
        was_on = state.streak >= self.min_streak
        reach = 1 if state.strict else 1 + self.tolerance
        if state.hi < 0:
            self._restart(state, pos)
        elif state.hi < pos <= state.hi + reach:
            state.hi = pos
            state.streak += 1
        elif state.hi - self.tolerance <= pos <= state.hi and not state.strict:
            pass  # a reader thread a little behind the others
        else:
            self._restart(state, pos)
            return None if was_on else []
        if pos not in state.opened:
            state.count += 1
        state.opened.add(pos)
        span = state.hi - state.first + 1
        if span > 2 * self.tolerance and state.count + self.tolerance < DENSITY * span:
            state.strict = True  # it skips files: what lies between is not wanted
            self._restart(state, pos)
            return None if was_on else []
        if state.streak < self.min_streak:
            return []
        return self._tail(state, lookahead)

    @staticmethod
    def _restart(state: _OldFolder, pos: int) -> None:
        state.hi, state.streak, state.first, state.count = pos, 1, pos, 1
        state.opened = {pos}

    def _tail(self, state: _OldFolder, lookahead: int) -> list[str]:
        start = max(0, state.hi - self.tolerance)
        # Opened positions far behind can never be wanted again in this streak.
        state.opened = {p for p in state.opened if p >= start}
        out: list[str] = []
        for pos in range(start, len(state.names)):
            if pos not in state.opened:
                out.append(state.names[pos])
                if len(out) >= lookahead:
                    break
        return out


@dataclass
class _OldEntry:
    path: str
    size: int | None = None  # None: not resolved yet
    fetched: bool = False
    skip: bool = False  # too big to fetch whole: the block prefetch reads it


class OldAheadPlan:
    """The upcoming files, in order, and which of them were fetched ahead.

    Paths are the caller's (mount-relative); sizes are set with `resolve`
    before a file can be due. A file larger than `max_file_bytes` (or empty)
    stays in the plan (its position counts) but is never fetched whole."""

    def __init__(
        self, max_files: int, max_bytes: int, *, max_file_bytes: int | None = None,
        tolerance: int = TOLERANCE, max_misses: int = TOLERANCE,
    ) -> None:  # fmt: skip
        if max_files < 1 or max_bytes < 1:
            raise ValueError("max_files and max_bytes must be >= 1")
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.max_file_bytes = max_bytes if max_file_bytes is None else max_file_bytes
        self.tolerance = tolerance
        self.max_misses = max_misses
        self.source = ""  # who made the plan: "folder:<path>" or "hints"
        self._queue: list[_OldEntry] = []
        self._misses = 0

    def __len__(self) -> int:
        return len(self._queue)

    def paths(self) -> list[str]:
        return [e.path for e in self._queue]

    def ahead(self) -> tuple[int, int]:
        """(files, bytes) fetched ahead and not yet opened. Fetched files are
        always within the window's reach (`due` fetches only there, opens
        only remove files before them, `replace` drops those beyond it), so
        only the reach is counted: O(max_files) per call, not O(plan)."""
        fetched = [e for e in self._queue[: self._reach()] if e.fetched]
        return len(fetched), sum(e.size or 0 for e in fetched)

    def replace(self, paths: Sequence[str], source: str) -> list[str]:
        """The plan becomes `paths` (what was fetched of them stays fetched
        while within the window's reach); the fetched files not in it, or
        now beyond the reach: dropped, returned (wasted)."""
        old = {e.path: e for e in self._queue}
        self._queue = [old.pop(p) if p in old else _OldEntry(p) for p in dict.fromkeys(paths)]
        self.source = source
        self._misses = 0
        dropped = [e.path for e in old.values() if e.fetched]
        for e in self._queue[self._reach() :]:
            if e.fetched:
                e.fetched = False
                dropped.append(e.path)
        return dropped

    def extend(self, paths: Sequence[str], source: str) -> None:
        """More files after the planned ones (a loader's next hints)."""
        known = {e.path for e in self._queue}
        self._queue.extend(_OldEntry(p) for p in dict.fromkeys(paths) if p not in known)
        self.source = source

    def clear(self) -> list[str]:
        """Drop the plan; the fetched files it held (wasted)."""
        return self.replace([], "")

    def unresolved(self) -> list[str]:
        """The files in the window's reach whose size is still unknown."""
        return [e.path for e in self._queue[: self._reach()] if e.size is None]

    def resolve(self, path: str, size: int | None) -> None:
        """The size of `path` (None: it does not exist: it leaves the plan)."""
        for i, e in enumerate(self._queue):
            if e.path == path:
                if size is None:
                    del self._queue[i]
                else:
                    e.size, e.skip = size, size == 0 or size > self.max_file_bytes
                return

    def due(self) -> list[str]:
        """The files to fetch now, in order, keeping the window within
        `max_files` files and `max_bytes` bytes fetched ahead. Marks them
        fetched; a file the fetcher could not take goes back with `undo`."""
        files, nbytes = self.ahead()
        out: list[str] = []
        for e in self._queue[: self._reach()]:
            if e.fetched or e.skip:
                continue
            if e.size is None or files >= self.max_files or nbytes + e.size > self.max_bytes:
                break  # in order: never fetch past a file that does not fit yet
            e.fetched = True
            files, nbytes = files + 1, nbytes + e.size
            out.append(e.path)
        return out

    def undo(self, path: str) -> None:
        """`path` was not fetched after all (no room in the memory budget)."""
        for e in self._queue:
            if e.path == path:
                e.fetched = False
                return

    def opened(self, path: str) -> tuple[bool, list[str]]:
        """The reader opened `path`: (it was fetched ahead, the fetched files
        it skipped, now out of the plan). Files more than `tolerance`
        positions before it leave the plan; so does the whole plan after
        `max_misses` opens in a row of files not in it."""
        pos = next((i for i, e in enumerate(self._queue) if e.path == path), None)
        if pos is None:
            self._misses += 1
            if self._queue and self._misses > self.max_misses:
                return False, self.clear()
            return False, []
        self._misses = 0
        used = self._queue[pos].fetched
        cut = max(0, pos - self.tolerance)
        skipped = [e.path for e in self._queue[:cut] if e.fetched]
        del self._queue[pos]
        del self._queue[:cut]
        return used, skipped

    def _reach(self) -> int:
        """How far into the queue the window looks: `max_files` fetchable
        files (files too big to fetch do not count)."""
        count = 0
        for i, e in enumerate(self._queue):
            if not e.skip:
                count += 1
                if count > self.max_files:
                    return i
        return len(self._queue)


# -- the comparison -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_folder_order_answers_as_before(seed: int) -> None:
    rnd = random.Random(seed)
    names = [f"f{i:04}" for i in range(300)]
    new, old = FolderOrder(), OldFolderOrder()
    new.add_listing("d", names)
    old.add_listing("d", names)
    pos = 0
    for _ in range(600):
        move = rnd.random()
        if move < 0.8:  # in order, a few threads a little out of order
            pos = min(len(names) - 1, max(0, pos + rnd.randint(-3, 6)))
        elif move < 0.9:
            pos = rnd.randrange(len(names))  # a jump
        else:
            pos = min(len(names) - 1, pos + rnd.choice([2, 4]))  # a sparse reader
        look = rnd.choice([5, 32, 64])
        assert new.on_open("d", names[pos], look) == old.on_open("d", names[pos], look)


def _same(new: AheadPlan, old: OldAheadPlan) -> None:
    assert new.paths() == old.paths()
    assert new.ahead() == old.ahead()
    assert len(new) == len(old) and new.source == old.source


@pytest.mark.parametrize("seed", range(60))
def test_ahead_plan_answers_as_before(seed: int) -> None:
    rnd = random.Random(seed)
    names = [f"f{i:03}" for i in range(120)]
    kw = {"max_file_bytes": 400, "tolerance": rnd.choice([0, 2, 8]), "max_misses": 3}
    files, nbytes = rnd.choice([2, 4, 32]), rnd.choice([300, 1000, 10_000])
    new, old = AheadPlan(files, nbytes, **kw), OldAheadPlan(files, nbytes, **kw)
    sizes = {n: rnd.choice([0, 10, 100, 500]) if rnd.random() < 0.2 else 100 for n in names}
    start = 0
    for _ in range(300):
        op = rnd.random()
        if op < 0.35:  # the folder order's next tail
            start = min(len(names) - 1, start + rnd.randint(0, 3))
            tail = names[start : start + rnd.choice([8, 64])]
            if rnd.random() < 0.3 and len(tail) > 2:
                tail = tail[:1] + tail[2:]
            assert new.replace(tail, "folder:d") == old.replace(tail, "folder:d")
        elif op < 0.4:
            hints = rnd.sample(names, rnd.randint(0, 10))
            if rnd.random() < 0.5:
                new.extend(hints, "hints")
                old.extend(hints, "hints")
            else:
                assert new.replace(hints, "hints") == old.replace(hints, "hints")
        elif op < 0.65:
            pick = rnd.choice(names if rnd.random() < 0.2 else (old.paths()[:12] or names))
            assert new.opened(pick) == old.opened(pick)
        elif op < 0.67:
            assert new.clear() == old.clear()
        else:
            assert new.unresolved() == old.unresolved()
            for path in old.unresolved():
                size = None if rnd.random() < 0.05 else sizes[path]
                new.resolve(path, size)
                old.resolve(path, size)
            due = old.due()
            assert new.due() == due
            for path in due:
                if rnd.random() < 0.15:
                    new.undo(path)
                    old.undo(path)
        _same(new, old)


def test_left_paths_are_reported_once() -> None:
    plan = AheadPlan(4, 1000)
    plan.replace(["a", "b", "c", "d"], "folder:x")
    assert plan.take_left() == []
    plan.opened("b")
    assert plan.take_left() == ["b"]
    plan.replace(["c", "d", "e"], "folder:x")  # moves along: a leaves
    assert plan.take_left() == ["a"] and plan.take_left() == []
    assert "e" in plan and "a" not in plan
