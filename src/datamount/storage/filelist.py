"""FileListStore: a read-only ObjectStore presenting a fixed list of files that
live in other stores, under names of its own — what `eval_mount` serves.

An evaluated MLTable is a list of files on any number of accounts and
containers, each with its own credential; the mount shows them as one tree
(`<account>/<container>/<path>`). This store answers listings and stats from
the list (no request: the evaluation already listed everything), and routes
every read to the file's own store under its real key, pinned to the etag seen
at evaluation, so the ordinary read stack (fetcher, caches, prefetch) and the
ordinary namespace work unchanged over it. Small generated files (the
MLTable of the layout) are served from memory.

Threads: immutable after construction; safe from any thread (the underlying
stores are thread-safe).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from datamount.errors import ObjectNotFound, ReadOnlyError, StorageError
from datamount.storage.base import (
    ListPage,
    ObjectInfo,
    ReadableStore,
    ReadOnlyStore,
    check_range,
    paged_listing,
)

PAGE_SIZE = 5000


@dataclass(frozen=True)
class ListedFile:
    """One file of the list: where it shows (`key`) and where it lives."""

    key: str
    store: ReadableStore
    source_key: str
    size: int
    etag: str
    last_modified: float | None = None


class FileListStore(ReadOnlyStore):
    def __init__(
        self,
        files: Iterable[ListedFile],
        *,
        inline: Mapping[str, bytes] | None = None,
        page_size: int = PAGE_SIZE,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        now = time.time()
        self._files: dict[str, ListedFile] = {}
        self._inline: dict[str, bytes] = {}
        infos: dict[str, ObjectInfo] = {}
        for f in files:
            self._files[f.key] = f
            infos[f.key] = ObjectInfo(f.key, f.size, f.etag, f.last_modified)
        for key, data in (inline or {}).items():
            self._files.pop(key, None)
            self._inline[key] = bytes(data)
            etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'
            infos[key] = ObjectInfo(key, len(data), etag, now)
        self._infos = infos
        self._sorted = sorted(infos.values(), key=lambda info: info.key)
        self.page_size = page_size
        self._on_close = on_close

    def __len__(self) -> int:
        return len(self._sorted)

    # -- read side ---------------------------------------------------------

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        for _number, page in paged_listing(self._sorted, prefix, delimiter, self.page_size):
            yield page

    def stat(self, key: str) -> ObjectInfo:
        info = self._infos.get(key)
        if info is None:
            raise ObjectNotFound(f"stat {key!r} failed: not in the file list", status=404)
        return info

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        check_range(offset, length)
        data = self._inline.get(key)
        if data is not None:
            return data[offset : offset + length]
        f = self._file(key)
        return f.store.read(f.source_key, offset, length, etag=etag or f.etag)

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        data = self._inline.get(key)
        if data is not None:
            chunk = data[offset : offset + len(buffer)]
            buffer[: len(chunk)] = chunk
            return len(chunk)
        f = self._file(key)
        return f.store.read_into(f.source_key, offset, buffer, etag=etag or f.etag)

    def _file(self, key: str) -> ListedFile:
        f = self._files.get(key)
        if f is None:
            raise ObjectNotFound(f"read {key!r} failed: not in the file list", status=404)
        return f

    # -- write side: none (ReadOnlyStore refuses every write) ----------------

    def refusal(self, op: str, key: str) -> StorageError:
        return ReadOnlyError(f"{op} {key!r} failed: a file list is read-only")

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None
