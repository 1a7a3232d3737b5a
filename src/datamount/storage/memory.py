"""MemoryStore: a dict-backed ObjectStore for tests (and `--backend memory`).

It follows Azure's rules where they matter to callers (key-ordered pages that
count objects and prefixes alike, quoted etags that change on every write,
equal-length block ids, staged blocks dropped at commit) and counts every
request per operation in `requests`, so tests assert how many reads a layer
made (a fake that counts and fails).

Threads: every method takes one lock; safe from any thread.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from datamount.errors import BadRequest, ObjectNotFound, VersionChanged
from datamount.storage.base import ListPage, ObjectInfo, ObjectStore, check_range, paged_listing

MAX_BLOCK_ID_BYTES = 64  # Azure's limit for a block id before base64


@dataclass
class _Object:
    data: bytes
    info: ObjectInfo
    metadata: dict[str, str]


class MemoryStore(ObjectStore):
    """An in-memory ObjectStore. `requests[op]` counts calls per operation."""

    def __init__(self, objects: dict[str, bytes] | None = None, *, page_size: int = 1000) -> None:
        self.page_size = page_size
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}
        self._staged: dict[str, dict[str, bytes]] = {}
        self._versions = itertools.count(1)
        self.closed = False
        for key, data in (objects or {}).items():
            self.put(key, data)
        self.requests.clear()

    # -- helpers -----------------------------------------------------------

    def _count(self, op: str) -> None:
        # Called with the lock held.
        self.requests[op] += 1

    def _store(
        self, key: str, data: bytes, content_md5: bytes | None, metadata: dict[str, str] | None
    ) -> ObjectInfo:
        info = ObjectInfo(
            key=key,
            size=len(data),
            etag=f'"0x{next(self._versions):X}"',
            last_modified=time.time(),
            content_md5=content_md5,
        )
        self._objects[key] = _Object(bytes(data), info, dict(metadata or {}))
        return info

    def _get(self, key: str, op: str) -> _Object:
        obj = self._objects.get(key)
        if obj is None:
            raise ObjectNotFound(f"{op} {key!r} failed: no such object", status=404)
        return obj

    @property
    def total_requests(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    def data(self, key: str) -> bytes:
        """The stored bytes (for assertions; not counted as a request)."""
        with self._lock:
            return self._get(key, "data").data

    # -- ObjectStore -------------------------------------------------------

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        # Snapshot under the lock, page lazily outside it: a page is
        # "requested" (counted) only when the consumer asks for it.
        with self._lock:
            infos = sorted(
                (o.info for k, o in self._objects.items() if k.startswith(prefix)),
                key=lambda info: info.key,
            )
        for _number, page in paged_listing(infos, prefix, delimiter, self.page_size):
            with self._lock:
                self._count("list")
            yield page

    def stat(self, key: str) -> ObjectInfo:
        with self._lock:
            self._count("stat")
            return self._get(key, "stat").info

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        check_range(offset, length)
        with self._lock:
            self._count("read")
            obj = self._get(key, "read")
            if etag is not None and etag != obj.info.etag:
                raise VersionChanged(f"read {key!r} failed: HTTP 412 ConditionNotMet", status=412)
            return obj.data[offset : offset + length]

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        # Counted as a "read": on the wire it is the same ranged GET.
        data = self.read(key, offset, len(buffer), etag=etag)
        buffer[: len(data)] = data
        return len(data)

    def stage_block(self, key: str, block_id: str, data: bytes) -> None:
        if not block_id or len(block_id.encode()) > MAX_BLOCK_ID_BYTES:
            raise BadRequest(f"stage_block {key!r} failed: invalid block id", status=400)
        with self._lock:
            self._count("stage_block")
            staged = self._staged.setdefault(key, {})
            if staged and len(next(iter(staged))) != len(block_id):
                raise BadRequest(
                    f"stage_block {key!r} failed: block ids of one object differ in length",
                    status=400,
                )
            staged[block_id] = bytes(data)

    def commit_blocks(
        self,
        key: str,
        block_ids: list[str],
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        with self._lock:
            self._count("commit_blocks")
            staged = self._staged.get(key, {})
            missing = [b for b in block_ids if b not in staged]
            if missing:
                raise BadRequest(
                    f"commit_blocks {key!r} failed: HTTP 400 InvalidBlockList", status=400
                )
            data = b"".join(staged[b] for b in block_ids)
            self._staged.pop(key, None)
            return self._store(key, data, content_md5, metadata)

    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        with self._lock:
            self._count("put")
            # Like Azure's Put Blob: the service records the MD5 when not given.
            md5 = (
                content_md5
                if content_md5 is not None
                else hashlib.md5(data, usedforsecurity=False).digest()
            )
            return self._store(key, data, md5, metadata)

    def delete(self, key: str) -> None:
        with self._lock:
            self._count("delete")
            self._get(key, "delete")
            del self._objects[key]

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        with self._lock:
            self._count("copy")
            src = self._get(src_key, "copy")
            return self._store(dst_key, src.data, src.info.content_md5, src.metadata)

    def close(self) -> None:
        self.closed = True
