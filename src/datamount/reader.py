"""pread-style reads of pinned object versions: the interface the filesystem
ops use, and its simplest implementation.

`Reader.open(obj)` returns a handle pinned to `obj` (key + etag + size);
`handle.read(offset, size)` returns bytes (short only at end of file) and
raises OSError (ESTALE when the version changed, EIO/EACCES...) on failure.
Handles are independent and safe to use from several threads at once: reads
are positional, there is no shared file position.

Imports `blocks`, `storage.base`, `errors`.
"""

from __future__ import annotations

from typing import Protocol

from datamount.blocks import ObjectId
from datamount.storage.base import ObjectStore


class ReadHandle(Protocol):
    def read(self, offset: int, size: int) -> bytes: ...

    def close(self) -> None: ...


class Reader(Protocol):
    def open(self, obj: ObjectId) -> ReadHandle: ...

    def close(self) -> None: ...


class DirectHandle:
    def __init__(self, store: ObjectStore, obj: ObjectId) -> None:
        self.store = store
        self.obj = obj

    def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.obj.size - offset))
        if size == 0:
            return b""
        return self.store.read(self.obj.key, offset, size, etag=self.obj.etag)

    def close(self) -> None:
        return None


class DirectReader:
    """Every read is one ranged request: no cache, no prefetch (tests, baselines)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def open(self, obj: ObjectId) -> ReadHandle:
        return DirectHandle(self.store, obj)

    def close(self) -> None:
        return None
