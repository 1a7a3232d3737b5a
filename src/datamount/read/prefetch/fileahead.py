"""File-ahead prefetch, the pure part: which whole files to fetch before the
reader opens them. No threads, no I/O, no locks (read/ahead.py serialises
the calls and does the fetching).

- `FolderOrder` tells, from the sequence of opens, when a reader goes
  through a folder in the order of its listing (one thread, or several
  threads whose opens arrive a little out of order): once MIN_STREAK
  consecutive opens of one folder each move forward by at most `tolerance`
  listing positions (opens up to `tolerance` behind the furthest one are
  tolerated, neither counted nor breaking), the files after the furthest
  one opened are the ones to fetch; an open elsewhere in that folder (a
  jump, a shuffled order) breaks the pattern, and so does a reader that
  skips files (one shard of a folder: every 4th file, say): once the streak
  spans more than 2 x `tolerance` positions, at least DENSITY of them must
  have been opened (allowing `tolerance` stragglers), else fetching the
  files in between would be wasted; after such a break the folder needs
  MIN_STREAK opens of exactly the next file to start again. A random order over n files
  moves forward within the tolerance with probability ~(tolerance+1)/n per
  open, and the pattern needs two such moves in a row: over 2,000 files,
  (9/2000)^2, about once in 50,000 opens.
- `AheadPlan` is the queue of upcoming files (from that pattern, or from a
  loader's hints) and the window of those fetched but not yet opened: at
  most `max_files` files and `max_bytes` bytes ahead. `due()` says which
  files to fetch now; `opened()` moves the plan along (a file the reader
  skipped by more than `tolerance` positions leaves the plan: wasted if it
  was fetched); `clear()` drops it (the reader went elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Consecutive in-order opens that turn folder-order prefetch on: two would
# also fire on a reader that happens to open two neighbours.
MIN_STREAK = 3
# Listing positions an open may move forward (or lag behind the furthest
# open) and still be "in order": 8 reader threads open 8 files at once.
TOLERANCE = 8
# Share of the listing positions a streak passed that must have been opened.
DENSITY = 0.9


@dataclass
class _Folder:
    names: list[str]  # file names of the listing, in listing order
    index: dict[str, int]
    hi: int = -1  # furthest listing position opened in this streak
    streak: int = 0
    opened: set[int] = field(default_factory=set)
    first: int = 0  # where the streak started
    count: int = 0  # distinct positions opened in the streak
    strict: bool = False  # a sparse reader was seen: only pos == hi + 1 counts


class FolderOrder:
    """Opens in, files to fetch out. Listings come from the caller
    (`listing(folder)` each time a folder is seen without one)."""

    def __init__(self, tolerance: int = TOLERANCE, min_streak: int = MIN_STREAK) -> None:
        if tolerance < 0 or min_streak < 1:
            raise ValueError("tolerance must be >= 0 and min_streak >= 1")
        self.tolerance = tolerance
        self.min_streak = min_streak
        self._folders: dict[str, _Folder] = {}
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
        self._folders[folder] = _Folder(list(names), {n: i for i, n in enumerate(names)})
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
    def _restart(state: _Folder, pos: int) -> None:
        state.hi, state.streak, state.first, state.count = pos, 1, pos, 1
        state.opened = {pos}

    def _tail(self, state: _Folder, lookahead: int) -> list[str]:
        """The names from `start` on, less the opened ones, up to `lookahead`:
        slices of the listing between the (at most tolerance + 1) opened
        positions, not a loop over every position."""
        start = max(0, state.hi - self.tolerance)
        if len(state.opened) > 2 * (self.tolerance + 1):
            # Opened positions far behind can never be wanted again in this streak.
            state.opened = {p for p in state.opened if p >= start}
        names, cur = state.names, start
        out: list[str] = []
        for pos in sorted(p for p in state.opened if p >= start):
            if len(out) >= lookahead:
                break
            out += names[cur:pos]
            cur = pos + 1
        out += names[cur : cur + max(0, lookahead - len(out))]
        return out[:lookahead]


@dataclass(eq=False)  # identity: list.index finds an entry in C
class _Entry:
    path: str
    size: int | None = None  # None: not resolved yet
    fetched: bool = False
    skip: bool = False  # too big to fetch whole: the block prefetch reads it


class AheadPlan:
    """The upcoming files, in order, and which of them were fetched ahead.

    Paths are the caller's (mount-relative); sizes are set with `resolve`
    before a file can be due. A file larger than `max_file_bytes` (or empty)
    stays in the plan (its position counts) but is never fetched whole.

    Cost per open, amortised O(1) in the plan's length: a dict finds an
    entry, the window's files and bytes are counted as they change, two
    cursors remember how far the queue is resolved and fetched, and a
    `replace` that only moves the plan along (the folder order's next tail:
    the same files less the first ones, a few more at the end) drops and
    appends just those."""

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
        self._queue: list[_Entry] = []
        self._paths: list[str] = []  # the queue's paths, for comparisons in C
        self._by_path: dict[str, _Entry] = {}
        self._misses = 0
        self._skips = 0  # entries with skip set
        self._files = self._bytes = 0  # fetched entries (all within the reach)
        self._sized = 0  # every entry before this one has its size
        self._done = 0  # every entry before this one is fetched or skipped
        self._left: list[str] = []  # paths that left the queue, for `take_left`

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, path: str) -> bool:
        return path in self._by_path

    def paths(self) -> list[str]:
        return list(self._paths)

    def take_left(self) -> list[str]:
        """The paths that left the plan since the last call (the caller
        forgets what it kept for them)."""
        left, self._left = self._left, []
        return left

    def ahead(self) -> tuple[int, int]:
        """(files, bytes) fetched ahead and not yet opened. Fetched files are
        always within the window's reach (`due` fetches only there, opens
        only remove files before them, `replace` drops those beyond it)."""
        return self._files, self._bytes

    def replace(self, paths: Sequence[str], source: str) -> list[str]:
        """The plan becomes `paths` (what was fetched of them stays fetched
        while within the window's reach); the fetched files not in it, or
        now beyond the reach: dropped, returned (wasted)."""
        new = list(dict.fromkeys(paths))
        self.source = source
        self._misses = 0
        old = self._paths
        if new and old and new[0] in self._by_path:
            first = old.index(new[0])
            kept = len(old) - first
            if old[first:] == new[:kept] and not any(p in self._by_path for p in new[kept:]):
                dropped = [e.path for e in self._queue[:first] if e.fetched]
                self._remove(0, first)
                self._append(new[kept:])
                return dropped  # the reach only grew: nothing fetched is beyond it
        wanted = set(new)
        dropped = [e.path for e in self._queue if e.fetched and e.path not in wanted]
        entries = [self._by_path.get(p) or _Entry(p) for p in new]
        self._remove(0, len(self._queue))
        self._left = [p for p in self._left if p not in wanted]
        for e in entries:
            self._add(e)
        for e in self._queue[self._reach() :]:
            if e.fetched:
                self._unfetch(e)
                dropped.append(e.path)
        return dropped

    def extend(self, paths: Sequence[str], source: str) -> None:
        """More files after the planned ones (a loader's next hints)."""
        self._append([p for p in dict.fromkeys(paths) if p not in self._by_path])
        self.source = source

    def clear(self) -> list[str]:
        """Drop the plan; the fetched files it held (wasted)."""
        return self.replace([], "")

    def unresolved(self) -> list[str]:
        """The files in the window's reach whose size is still unknown."""
        reach, q = self._reach(), self._queue
        while self._sized < reach and q[self._sized].size is not None:
            self._sized += 1
        return [e.path for e in q[self._sized : reach] if e.size is None]

    def resolve(self, path: str, size: int | None) -> None:
        """The size of `path` (None: it does not exist: it leaves the plan)."""
        e = self._by_path.get(path)
        if e is None:
            return
        if size is None:
            pos = self._queue.index(e)
            self._remove(pos, pos + 1)
            return
        if e.fetched:
            self._bytes += size - (e.size or 0)
        was_skip = e.skip
        e.size, e.skip = size, size == 0 or size > self.max_file_bytes
        self._skips += e.skip - was_skip
        if was_skip and not e.skip and not e.fetched:  # due again: before the cursor?
            self._done = min(self._done, self._queue.index(e))

    def due(self) -> list[str]:
        """The files to fetch now, in order, keeping the window within
        `max_files` files and `max_bytes` bytes fetched ahead. Marks them
        fetched; a file the fetcher could not take goes back with `undo`."""
        reach, q = self._reach(), self._queue
        while self._done < reach and (q[self._done].fetched or q[self._done].skip):
            self._done += 1
        out: list[str] = []
        for e in q[self._done : reach]:
            if e.fetched or e.skip:
                continue
            size = e.size
            if size is None or self._files >= self.max_files or self._bytes + size > self.max_bytes:
                break  # in order: never fetch past a file that does not fit yet
            e.fetched = True
            self._files, self._bytes = self._files + 1, self._bytes + size
            out.append(e.path)
        return out

    def undo(self, path: str) -> None:
        """`path` was not fetched after all (no room in the memory budget)."""
        e = self._by_path.get(path)
        if e is not None and e.fetched:
            self._unfetch(e)

    def opened(self, path: str) -> tuple[bool, list[str]]:
        """The reader opened `path`: (it was fetched ahead, the fetched files
        it skipped, now out of the plan). Files more than `tolerance`
        positions before it leave the plan; so does the whole plan after
        `max_misses` opens in a row of files not in it."""
        e = self._by_path.get(path)
        if e is None:
            self._misses += 1
            if self._queue and self._misses > self.max_misses:
                return False, self.clear()
            return False, []
        self._misses = 0
        pos = self._queue.index(e)
        used = e.fetched
        cut = max(0, pos - self.tolerance)
        skipped = [e.path for e in self._queue[:cut] if e.fetched]
        self._remove(pos, pos + 1)
        self._remove(0, cut)
        return used, skipped

    # -- the bookkeeping of entries coming and going ----------------------------

    def _add(self, e: _Entry) -> None:
        self._queue.append(e)
        self._paths.append(e.path)
        self._by_path[e.path] = e
        self._skips += e.skip
        if e.fetched:
            self._files, self._bytes = self._files + 1, self._bytes + (e.size or 0)

    def _append(self, paths: list[str]) -> None:
        for p in paths:
            self._add(_Entry(p))

    def _remove(self, start: int, stop: int) -> None:
        """Entries [start, stop) leave the queue."""
        if start >= stop:
            return
        for e in self._queue[start:stop]:
            del self._by_path[e.path]
            self._left.append(e.path)
            self._skips -= e.skip
            if e.fetched:
                self._files, self._bytes = self._files - 1, self._bytes - (e.size or 0)
        del self._queue[start:stop], self._paths[start:stop]
        n = stop - start  # the cursors move back with the entries after the cut
        if self._sized > start:
            self._sized = max(start, self._sized - n)
        if self._done > start:
            self._done = max(start, self._done - n)

    def _unfetch(self, e: _Entry) -> None:
        e.fetched = False
        self._files, self._bytes = self._files - 1, self._bytes - (e.size or 0)
        self._done = min(self._done, self._queue.index(e))

    def _reach(self) -> int:
        """How far into the queue the window looks: `max_files` fetchable
        files (files too big to fetch do not count)."""
        if not self._skips:
            return min(len(self._queue), self.max_files)
        count = 0
        for i, e in enumerate(self._queue):
            if not e.skip:
                count += 1
                if count > self.max_files:
                    return i
        return len(self._queue)
