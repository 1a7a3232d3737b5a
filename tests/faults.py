"""FaultyStore: wrap any ObjectStore and fail requests on command.

A `FaultPlan` says which operation fails, how many times and with what error
(a transient 503 with Retry-After, a connection reset, a permanent 403, ...).
`FaultyStore` consults the plan before each request and counts attempts per
operation; given a `RetryPolicy` it runs every request through it, exactly as
the real stores do, so downloader and mount tests see real retry behaviour
over a MemoryStore (as mountpoint-s3's failure_client.rs does).

Threads: the plan and counters are locked; safe from any thread.
"""

from __future__ import annotations

import errno
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from datamount.errors import AccessDenied, ObjectNotFound, StorageError
from datamount.storage.base import ListPage, ObjectInfo, ObjectStore
from datamount.storage.retry import RetryPolicy, RetryStats

T = TypeVar("T")
ErrorFactory = Callable[[], BaseException]
ANY = "*"
OPS = ("list", "stat", "read", "stage_block", "commit_blocks", "put", "delete", "copy")


def throttled(retry_after: float | None = None, *, status: int = 503) -> ErrorFactory:
    """A 503 ServerBusy / 429 TooManyRequests, as storage.errormap maps it."""
    return lambda: StorageError(
        f"injected: HTTP {status} ServerBusy",
        transient=True,
        retry_after=retry_after,
        status=status,
    )


def server_error(status: int = 500) -> ErrorFactory:
    return lambda: StorageError(
        f"injected: HTTP {status} InternalError", transient=True, status=status
    )


def connection_reset(*, mapped: bool = False) -> ErrorFactory:
    """A reset connection: raw (as a socket raises it) or as storage.errormap maps it."""
    if mapped:
        return lambda: StorageError("injected: connection reset", transient=True, err=errno.EIO)
    return lambda: ConnectionResetError(errno.ECONNRESET, "injected: connection reset")


def forbidden() -> ErrorFactory:
    return lambda: AccessDenied("injected: HTTP 403 AuthorizationFailure", status=403)


def not_found() -> ErrorFactory:
    return lambda: ObjectNotFound("injected: HTTP 404 BlobNotFound", status=404)


@dataclass
class _Rule:
    op: str
    remaining: int | None  # None: forever
    error: ErrorFactory
    key: str | None


class FaultPlan:
    """Which requests fail. Rules are consumed in the order they were added."""

    def __init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()

    def fail(
        self,
        op: str = ANY,
        *,
        times: int | None = 1,
        error: ErrorFactory | None = None,
        key: str | None = None,
    ) -> FaultPlan:
        """Fail the next `times` requests of `op` ('*' = any; None = forever),
        optionally only for `key`, with `error()` (default: a transient 500)."""
        if op != ANY and op not in OPS:
            raise ValueError(f"unknown operation {op!r}; one of {OPS}")
        with self._lock:
            self._rules.append(_Rule(op, times, error or server_error(), key))
        return self

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(self, op: str, key: str) -> BaseException | None:
        """The error for this request, consuming one use of the matching rule."""
        with self._lock:
            for rule in self._rules:
                if rule.op not in (ANY, op) or (rule.key is not None and rule.key != key):
                    continue
                if rule.remaining is not None:
                    if rule.remaining <= 0:
                        continue
                    rule.remaining -= 1
                return rule.error()
        return None


_END = object()


class FaultyStore(ObjectStore):
    """An ObjectStore that fails where `plan` says, then delegates to `inner`.

    `attempts[op]` counts every request (failed or not), `failures[op]` the
    injected failures.
    """

    def __init__(
        self, inner: ObjectStore, plan: FaultPlan | None = None, *, retry: RetryPolicy | None = None
    ) -> None:
        self.inner = inner
        self.plan = plan or FaultPlan()
        self.retry = retry
        self.attempts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _attempt(self, op: str, key: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            self.attempts[op] += 1
        error = self.plan.take(op, key)
        if error is not None:
            with self._lock:
                self.failures[op] += 1
            raise error
        return fn(*args, **kwargs)

    def _call(self, op: str, key: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.retry is None:
            return self._attempt(op, key, fn, *args, **kwargs)
        return self.retry.call(
            self._attempt, op, key, fn, *args, description=f"{op} {key!r}", **kwargs
        )

    def retry_stats(self) -> RetryStats | None:
        return self.retry.stats if self.retry is not None else None

    @property
    def supports_ranges(self) -> bool:
        # The inner store's (never its local_path: every request goes through the plan).
        return self.inner.supports_ranges

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        pages = self.inner.list_pages(prefix, delimiter=delimiter)
        while True:
            page = self._call("list", prefix, next, pages, _END)
            if page is _END:
                return
            assert isinstance(page, ListPage)
            yield page

    def stat(self, key: str) -> ObjectInfo:
        return self._call("stat", key, self.inner.stat, key)

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        return self._call("read", key, self.inner.read, key, offset, length, etag=etag)

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        # The same operation as `read` for plans and counters: fail("read")
        # fails both, attempts["read"] counts both.
        return self._call("read", key, self.inner.read_into, key, offset, buffer, etag=etag)

    def stream_into(self, key: str, fd: int, *, etag: str | None = None) -> int:
        # One "read" for plans and counters, like read_into.
        return self._call("read", key, self.inner.stream_into, key, fd, etag=etag)

    def stage_block(self, key: str, block_id: str, data: bytes) -> None:
        self._call("stage_block", key, self.inner.stage_block, key, block_id, data)

    def commit_blocks(
        self,
        key: str,
        block_ids: list[str],
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        return self._call(
            "commit_blocks",
            key,
            self.inner.commit_blocks,
            key,
            block_ids,
            content_md5=content_md5,
            metadata=metadata,
        )

    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        return self._call(
            "put", key, self.inner.put, key, data, content_md5=content_md5, metadata=metadata
        )

    def delete(self, key: str) -> None:
        self._call("delete", key, self.inner.delete, key)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        return self._call("copy", src_key, self.inner.copy, src_key, dst_key)

    def close(self) -> None:
        self.inner.close()
