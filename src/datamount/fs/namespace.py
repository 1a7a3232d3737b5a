"""The mounted namespace: names and attributes over an ObjectStore prefix.

One job: answer "what is at this path" and "what is in this directory" for a
read-only tree of blobs, with as few storage requests as the answers allow.

- `list_dir(path)` streams a directory page by page (`list_pages(prefix,
  delimiter='/')`): entries are yielded as each page arrives. Prefixes and
  folder markers (`x/` blobs, ADLS `is_dir` blobs) are directories; a name
  that is both a blob and a prefix is shown once, as the directory.
- `getattr(path)` answers from the attribute cache (filled by listings), else
  from the parent's complete cached listing (a missing name there is ENOENT
  without a request). The first miss in a folder lists that folder (up to
  PARENT_LISTING_MAX entries; concurrent misses wait for that listing);
  otherwise one lookup listing (`list_pages(key, delimiter='/')` sees both
  the blob `key` and the prefix `key/`).
- Results, including missing names, are kept for `ttl` seconds (None: never
  expire, the read-only default of Azure ML).
- A uri_file mount (`file_key`) shows exactly that one blob at the root.
- `take_changed(path)` tells whether the version of `path` changed since the
  namespace last saw it (a refresh after the TTL, or a lookup after a stale
  read, found another etag): the kernel may still hold the old attributes
  (its timeout runs from when it asked, which can be after the namespace's
  entry was filled), so the open that pins the new version has them dropped.

Threads: any number of FUSE threads call in at once; one lock guards the
caches and no request is made while holding it.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from datamount.errors import ObjectNotFound
from datamount.storage.base import ListPage, ObjectInfo, ObjectStore

# Bounds the metadata kept in RAM (~300 bytes an entry: ~300 MB at the cap);
# an evicted entry costs one lookup request when it is asked for again.
MAX_CACHED_ATTRS = 1_000_000
MAX_CACHED_LISTING_ENTRIES = 1_000_000  # entries of complete listings, all directories
# A lookup miss lists its folder when it has at most about this many entries
# (the first listing page holds 1,000): 2,000 files opened by name in 20
# folders cost 21 listing requests instead of 2,000 lookups, which doubled
# the requests of reading them (mount 0.45 x the download of the same tree).
PARENT_LISTING_MAX = 1000


@dataclass(frozen=True)
class Attrs:
    """What the filesystem knows about one name. Files carry their version."""

    is_dir: bool
    size: int
    mtime: float
    key: str  # the blob name (files) or the prefix ending in '/' (directories)
    etag: str = ""


def _not_found(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def split(path: str) -> tuple[str, str]:
    """'/a/b/c' -> ('a/b', 'c'); '/' -> ('', '')."""
    rel = path.strip("/")
    parent, _, name = rel.rpartition("/")
    return parent, name


def _valid_name(name: str) -> bool:
    # 'a//b' (an empty component) and '.'/'..' cannot be shown as directory entries.
    return bool(name) and name not in (".", "..") and "/" not in name


class _Cache:
    """TTL + LRU map bounded by a total weight (an entry weighs 1, a listing its
    length); a value of None records a missing name (negative entry)."""

    def __init__(self, ttl: float | None, max_weight: int, clock: Callable[[], float]) -> None:
        self.ttl = ttl
        self.max_weight = max_weight
        self.clock = clock
        self.weight = 0
        self._items: OrderedDict[str, tuple[float, object, int]] = OrderedDict()

    def get(self, key: str) -> tuple[bool, object]:
        item = self._items.get(key)
        if item is None:
            return False, None
        expires, value, _ = item
        if self.clock() >= expires:
            self.pop(key)
            return False, None
        self._items.move_to_end(key)
        return True, value

    def put(self, key: str, value: object, weight: int = 1) -> None:
        if self.ttl == 0:
            return
        self.pop(key)
        expires = float("inf") if self.ttl is None else self.clock() + self.ttl
        self._items[key] = (expires, value, weight)
        self.weight += weight
        while self.weight > self.max_weight and len(self._items) > 1:
            _, (_, _, w) = self._items.popitem(last=False)
            self.weight -= w

    def names(self) -> list[str]:
        return list(self._items)

    def pop(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.weight -= item[2]


class Namespace:
    """Directory listings and attributes of the tree under `root_key`.

    `root_key` is a folder prefix ('' = the whole container). With
    `file_key`, the root holds just that blob, under its base name.
    `ttl` is in seconds; None never expires, 0 disables caching.
    """

    def __init__(
        self,
        store: ObjectStore,
        root_key: str = "",
        *,
        file_key: str | None = None,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        mount_time: float | None = None,
    ) -> None:
        self.store = store
        self.prefix = root_key.rstrip("/") + "/" if root_key.strip("/") else ""
        self.file_key = file_key
        self.file_name = file_key.rstrip("/").rpartition("/")[2] if file_key else None
        self.ttl = ttl
        self.mount_time = time.time() if mount_time is None else mount_time
        self._lock = threading.Lock()
        self._attrs = _Cache(ttl, MAX_CACHED_ATTRS, clock)
        self._listings = _Cache(ttl, MAX_CACHED_LISTING_ENTRIES, clock)
        self._parents_tried = _Cache(ttl, MAX_CACHED_ATTRS, clock)  # folders listed for a lookup
        self._parent_flights: dict[str, threading.Event] = {}
        self._seen: OrderedDict[str, str] = OrderedDict()  # path -> version last seen
        self._changed: set[str] = set()  # paths whose version changed since seen
        self.requests = 0  # storage requests made (listing pages + stats), for stats and tests

    # -- keys ----------------------------------------------------------------

    def _dir_attrs(self, key: str) -> Attrs:
        return Attrs(is_dir=True, size=0, mtime=self.mount_time, key=key)

    def _file_attrs(self, info: ObjectInfo) -> Attrs:
        mtime = info.last_modified if info.last_modified is not None else self.mount_time
        return Attrs(is_dir=False, size=info.size, mtime=mtime, key=info.key, etag=info.etag)

    def _entries(self, page: ListPage) -> list[tuple[str, Attrs]]:
        """A page's objects and prefixes as one key-ordered list of (key, attrs).
        Directory keys end with '/'; a marker blob 'x/' becomes the directory 'x/'."""
        entries: list[tuple[str, Attrs]] = []
        for info in page.objects:
            if info.is_dir or info.key.endswith("/"):
                key = info.key.rstrip("/") + "/"
                entries.append((key, self._dir_attrs(key)))
            else:
                entries.append((info.key, self._file_attrs(info)))
        entries.extend((p, self._dir_attrs(p)) for p in page.prefixes)
        entries.sort(key=lambda e: e[0])
        return entries

    def _dir_prefix(self, rel: str) -> str:
        return self.prefix + rel + "/" if rel else self.prefix

    # -- listings ------------------------------------------------------------

    def list_dir(self, path: str) -> Iterator[tuple[str, Attrs]]:
        """(name, attrs) of every entry of directory `path`, streamed page by page.

        NotADirectoryError / FileNotFoundError when `path` is not a directory
        (checked before the first entry; the root always exists).
        """
        rel = path.strip("/")
        if rel:
            attrs = self.getattr(path)
            if not attrs.is_dir:
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        with self._lock:
            hit, cached = self._listings.get(rel)
        if hit:
            assert isinstance(cached, dict)
            yield from cached.items()
            return
        if self.file_key is not None:
            yield from self._list_file_root()
            return
        complete: dict[str, Attrs] = {}
        for name, attrs in self._stream(self._dir_prefix(rel)):
            child = f"{rel}/{name}" if rel else name
            with self._lock:
                self._attrs.put(child, attrs)
                self._saw(child, attrs)
            complete[name] = attrs
            yield name, attrs
        # Only a listing that ran to its end answers lookups of missing names.
        with self._lock:
            self._listings.put(rel, complete, weight=max(1, len(complete)))

    def _list_file_root(self) -> Iterator[tuple[str, Attrs]]:
        assert self.file_name is not None
        try:
            attrs = self.getattr("/" + self.file_name)
        except FileNotFoundError:
            return
        yield self.file_name, attrs

    def _pages(self, prefix: str) -> Iterator[ListPage]:
        for page in self.store.list_pages(prefix, delimiter="/"):
            with self._lock:
                self.requests += 1
            yield page

    def _stream(self, prefix: str) -> Iterator[tuple[str, Attrs]]:
        """Entries directly under `prefix` in key order, folder markers as
        directories, each name once (directories shadow files)."""
        seen: set[str] = set()
        held: deque[tuple[str, Attrs]] = deque()  # files a later 'name/' prefix may shadow
        for page in self._pages(prefix):
            for key, attrs in self._entries(page):
                name = key[len(prefix) :].rstrip("/")
                if not key.startswith(prefix) or not _valid_name(name):
                    continue  # the folder's own marker ('prefix' itself), 'a//b', '.'
                # Keys arrive sorted, so a held file 'x' is safe once a key past 'x/' shows.
                while held and held[0][1].key + "/" < key:
                    out = held.popleft()
                    seen.add(out[0])
                    yield out
                if attrs.is_dir:
                    held = deque(h for h in held if h[0] != name)
                    if name not in seen:
                        seen.add(name)
                        yield name, attrs
                elif name not in seen:
                    held.append((name, attrs))
        for out in held:
            if out[0] not in seen:
                yield out

    # -- attributes ----------------------------------------------------------

    def getattr(self, path: str) -> Attrs:
        """Attributes of `path`; FileNotFoundError if nothing is there."""
        rel = path.strip("/")
        if not rel:
            return self._dir_attrs(self.prefix)
        with self._lock:
            hit, value = self._cached(rel)
        if not hit:
            hit, value = self._lookup_in_parent(rel)
        if hit:
            if value is None:
                raise _not_found(path)
            assert isinstance(value, Attrs)
            return value
        attrs = self._lookup(rel)
        with self._lock:
            self._attrs.put(rel, attrs)
            if attrs is not None:
                self._saw(rel, attrs)
        if attrs is None:
            raise _not_found(path)
        return attrs

    def listed(self, path: str) -> dict[str, Attrs] | None:
        """The complete cached listing of folder `path` (name -> attributes;
        never changed once cached: do not change it either), or None when
        there is none (not listed, expired, or too big to keep)."""
        with self._lock:
            hit, listing = self._listings.get(path.strip("/"))
        return listing if hit and isinstance(listing, dict) else None

    def peek(self, path: str) -> Attrs | None:
        """The cached attributes of `path`, if any: no request, nothing listed."""
        with self._lock:
            hit, value = self._cached(path.strip("/"))
        return value if hit and isinstance(value, Attrs) else None

    def _saw(self, rel: str, attrs: Attrs) -> None:
        """Record the version of `rel` just fetched; a different one than last
        time marks `rel` changed. Lock held."""
        version = "/" if attrs.is_dir else f"{attrs.etag}:{attrs.size}"
        before = self._seen.pop(rel, None)
        if before is not None and before != version:
            self._changed.add(rel)
        self._seen[rel] = version  # the newest: dicts keep insertion order
        if len(self._seen) > MAX_CACHED_ATTRS:
            self._changed.discard(self._seen.popitem(last=False)[0])

    def take_changed(self, path: str) -> bool:
        """True (once) when the version of `path` changed since it was last
        seen before: whoever was told the old attributes should forget them."""
        rel = path.strip("/")
        with self._lock:
            if rel in self._changed:
                self._changed.discard(rel)
                return True
            return False

    def _cached(self, rel: str) -> tuple[bool, object]:
        """(hit, attrs or None) from the caches. Lock held."""
        hit, value = self._attrs.get(rel)
        if not hit:
            parent, name = split(rel)
            listed, listing = self._listings.get(parent)
            if listed:
                assert isinstance(listing, dict)
                hit, value = True, listing.get(name)
        return hit, value

    def _lookup_in_parent(self, rel: str) -> tuple[bool, object]:
        """The first miss in a folder lists the folder (once: concurrent misses
        wait for it), then answers from what the listing cached."""
        if self.file_key is not None or self.ttl == 0:
            return False, None
        parent = split(rel)[0]
        with self._lock:
            flight = self._parent_flights.get(parent)
            leader = flight is None and not self._parents_tried.get(parent)[0]
            if leader:
                flight = self._parent_flights[parent] = threading.Event()
        if flight is None:
            return False, None  # listed before (a big folder, or the name came later)
        if leader:
            try:
                for n, _ in enumerate(self.list_dir("/" + parent)):
                    if n >= PARENT_LISTING_MAX:
                        break  # a big folder: the names seen are cached, the rest looked up
            except OSError:
                pass  # the lookup of the name itself reports what is wrong
            finally:
                with self._lock:
                    self._parents_tried.put(parent, True)
                    del self._parent_flights[parent]
                flight.set()
        else:
            flight.wait()
        with self._lock:
            return self._cached(rel)

    def _lookup(self, rel: str) -> Attrs | None:
        """One request: what is at `rel` (a file, a directory, or nothing)."""
        if self.file_key is not None:
            if rel != self.file_name:
                return None
            try:
                with self._lock:
                    self.requests += 1
                info = self.store.stat(self.file_key)
            except ObjectNotFound:
                return None
            return None if info.is_dir else self._file_attrs(info)
        key = self.prefix + rel
        as_dir = key + "/"
        found: Attrs | None = None
        for page in self._pages(key):
            for entry_key, attrs in self._entries(page):
                if entry_key == as_dir or (entry_key == key and attrs.is_dir):
                    return self._dir_attrs(as_dir)
                if entry_key == key:
                    found = attrs
                if entry_key > as_dir:
                    return found
        return found

    def invalidate(self, path: str) -> None:
        """Forget what is cached about `path` and its parent's listing (a
        version found stale on read: the next open looks again)."""
        rel = path.strip("/")
        with self._lock:
            self._attrs.pop(rel)
            self._listings.pop(split(rel)[0])

    def invalidate_tree(self, path: str) -> None:
        """Forget `path`, everything cached under it, and its parent's listing
        (a folder renamed or removed through an rw mount). One pass over the
        caches: folder renames are rare next to lookups."""
        rel = path.strip("/")
        below = rel + "/"
        with self._lock:
            for cache in (self._attrs, self._listings):
                for key in [k for k in cache.names() if k == rel or k.startswith(below)]:
                    cache.pop(key)
            self._listings.pop(split(rel)[0])
