"""The store protocols: the small surfaces every backend implements.

`ReadableStore`: list lazily page by page, stat, read a bounded byte range of
one pinned version (as new bytes, or into the caller's buffer), stream a
whole object into a file; what a store cannot do is a declared capability
(`supports_ranges`, `local_path`, `recipe`, `retry_stats`), never a getattr
probe. `WritableStore`:
stage blocks and commit them, put a small object, delete, copy.
`ObjectStore` is both, what `open_store` returns; a read-only store
(`ReadOnlyStore`: public https, an evaluated file list) refuses every write
in one place, with EROFS. Keys are '/'-separated names inside the store (a
blob name in a container, a path under the local root, a URL path on an
HTTP host).

Implementations subclass the protocol they implement (mypy then checks that
nothing is missing, and they inherit the shared defaults); they are
thread-safe: one store is shared by every worker thread. Errors are
`datamount.errors` classes (ObjectNotFound, VersionChanged, ...), already
through the retry policy where the store has one.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from datamount.errors import BadRequest, ReadOnlyError, StorageError
from datamount.storage.retry import RetryStats


@dataclass(frozen=True)
class ObjectInfo:
    """One object (or, with `is_dir`, a directory where the store has them).

    `etag` identifies the version: the same bytes keep the same etag, and a
    read pinned to it fails with VersionChanged once the object changes.
    `last_modified` is a POSIX timestamp.
    """

    key: str
    size: int
    etag: str
    last_modified: float | None
    content_md5: bytes | None = None
    is_dir: bool = False


@dataclass(frozen=True)
class ListPage:
    """One service page: objects, and with a delimiter the virtual directories
    (each a key prefix ending with the delimiter)."""

    objects: list[ObjectInfo] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)


# The default stream_into's range: few requests, a small buffer (it runs only
# where nothing better is known; the downloader's own ranges are 8 MiB).
STREAM_RANGE = 4 << 20


@runtime_checkable
class ReadableStore(Protocol):
    """What every store does: list, stat, read. Declared capabilities have
    defaults here that a store overrides where it differs."""

    @property
    def supports_ranges(self) -> bool:
        """Byte ranges are served by one bounded request each. False (a server
        that ignores Range): a reader that wants the whole object asks for
        `stream_into`, one request, instead of one per range."""
        return True

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        """Objects whose key starts with `prefix`, one service page at a time,
        in key order within a page. Lazy: a page is requested only when the
        previous one was consumed, so the first entries arrive before the
        listing is complete. Yields at least one (maybe empty) page.

        With `delimiter` ('/'), keys that contain it after the prefix are
        folded into `prefixes` (virtual directories, one level)."""
        ...

    def stat(self, key: str) -> ObjectInfo:
        """The object's size and version. ObjectNotFound if it does not exist."""
        ...

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        """Bytes [offset, offset + length) in one bounded request.

        Fewer bytes near the end, b'' at or after it. With `etag`, the read is
        pinned to that version: VersionChanged (ESTALE) if it changed.
        """
        ...

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        """Fill `buffer` with bytes [offset, offset + len(buffer)) in one
        bounded request; the number of bytes written.

        Fewer only at the end of the object (0 at or after it). `etag` pins
        the version as in `read`. The buffer is the caller's (a downloader
        reuses one per thread), so memory stays bounded by threads × range.
        After an error its content is undefined. Stores count it as a "read".
        """
        ...

    def read_into_views(
        self, key: str, offset: int, buffers: Sequence[memoryview], *, etag: str | None = None
    ) -> int:
        """`read_into` of consecutive buffers (bytes [offset, offset + their
        total)) in one bounded request; the number of bytes written, filling
        the buffers in order. A block reader gives each block its own buffer
        so no block is copied out of a shared one. This default reads into one
        temporary buffer and copies; AzureBlobStore fills each buffer straight
        from the socket.
        """
        if len(buffers) == 1:
            return self.read_into(key, offset, buffers[0], etag=etag)
        whole = memoryview(bytearray(sum(map(len, buffers))))
        n = self.read_into(key, offset, whole, etag=etag)
        pos = 0
        for buffer in buffers:
            take = max(0, min(len(buffer), n - pos))
            buffer[:take] = whole[pos : pos + take]
            pos += take
        return n

    def stream_into(self, key: str, fd: int, *, etag: str | None = None) -> int:
        """The whole object written into `fd` from offset 0; its size.

        Pinned to `etag` (or, without one, to the version a first `stat`
        sees): never two versions mixed. This default reads it range by range
        through `read_into` with one buffer of STREAM_RANGE; a store without
        ranges overrides it with one request.
        """
        if etag is None:
            etag = self.stat(key).etag
        buffer = memoryview(bytearray(STREAM_RANGE))
        pos = 0
        while True:
            n = self.read_into(key, pos, buffer, etag=etag)
            view = buffer[:n]
            while view:
                written = os.pwrite(fd, view, pos)
                view, pos = view[written:], pos + written
            if n < len(buffer):
                return pos

    def read_span(
        self,
        key: str,
        offset: int,
        length: int,
        buffer: memoryview,
        sink: Callable[[memoryview, int], None],
        *,
        etag: str | None = None,
    ) -> int:
        """Bytes [offset, offset + length) through `buffer`, piece by piece:
        each filled piece (`buffer`'s size, the last one shorter) goes to
        `sink(piece, position)` before the next is read; the byte count (short
        only at the end of the object). Memory: the caller's buffer. `etag`
        pins the version as in `read`; an exception from `sink` is raised
        unchanged (never retried). This default reads each piece with
        `read_into` (one request each); AzureBlobStore asks for the whole
        span in one request (fewer requests for the same buffer).
        """
        pos, end = offset, offset + length
        while pos < end:
            want = min(len(buffer), end - pos)
            n = self.read_into(key, pos, buffer[:want], etag=etag)
            if n:
                sink(buffer[:n], pos)
            pos += n
            if n < want:
                break
        return pos - offset

    def local_path(self, key: str) -> str | None:
        """The local file that holds `key`, where the store's objects are
        local files (LocalStore); None everywhere else."""
        return None

    def recipe(self) -> StoreRecipe | None:
        """How another process opens the same store (the worker processes of
        transfer/processlane.py and read/fetchlane.py): a picklable value whose
        `open(pool_size)` gives the store there. None where no other process
        can (a store in this process's memory; identity credentials, whose
        tokens this process's azure-identity object renews)."""
        return None

    def retry_stats(self) -> RetryStats | None:
        """The counters of this store's retry policy; None for a store that
        retries nothing."""
        return None

    def close(self) -> None:
        """Release connections. The store must not be used afterwards."""
        ...


class StoreRecipe(Protocol):
    """What `ReadableStore.recipe()` returns: the store, opened again in
    another process."""

    def open(self, pool_size: int | None = None) -> ReadableStore: ...


@runtime_checkable
class WritableStore(Protocol):
    """What a store that can be written does."""

    def stage_block(self, key: str, block_id: str, data: bytes) -> None:
        """Upload one uncommitted block. All ids of one object have the same
        length (an Azure rule), e.g. f"{index:08d}"."""
        ...

    def commit_blocks(
        self,
        key: str,
        block_ids: list[str],
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        """Make the object the concatenation of the staged blocks, atomically."""
        ...

    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        """Write a small object in one request (replacing any existing one)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object. ObjectNotFound if it does not exist."""
        ...

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Copy an object inside the store; returns the new object's info."""
        ...


@runtime_checkable
class ObjectStore(ReadableStore, WritableStore, Protocol):
    """A store as `open_store` gives it: readable, and writable or refusing
    every write (ReadOnlyStore)."""


class ReadOnlyStore(ObjectStore):
    """The write side of a store that has none: every write raises
    `refusal(op, key)` (ReadOnlyError, EROFS) before any request."""

    def refusal(self, op: str, key: str) -> StorageError:
        return ReadOnlyError(f"{op} {key!r} failed: {self!r} is read-only")

    def stage_block(self, key: str, block_id: str, data: bytes) -> None:
        raise self.refusal("stage_block", key)

    def commit_blocks(
        self,
        key: str,
        block_ids: list[str],
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        raise self.refusal("commit_blocks", key)

    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        raise self.refusal("put", key)

    def delete(self, key: str) -> None:
        raise self.refusal("delete", key)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        raise self.refusal("copy", dst_key)


def paged_listing(
    infos: list[ObjectInfo], prefix: str, delimiter: str | None, page_size: int
) -> Iterator[tuple[int, ListPage]]:
    """The listing of `infos` (sorted by key) under `prefix` as service pages
    would give it: keys with `delimiter` after the prefix folded into one
    prefix each, key order, `page_size` entries (objects and prefixes alike)
    a page, at least one page. Yields (page number, page) lazily, for stores
    that keep their objects in memory and count requests."""
    start = bisect.bisect_left(infos, prefix, key=lambda info: info.key)
    entries: list[tuple[str, ObjectInfo | None]] = []
    for info in itertools.islice(infos, start, None):
        if not info.key.startswith(prefix):
            break
        rest = info.key[len(prefix) :]
        if delimiter and delimiter in rest:
            folded = prefix + rest[: rest.index(delimiter) + len(delimiter)]
            if not entries or entries[-1][0] != folded:
                entries.append((folded, None))
        else:
            entries.append((info.key, info))
    entries.sort(key=lambda e: e[0])
    for number, first in enumerate(range(0, max(len(entries), 1), page_size)):
        chunk = entries[first : first + page_size]
        yield (
            number,
            ListPage(
                objects=[info for _, info in chunk if info is not None],
                prefixes=[name for name, info in chunk if info is None],
            ),
        )


def check_range(offset: int, length: int) -> None:
    """Reject ranges no store can serve (a negative offset or length)."""
    if offset < 0 or length < 0:
        raise BadRequest(f"invalid range: offset={offset} length={length}")
