"""HttpStore: a public http(s) file as a read-only ObjectStore.

The store is rooted at scheme://host; a key is the URL path (and query)
without its leading '/', as `StorageLocation.key` gives it. stat is a HEAD
(size from Content-Length, version from ETag or else Last-Modified); read
and read_into (the body read straight into the caller's buffer; why:
docs/design/storage.md, "Per-request Python costs") are a bounded ranged GET,
pinned with If-Match when the server gave a strong ETag and checked against
the answer's version otherwise. A server that ignores
Range (200 instead of 206) still gives the right slice: the body is streamed
up to the end of the range and the connection dropped, and the declared
`supports_ranges` turns False (so does a HEAD without 'Accept-Ranges: bytes'):
a downloader then asks for `stream_into`, one GET of the whole file. Listing
yields the one file. Writes raise EROFS (storage.base.ReadOnlyStore).

HTTPS trusts the system store plus REQUESTS_CA_BUNDLE (storage.tls).

Threads: one pooled requests.Session shared by all threads (urllib3 pools are
thread-safe); every request goes through the RetryPolicy. A request that
receives no byte for `read_timeout` seconds fails as a transient error.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NoReturn

import requests

from datamount.errors import ObjectNotFound, ReadOnlyError, StorageError, VersionChanged
from datamount.storage import sessions
from datamount.storage.base import ListPage, ObjectInfo, ReadOnlyStore, check_range
from datamount.storage.errormap import error_for_status, translate
from datamount.storage.retry import DEFAULT_MIN_SECONDS, RetryPolicy, RetryStats

CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 30.0  # seconds without a byte before a request is abandoned
STREAM_CHUNK = 256 << 10
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
LM_PREFIX = "lm:"  # an etag made from Last-Modified (the server gave no ETag)
# Ranges address the bytes of the file: a gzip-encoded answer would shift them.
IDENTITY = {"Accept-Encoding": "identity"}


def _version(headers: Mapping[str, str]) -> str:
    etag = headers.get("ETag")
    if etag:
        return etag
    modified = headers.get("Last-Modified")
    return f"{LM_PREFIX}{modified}" if modified else ""


def _last_modified(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Last-Modified")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


class HttpStore(ReadOnlyStore):
    supports_ranges: bool = True  # until a server shows it ignores Range

    def __init__(
        self,
        root: str,
        *,
        pool_size: int = 16,
        retry: RetryPolicy | None = None,
        session: requests.Session | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        ca_bundle: Path | None = None,
    ) -> None:
        self.root = root.rstrip("/")
        self.timeout = (CONNECT_TIMEOUT, read_timeout)  # requests: (connect, between bytes)
        self.retry = retry or RetryPolicy(min_seconds=DEFAULT_MIN_SECONDS)
        self.supports_ranges = True
        self._own_session = session is None
        self.session = session or requests.Session()
        if self._own_session:
            # Our RetryPolicy is the only retry layer: urllib3 retries nothing.
            # https trusts what the raw path trusts (storage.tls).
            adapter = sessions.adapter(
                ca_bundle, pool_connections=4, pool_maxsize=pool_size, max_retries=0
            )
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)

    def __repr__(self) -> str:
        return f"HttpStore({self.root!r})"

    def _url(self, key: str) -> str:
        return f"{self.root}/{key.lstrip('/')}"

    @staticmethod
    def _name(key: str) -> str:
        # Messages name the path only: a query string may hold a token.
        return key.split("?", 1)[0]

    def _fail(self, op: str, key: str, r: requests.Response) -> NoReturn:
        raise error_for_status(
            r.status_code, op=op, key=self._name(key), store=self.root, headers=r.headers
        )

    # -- reads -------------------------------------------------------------

    def retry_stats(self) -> RetryStats:
        return self.retry.stats

    def stat(self, key: str) -> ObjectInfo:
        return self.retry.call(self._stat, key, description=f"stat {self._name(key)!r}")

    def _stat(self, key: str) -> ObjectInfo:
        with translate("stat", self._name(key), store=self.root):
            r = self.session.head(
                self._url(key), headers=IDENTITY, allow_redirects=True, timeout=self.timeout
            )
            r.close()
            length = r.headers.get("Content-Length")
            if r.status_code in (405, 501) or (r.ok and length is None):
                return self._stat_by_get(key)
            if not r.ok:
                self._fail("stat", key, r)
            # No 'Accept-Ranges: bytes': the downloader streams the file in one GET.
            self.supports_ranges = r.headers.get("Accept-Ranges", "").lower() == "bytes"
            return ObjectInfo(key, int(length or 0), _version(r.headers), _last_modified(r.headers))

    def _stat_by_get(self, key: str) -> ObjectInfo:
        """For servers without HEAD or Content-Length: GET the first byte."""
        with self.session.get(
            self._url(key),
            headers={"Range": "bytes=0-0", **IDENTITY},
            stream=True,
            timeout=self.timeout,
        ) as r:
            if r.status_code == 416:  # an empty file
                return ObjectInfo(key, 0, _version(r.headers), _last_modified(r.headers))
            if not r.ok:
                self._fail("stat", key, r)
            m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if r.status_code == 206 and m and m.group(3) != "*":
                size = int(m.group(3))
            elif r.headers.get("Content-Length") is not None and r.status_code == 200:
                size = int(r.headers["Content-Length"])
            else:
                size = sum(len(c) for c in r.iter_content(STREAM_CHUNK))
            return ObjectInfo(key, size, _version(r.headers), _last_modified(r.headers))

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        check_range(offset, length)
        if length == 0:
            return b""
        return self.retry.call(
            self._read, key, offset, length, etag, description=f"read {self._name(key)!r}"
        )

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        check_range(offset, len(buffer))
        if not len(buffer):
            return 0
        return self.retry.call(
            self._read_into, key, offset, buffer, etag, description=f"read {self._name(key)!r}"
        )

    def stream_into(self, key: str, fd: int, *, etag: str | None = None) -> int:
        """The whole file in one GET, written into `fd` from offset 0 as it
        arrives (servers without ranges). Retried as a whole; returns its size."""
        return self.retry.call(self._stream, key, fd, etag, description=f"get {self._name(key)!r}")

    def _stream(self, key: str, fd: int, etag: str | None) -> int:
        with (
            translate("read", self._name(key), store=self.root),
            self.session.get(
                self._url(key), headers=IDENTITY, stream=True, timeout=self.timeout
            ) as r,
        ):
            if not r.ok:
                self._fail("read", key, r)
            if etag is not None and _version(r.headers) not in ("", etag):
                raise VersionChanged(
                    f"read {self._name(key)!r} failed: the file changed", status=412
                )
            pos = 0
            for chunk in r.iter_content(STREAM_CHUNK):
                view = memoryview(chunk)
                while view:
                    n = os.pwrite(fd, view, pos)
                    view, pos = view[n:], pos + n
            return pos

    def _read(self, key: str, offset: int, length: int, etag: str | None) -> bytes:
        with self._ranged(key, offset, length, etag) as r:
            if r is None:
                return b""
            if r.status_code == 206:
                return r.content
            return _slice(r.iter_content(STREAM_CHUNK), offset, length)

    def _read_into(self, key: str, offset: int, buffer: memoryview, etag: str | None) -> int:
        """`read` straight into `buffer`: a ranged body is read into it in
        large reads (`r.content` joins 10 KiB chunks, then it was copied)."""
        with self._ranged(key, offset, len(buffer), etag) as r:
            if r is None:
                return 0
            if r.status_code != 206:
                data = _slice(r.iter_content(STREAM_CHUNK), offset, len(buffer))
                buffer[: len(data)] = data
                return len(data)
            got = 0
            while got < len(buffer):
                n = r.raw.readinto(buffer[got:])
                if not n:
                    break
                got += n
            if r.raw.read(1):  # drained to its end: the connection goes back to the pool
                raise StorageError(
                    f"read {self._name(key)!r} failed: longer answer than the range asked",
                    transient=True,
                    err=errno.EIO,
                )
            return got

    @contextlib.contextmanager
    def _ranged(
        self, key: str, offset: int, length: int, etag: str | None
    ) -> Iterator[requests.Response | None]:
        """The open answer to a ranged GET of [offset, offset + length),
        checked (status, version, Content-Range); None past the end (416). A
        200 (the server ignored Range) turns `supports_ranges` False; its body
        is the whole file (closing it drops the connection, not drains it)."""
        headers = {"Range": f"bytes={offset}-{offset + length - 1}", **IDENTITY}
        if etag and not etag.startswith((LM_PREFIX, "W/")):
            headers["If-Match"] = etag  # strong comparison: weak etags never match
        with (
            translate("read", self._name(key), store=self.root),
            self.session.get(
                self._url(key), headers=headers, stream=True, timeout=self.timeout
            ) as r,
        ):
            if r.status_code == 416:
                r.content  # noqa: B018  (its small body read: the connection is kept)
                yield None
                return
            if not r.ok:
                self._fail("read", key, r)
            if etag is not None and _version(r.headers) not in ("", etag):
                raise VersionChanged(
                    f"read {self._name(key)!r} failed: the file changed", status=412
                )
            if r.status_code == 206:
                m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
                if m is None or int(m.group(1)) != offset:
                    raise StorageError(
                        f"read {self._name(key)!r} failed: bad Content-Range",
                        transient=True,
                        err=errno.EIO,
                    )
            else:
                self.supports_ranges = False
            yield r

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        try:
            yield ListPage(objects=[self.stat(prefix)])
        except ObjectNotFound:
            yield ListPage()

    # -- writes: a public URL is read-only (ReadOnlyStore refuses them) ------

    def refusal(self, op: str, key: str) -> StorageError:
        return ReadOnlyError(f"{op} {self._name(key)!r} failed: an http(s) location is read-only")

    def close(self) -> None:
        if self._own_session:
            self.session.close()


def _slice(chunks: Iterator[bytes], offset: int, length: int) -> bytes:
    out = bytearray()
    pos = 0
    end = offset + length
    for chunk in chunks:
        lo, hi = max(offset - pos, 0), min(end - pos, len(chunk))
        if lo < hi:
            out += chunk[lo:hi]
        pos += len(chunk)
        if pos >= end:
            break
    return bytes(out)
