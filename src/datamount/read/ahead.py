"""The file-ahead prefetcher of a mount: whole files fetched into the block
cache before the reader opens them, from two sources of "what comes next":

- the folder order (automatic): `opened(path)` reports every open; a
  FolderOrder (prefetch/files.py) tells when a folder is read in its
  listing order, and its next files become the plan; the pattern breaking
  drops the plan;
- a loader's hints: `hint(paths)` (the mount's hint socket,
  mount/hintsocket.py) queues the files a process will read next, in order; the
  hints take precedence over the folder order while any are left.

Both feed one AheadPlan: at most `max_files` files and `max_bytes` bytes
fetched ahead and not yet opened; files beyond wait. Each file's blocks go
to `BlockFetcher.prefetch_many`, so they use the same cache, the same
single flight and the same PREFETCH area of the memory budget as the block
prefetch of open files: when the budget is spent, the file waits for the
next open. A file the reader skips, or the whole plan when it goes
elsewhere, is dropped: its queued fetches are cancelled and its held blocks
given up first (`BlockFetcher.cancel`). Counters (MountStats):
files_prefetched, files_prefetch_used, files_prefetch_wasted, hinted_files.

A one-block file fetched ahead is announced once its block is on disk
(`written`, from the disk tier's writer): `on_cached(path, version)` lets
the native FUSE loop open it without Python, and that loop reports the open
back through `opened` (docs/design/ro_mount.md, "Prefetched small files open
natively").

Threads: one worker thread ("datamount-ahead") does everything (listing,
lookups, planning, scheduling fetches); `opened` and `hint` only queue an
event, so a FUSE open never waits for it. `written` runs on the disk tier's
writer threads and only looks up and removes one entry.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from datamount.read.blocks import BlockKey, ObjectId, block_count
from datamount.read.cache.held import PREFETCH_SHARE
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.fileahead import AheadPlan, FolderOrder
from datamount.read.stats import MountStats

log = logging.getLogger("datamount.ahead")

# Files fetched ahead of the reader at most: more than one open's latency
# ahead. Why 32: docs/design/ro_mount.md ("File-ahead bounds").
AHEAD_FILES = 32
# Listings the folder-order policy keeps: mount-relative paths (so a tail is
# the plan as it is, with no path built per name per open), ~150 bytes each
# with their index plus the folder's path (4 x 100,000 paths: ~60 MiB at
# worst, more for long folder paths); a folder beyond MAX_LISTING names is
# judged on its first MAX_LISTING.
MAX_FOLDERS = 4
MAX_LISTING = 100_000
# Events waiting for the worker beyond this are dropped (oldest first): a
# burst of opens faster than the worker plans only loses look-ahead.
MAX_EVENTS = 10_000

# One-block files fetched ahead whose block is not on disk yet, at most
# this many times the window's files (a block the disk tier never writes,
# its queue full, is forgotten oldest first).
LANDING_FILES = 4

Resolve = Callable[[str], ObjectId | None]
Listing = Callable[[str], Sequence[str]]


def window_bytes(fetcher: BlockFetcher) -> int:
    """The bytes the window may hold: half of the fetcher's prefetch share,
    so the block prefetch of the files being read keeps the other half."""
    return max(fetcher.block_size, int(fetcher.memory_budget * PREFETCH_SHARE) // 2)


def _plain(rel: str) -> bool:
    """A path a FUSE open could name: no empty, '.' or '..' component (a
    hint must never name a blob outside the mount's prefix)."""
    return bool(rel) and all(part not in ("", ".", "..") for part in rel.split("/"))


class FileAhead:
    """`resolve(rel)`: the version of a mount-relative path (None: no such
    file); `listing(folder)`: the names of a folder's files in listing order
    (None: no folder-order prefetch); `on_disk(key)`: whether the disk tier
    has that block (None: no disk tier)."""

    def __init__(
        self,
        fetcher: BlockFetcher,
        stats: MountStats,
        resolve: Resolve,
        listing: Listing | None,
        *,
        max_files: int = AHEAD_FILES,
        max_bytes: int | None = None,
        on_disk: Callable[[BlockKey], bool] | None = None,
    ) -> None:
        self.fetcher = fetcher
        self._on_disk = on_disk
        self.stats = stats
        self._resolve = resolve
        self._listing = listing
        nbytes = window_bytes(fetcher) if max_bytes is None else max_bytes
        self.plan = AheadPlan(max_files, nbytes, max_file_bytes=max(1, nbytes // 4))
        self.order = FolderOrder()
        self._objs: dict[str, ObjectId] = {}  # planned paths resolved (fetched ones: to cancel)
        # Told (path, version) of a one-block file fetched ahead once its block
        # is on disk: the native FUSE loop opens it from there (fs.ops.prefetched).
        self.on_cached: Callable[[str, ObjectId], None] | None = None
        self._landing: OrderedDict[ObjectId, str] = OrderedDict()  # fetched, not on disk yet
        self._landing_lock = threading.Lock()
        self._listed: OrderedDict[str, None] = OrderedDict()  # folders, oldest first
        self._events: deque[tuple[str, object]] = deque(maxlen=MAX_EVENTS)
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._idle = True
        self._waiting = False  # the worker waits for an event: `_put` must notify
        self._thread = threading.Thread(target=self._work, name="datamount-ahead", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------

    def opened(self, path: str) -> None:
        """A FUSE open of `path` ('/a/b' or 'a/b') succeeded."""
        self._put("open", path.strip("/"))

    def hint(self, paths: Sequence[str], *, replace: bool = False) -> None:
        """A loader will read `paths` (mount-relative) next, in this order,
        after what it hinted before (`replace`: instead of it). Paths with
        '.' or '..' components are ignored."""
        rels = [r for r in (p.strip("/") for p in paths) if _plain(r)]
        self.stats.add(hinted_files=len(rels))
        self._put("hint", (rels, replace))

    def written(self, key: BlockKey) -> None:
        """The disk tier wrote `key`'s block file: a one-block file fetched
        ahead is announced (`on_cached`)."""
        if key.index or self.on_cached is None:
            return
        with self._landing_lock:
            path = self._landing.pop(key.obj, None)
        if path is not None:
            self.on_cached(path, key.obj)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Until every queued event is planned (tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._idle and not self._events, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(5.0)

    def _put(self, kind: str, what: object) -> None:
        with self._cond:
            if self._closed:
                return
            self._events.append((kind, what))
            if self._waiting:  # a busy worker finds the event without a wake-up
                self._cond.notify_all()  # all: a wait_idle caller may be first in line

    # -- the worker --------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle = True
                self._cond.notify_all()  # wait_idle callers (none: no wake-up)
                self._waiting = True
                self._cond.wait_for(lambda: self._closed or bool(self._events))
                self._waiting = False
                if self._closed:
                    return
                kind, what = self._events.popleft()
                self._idle = False
            try:
                if isinstance(what, str):
                    self._on_open(what)
                else:
                    assert isinstance(what, tuple)
                    self._on_hint(list(what[0]), bool(what[1]))
                self._pump()
            except Exception:  # never lose the worker: it only prefetches
                log.exception("file-ahead prefetch of %s failed", kind)

    def _on_open(self, rel: str) -> None:
        used, skipped = self.plan.opened(rel)
        if used:
            self.stats.add(files_prefetch_used=1)
            self._taken(rel)
        self._drop(skipped)
        if self._listing is not None:
            self._follow(rel)
        self._keep_planned()

    def _taken(self, rel: str) -> None:
        """A file fetched ahead was opened. The native FUSE loop reads what
        the disk tier holds there, never through the fetcher, whose hold
        would keep those blocks unread for HOLD_SECONDS and the window full:
        they count as read now."""
        obj = self._objs.get(rel)
        if obj is None or self._on_disk is None:
            return
        keys = [key for key in self._keys(obj) if self._on_disk(key)]
        if keys:
            self.fetcher.taken(keys)

    def _follow(self, rel: str) -> None:
        """The folder order: FolderOrder judges mount-relative paths (its
        listings are given as paths), so its tail is the plan as it is."""
        folder = rel.rpartition("/")[0]
        if self.order.wants_listing(folder, rel):
            self._list(folder)
        tail = self.order.on_open(folder, rel, lookahead=2 * self.plan.max_files)
        source = f"folder:{folder}"
        if tail is None:
            if self.plan.source == source:
                log.debug("folder order broken in %r: plan dropped", folder)
                self._drop(self.plan.clear())
            return
        if not tail or (self.plan.source == "hints" and len(self.plan)):
            return  # hints left: they know better than the listing
        self._drop(self.plan.replace(tail, source))

    def _keep_planned(self) -> None:
        """Forget the versions of paths that left the plan (O(what left))."""
        for path in self.plan.take_left():
            if path not in self.plan:
                self._objs.pop(path, None)

    def _on_hint(self, rels: list[str], replace: bool) -> None:
        if replace or self.plan.source != "hints":
            self._drop(self.plan.replace(rels, "hints"))
        else:
            self.plan.extend(rels, "hints")
        self._keep_planned()

    def _list(self, folder: str) -> None:
        assert self._listing is not None
        try:
            names = list(self._listing(folder)[:MAX_LISTING])
        except Exception as exc:  # no listing: no folder-order prefetch there
            log.debug("listing %r for file-ahead prefetch: %s", folder, exc)
            names = []
        self._listed[folder] = None
        self.order.add_listing(folder, [f"{folder}/{n}" if folder else n for n in names])
        while len(self._listed) > MAX_FOLDERS:
            old, _ = self._listed.popitem(last=False)
            self.order.forget(old)

    def _pump(self) -> None:
        """Fetch what the window has room for, nearest first."""
        for path in self.plan.unresolved():
            obj = self._objs.get(path)
            if obj is None:
                try:
                    obj = self._resolve(path)
                except Exception as exc:
                    log.debug("resolving %r for file-ahead prefetch: %s", path, exc)
                    obj = None
            if obj is not None:
                self._objs[path] = obj
            self.plan.resolve(path, None if obj is None else obj.size)
        due = self.plan.due()
        for n, path in enumerate(due):
            obj = self._objs[path]
            keys = self._keys(obj)
            if self.fetcher.prefetch_many(keys) < len(keys):
                for later in due[n:]:  # the budget is spent: again at the next open
                    self.plan.undo(later)
                break
            self.stats.add(files_prefetched=1)
            if len(keys) == 1 and self.on_cached is not None:
                self._land(obj, path)

    def _land(self, obj: ObjectId, path: str) -> None:
        with self._landing_lock:
            self._landing[obj] = path
            if len(self._landing) > LANDING_FILES * self.plan.max_files:
                self._landing.popitem(last=False)

    def _drop(self, paths: list[str]) -> None:
        """Fetched-ahead files left unopened: wasted; let their blocks go."""
        if not paths:
            return
        self.stats.add(files_prefetch_wasted=len(paths))
        keys: list[BlockKey] = []
        for path in paths:
            obj = self._objs.pop(path, None)
            if obj is not None:
                keys.extend(self._keys(obj))
        self.fetcher.cancel(keys)

    def _keys(self, obj: ObjectId) -> list[BlockKey]:
        return [BlockKey(obj, i) for i in range(block_count(obj.size, self.fetcher.block_size))]
