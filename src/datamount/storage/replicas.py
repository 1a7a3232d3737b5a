"""ReplicaStore: one input served by N replicas of the same data (several
datastores or accounts), read from a preferred one, failing over to another
only when the object there is provably the same content.

The store presents the keys of the first replica (the spec's `path`); each
replica holds the same objects under its own root key. The versions it gives
out name their replica in the etag (`r<index>:<etag>`), and a pinned read goes
to that replica: the preferred one, until it fails. A request that fails
after its retries with throttling (429/503) or an unreachable service (an
exhausted transient error) marks that replica down for `cooldown` seconds
and moves on to the next one in order.
Before a pinned read moves to another replica, that replica's object is
compared with the version already seen: the same size and the same
Content-MD5. A different size or MD5 is `ReplicaMismatch` (never a mixed
read); an MD5 missing on either side is refused too, with its own message.
Listings that fail half-way resume on the next replica after the last key
already given.

Threads: safe from any thread; the maps of seen versions and of down replicas
are guarded by one lock (never held across a request).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from datamount.errors import StorageError
from datamount.storage.base import ListPage, ObjectInfo, ReadableStore, ReadOnlyStore

log = logging.getLogger("datamount.storage")

T = TypeVar("T")
# A replica that failed is skipped this long before it is tried again: long
# enough to ride out an account's throttling window, short enough that the
# striping comes back within a minute.
COOLDOWN_SECONDS = 30.0


class ReplicaMismatch(StorageError):
    """Two replicas of one object do not hold provably the same content."""


@dataclass(frozen=True)
class Replica:
    """One copy: its store, the key (object or folder prefix) of the data in
    it, and a name for logs and errors (its URI; never a secret)."""

    store: ReadableStore
    root: str
    name: str


def fails_over(exc: BaseException) -> bool:
    """A failure that another replica may not have: throttling or an
    unreachable service after the retries (or a transient error where the
    store has no retries). Not found, denied, changed: permanent, raised."""
    return isinstance(exc, StorageError) and (exc.exhausted or exc.transient)


class ReplicaStore(ReadOnlyStore):
    """A read-only store over `replicas`, reading `replicas[preferred]` first.

    `cooldown`: seconds a failed replica is skipped; `clock`: for tests.
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        preferred: int = 0,
        cooldown: float = COOLDOWN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ValueError("a ReplicaStore needs at least one replica")
        self.replicas = list(replicas)
        self.preferred = preferred % len(self.replicas)
        self.cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._down_until = [0.0] * len(self.replicas)
        # (key, tagged etag) -> info: each version given out, for the check before a failover.
        self._seen: dict[tuple[str, str], ObjectInfo] = {}
        # (key, etag, replica index) -> that replica's etag of the same content.
        self._verified: dict[tuple[str, str, int], str] = {}
        self.failovers = 0

    def __repr__(self) -> str:
        names = ", ".join(r.name for r in self.replicas)
        return f"ReplicaStore([{names}], preferred={self.preferred})"

    # -- keys -------------------------------------------------------------

    def _key(self, index: int, key: str) -> str | None:
        """`key` (of replica 0) in replica `index`; None outside the data."""
        root, mine = self.replicas[0].root, self.replicas[index].root
        if index == 0 or key == root:
            return key if index == 0 else mine
        if key.startswith(_folder(root)):
            return _folder(mine) + key[len(_folder(root)) :]
        if root and key == root.rstrip("/"):
            return mine.rstrip("/")
        return None

    def _back(self, index: int, key: str) -> str:
        """A key of replica `index` as replica 0 names it."""
        root, mine = self.replicas[0].root, self.replicas[index].root
        if index == 0:
            return key
        if key == mine:
            return root
        if key.startswith(_folder(mine)):
            return _folder(root) + key[len(_folder(mine)) :]
        return key

    # -- which replica ----------------------------------------------------

    def order(self, first: int | None = None) -> list[int]:
        """Replicas in the order to try: `first` (default the preferred) and
        the next ones round the ring; those down now go last."""
        n = len(self.replicas)
        start = self.preferred if first is None else first
        ring = [(start + i) % n for i in range(n)]
        now = self._clock()
        with self._lock:
            up = [i for i in ring if self._down_until[i] <= now]
        return up + [i for i in ring if i not in up]

    def _mark_down(self, index: int, exc: BaseException) -> None:
        with self._lock:
            self._down_until[index] = self._clock() + self.cooldown
            self.failovers += 1
        log.warning(
            "replica %s failed (%s): failing over for %.0f s",
            self.replicas[index].name,
            exc,
            self.cooldown,
        )

    def _record(self, index: int, info: ObjectInfo) -> ObjectInfo:
        """`info` from replica `index` as this store gives it out: the key of
        replica 0, the etag tagged with the replica (two accounts may use the
        same etag string for different bytes: a tagged one never matches the
        wrong replica, and a process given it by another reads the same one)."""
        shown = replace(info, key=self._back(index, info.key), etag=f"r{index}:{info.etag}")
        if not shown.is_dir:
            with self._lock:
                self._seen[(shown.key, shown.etag)] = shown
        return shown

    def _untag(self, etag: str) -> tuple[int, str] | None:
        head, sep, inner = etag.partition(":")
        if sep and head[:1] == "r" and head[1:].isdigit() and int(head[1:]) < len(self.replicas):
            return int(head[1:]), inner
        return None

    def _each(self, key: str, fn: Callable[[int, str], T]) -> T:
        """`fn(index, replica key)` on each replica in order until one answers."""
        last: BaseException | None = None
        for index in self.order():
            mine = self._key(index, key)
            if mine is None:
                continue  # outside the data: replica 0 (always first or tried) serves it
            try:
                return fn(index, mine)
            except StorageError as exc:
                if not fails_over(exc):
                    raise
                self._mark_down(index, exc)
                last = exc
        assert last is not None
        raise last

    # -- the protocol -----------------------------------------------------

    @property
    def supports_ranges(self) -> bool:
        return all(r.store.supports_ranges for r in self.replicas)

    def stat(self, key: str) -> ObjectInfo:
        return self._each(key, lambda i, k: self._record(i, self.replicas[i].store.stat(k)))

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        last: str | None = None  # the last name given out: a resumed listing starts after it
        error: BaseException | None = None
        for index in self.order():
            mine = self._key(index, prefix)
            if mine is None:
                continue
            try:
                for page in self.replicas[index].store.list_pages(mine, delimiter=delimiter):
                    objects = [self._record(index, o) for o in page.objects]
                    prefixes = [self._back(index, p) for p in page.prefixes]
                    if last is not None:
                        objects = [o for o in objects if o.key > last]
                        prefixes = [p for p in prefixes if p > last]
                    names = [o.key for o in objects] + prefixes
                    if names:
                        last = max(names)
                    yield ListPage(objects=objects, prefixes=prefixes)
                return
            except StorageError as exc:
                if not fails_over(exc):
                    raise
                self._mark_down(index, exc)
                error = exc
        assert error is not None
        raise error

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        return self._pinned(key, etag, lambda store, k, e: store.read(k, offset, length, etag=e))

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        return self._pinned(
            key, etag, lambda store, k, e: store.read_into(k, offset, buffer, etag=e)
        )

    def stream_into(self, key: str, fd: int, *, etag: str | None = None) -> int:
        return self._pinned(key, etag, lambda store, k, e: store.stream_into(k, fd, etag=e))

    def close(self) -> None:
        for r in self.replicas:
            r.store.close()

    # -- pinned reads and the version check ---------------------------------

    def _pinned(
        self,
        key: str,
        etag: str | None,
        fn: Callable[[ReadableStore, str, str | None], T],
    ) -> T:
        """`fn(store, key, etag)` on the replica holding version `etag` of
        `key`, or on another one that provably holds the same bytes."""
        tagged = self._untag(etag) if etag is not None else None
        if tagged is None:
            # No version, or one no ReplicaStore gave out: pinned as given, so a
            # replica with other bytes answers VersionChanged, never mixed bytes.
            return self._each(key, lambda i, k: fn(self.replicas[i].store, k, etag))
        origin, inner = tagged
        last: BaseException | None = None
        for index in self.order(origin):
            mine = self._key(index, key)
            if mine is None:
                continue
            try:
                if index == origin:
                    return fn(self.replicas[index].store, mine, inner)
                assert etag is not None
                same = self._same_version(index, mine, key, etag)
                return fn(self.replicas[index].store, mine, same)
            except StorageError as exc:
                if not fails_over(exc):
                    raise
                self._mark_down(index, exc)
                last = exc
        assert last is not None
        raise last

    def _same_version(self, index: int, mine: str, key: str, etag: str) -> str:
        """Replica `index`'s etag of `key` (`mine` there) after checking that
        it holds the same content as version `etag`; ReplicaMismatch if it
        does not or cannot be shown to."""
        with self._lock:
            known = self._verified.get((key, etag, index))
            seen = self._seen.get((key, etag))
        if known is not None:
            return known
        name = self.replicas[index].name
        if seen is None:
            raise ReplicaMismatch(
                f"{key!r}: cannot fail over to replica {name}: the version being read was "
                "listed by another process and its size and Content-MD5 are unknown here"
            )
        other = self.replicas[index].store.stat(mine)
        if other.size != seen.size:
            raise ReplicaMismatch(
                f"{key!r}: replica {name} holds {other.size} bytes, the version being "
                f"read has {seen.size}: the replicas differ; refusing a mixed read"
            )
        if seen.content_md5 is None or other.content_md5 is None:
            raise ReplicaMismatch(
                f"{key!r}: cannot fail over to replica {name}: Content-MD5 is missing there "
                "or on the replica being read, so the same content cannot be checked "
                "(upload the replicas with Content-MD5)"
            )
        if other.content_md5 != seen.content_md5:
            raise ReplicaMismatch(
                f"{key!r}: replica {name} has a different Content-MD5 than the version "
                "being read: the replicas differ; refusing a mixed read"
            )
        self._record(index, other)
        with self._lock:
            self._verified[(key, etag, index)] = other.etag
        log.info("%r: failed over to replica %s (same size and Content-MD5)", key, name)
        return other.etag


def _folder(root: str) -> str:
    """The prefix of the keys inside folder `root` ('' for the container root)."""
    return root.rstrip("/") + "/" if root.strip("/") else ""
