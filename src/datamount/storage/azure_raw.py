"""The lean request path of AzureBlobStore: Blob REST requests over a
keep-alive pool of http.client connections. Ranged reads land straight in
the caller's buffer (`get_pieces`: one GET read a buffer's worth at a time,
each piece handed on before the next is read); puts and staged blocks are
sent in slices; HEAD (stat) and List Blobs pages (GET on the container,
parsed by storage.azure_list) are small whole answers.

Why not the SDK, urllib3 or requests: docs/design/storage.md ("The raw
request", "Why the raw path"); http.client's `readinto` lands in the
caller's memoryview through `recv_into`.

Every range is bounded (both ends). The socket timeout is the stall timeout:
a request that receives (or sends) no byte for `timeout` seconds raises
TimeoutError. That, a reset connection and a body cut short are transient in
the error table; the caller's RetryPolicy repeats the whole request. Answers
>= 300 become `datamount.errors` classes (`storage.errormap.error_for_status`:
status, x-ms-error-code, Retry-After). Requests carry the SDK's x-ms-version
and are authorized by `storage.azure_auth`; HTTPS trusts what storage.tls
trusts; proxies are decided once per RawClient (storage.proxy).

Threads: one RawClient is shared by all threads; the pool lends each request
its own connection (LIFO under a lock) and takes it back only when the
response was read to its end.
"""

from __future__ import annotations

import functools
import http.client
import re
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from email.message import Message
from pathlib import Path
from urllib.parse import quote, urlsplit

from datamount.errors import StorageError
from datamount.storage import nativeget, tls
from datamount.storage import proxy as proxies
from datamount.storage.azure_auth import Auth, http_date
from datamount.storage.errormap import error_for_status
from datamount.storage.http_response import (
    Headers,
    Response,
    exchange,
    host_header,
    read_body_from_socket,
    request_head,
)
from datamount.storage.http_response import read_body_into as _fill

CONNECT_TIMEOUT = 10.0
ERROR_BODY_MAX = 1 << 20  # error bodies up to this are read, to keep the connection
# Bodies are sent in slices of this size: the socket timeout bounds one
# sendall() in total, so per slice it is a stall timeout, not a deadline for
# a whole 64 MiB block.
SEND_SLICE = 1 << 20
USER_AGENT = "datamount"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

# hook(method, path, request headers, status), called once per response
Hook = Callable[[str, str, dict[str, str], int], None]


def _dropped(sock: socket.socket) -> bool:
    """An idle keep-alive socket that is readable was closed by the server
    (or holds junk): never reuse it (urllib3 makes the same check)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class ConnectionPool:
    """Idle keep-alive connections to one host, most recently used first."""

    def __init__(
        self,
        endpoint: str,
        maxsize: int,
        *,
        ca_bundle: Path | None = None,
        proxy: proxies.Proxy | None = None,
    ) -> None:
        parts = urlsplit(endpoint)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.maxsize = maxsize
        self.proxy = proxy
        # Plain HTTP through a proxy: absolute-form targets, the proxy's header
        # on every request (as requests sends them).
        self.forward = proxy is not None and not self.https
        self.target_prefix = f"{parts.scheme}://{parts.netloc}" if self.forward else ""
        # The Host header http.client derives per request (an absolute-form
        # target: its netloc), for requests without a body (http_response.exchange).
        self.host_header = (
            parts.netloc
            if self.forward
            else host_header(self.host, self.port, 443 if self.https else 80)
        )
        self.forward_headers = proxy.headers() if proxy is not None and self.forward else {}
        # The process's one context (storage.tls): the system store, plus
        # REQUESTS_CA_BUNDLE (`ca_bundle`), plus certifi only without a system store.
        self._context: ssl.SSLContext | None = tls.context(ca_bundle) if self.https else None
        # Range GETs into buffers run in C (storage.nativeget) until a
        # connection cannot take it.
        self.native = not self.https or nativeget.TLS_USABLE
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def get(self, timeout: float) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
                break
            if conn.sock is not None and not _dropped(conn.sock):
                break
            conn.close()
        assert conn.sock is not None
        if conn.sock.gettimeout() != timeout:  # settimeout is an ioctl each time
            conn.sock.settimeout(timeout)
        return conn

    def _connect(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.proxy is not None:
            conn = proxies.connect(
                self.proxy, self.host, self.port, timeout=CONNECT_TIMEOUT, context=self._context
            )
            conn.response_class = Response
            return conn
        if self._context is not None:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=CONNECT_TIMEOUT, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT)
        conn.response_class = Response  # headers parsed without email.parser
        conn.connect()  # sets TCP_NODELAY
        return conn

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and conn.sock is not None and len(self._idle) < self.maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _slices(body: bytes | memoryview) -> bytes | memoryview | Iterator[memoryview]:
    if len(body) <= SEND_SLICE:
        return body
    view = memoryview(body)
    return (view[i : i + SEND_SLICE] for i in range(0, len(view), SEND_SLICE))


def _body_length(
    status: int, headers: Headers | Message, key: str, offset: int, length: int
) -> int:
    """How many body bytes a 2xx answer to a range GET carries, checked."""
    if status == 206:
        m = _CONTENT_RANGE.match(headers.get("Content-Range") or "")
        if m is None or int(m.group(1)) != offset:
            raise http.client.HTTPException("bad Content-Range")
        n = int(m.group(2)) - offset + 1
    else:  # 200: the whole object; only right when it fits from offset 0
        n = int(headers.get("Content-Length") or -1)
        if offset != 0 or not 0 <= n <= length:
            raise StorageError(f"read {key!r} failed: the server ignored the range")
    if not 0 <= n <= length:
        raise http.client.HTTPException("range longer than asked")
    return n


def _pieces(
    n: int,
    offset: int,
    buffer: memoryview,
    sink: Callable[[memoryview, int], None],
    fill: Callable[[memoryview], None],
    first: int = 0,
) -> None:
    """A body of `n` bytes from `offset` through `buffer`: each piece filled by
    `fill`, then handed to `sink(piece, position)`; the `first` bytes are
    already in `buffer`."""
    if first:
        sink(buffer[:first], offset)
    done, step = first, len(buffer)
    while done < n:
        piece = buffer[: min(step, n - done)]
        fill(piece)
        sink(piece, offset + done)
        done += len(piece)


class RawClient:
    """Raw Blob REST requests for one container (why: docs/design/storage.md,
    "Why the raw path").

    `hooks` are called as hook(method, path, headers, status) once per
    response (tests count requests with them).
    """

    def __init__(
        self,
        endpoint: str,
        container: str,
        auth: Auth,
        *,
        api_version: str,
        pool_size: int,
        ca_bundle: Path | None = None,
    ) -> None:
        endpoint = endpoint.rstrip("/")
        self.root = f"{endpoint}/{container}"
        # The environment's proxy for this endpoint, read once (requests' rules).
        self.pool = ConnectionPool(
            endpoint, pool_size, ca_bundle=ca_bundle, proxy=proxies.for_url(endpoint)
        )
        self.auth = auth
        self.api_version = api_version
        self.container_path = f"{urlsplit(endpoint).path}/{quote(container)}"
        self._prefix = self.container_path + "/"
        self.hooks: list[Hook] = []

    def path(self, key: str) -> str:
        # The SDK's quoting of blob names: '/' and '~' stay literal.
        return self._prefix + quote(key, safe="~/")

    def _headers(self) -> dict[str, str]:
        return {
            "x-ms-version": self.api_version,
            "x-ms-date": http_date(),
            "User-Agent": USER_AGENT,
        }

    def _url(self, path: str, params: list[tuple[str, str]]) -> str:
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params)
        if self.auth.query:
            query = f"{query}&{self.auth.query}" if query else self.auth.query
        return f"{path}?{query}" if query else path

    def _send(
        self,
        method: str,
        path: str,
        params: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | memoryview | Iterable[memoryview] | None,
        timeout: float,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        self.auth.sign(method, path, params, headers)
        pool = self.pool
        sent = {**headers, **pool.forward_headers} if pool.forward else headers
        conn = pool.get(timeout)
        try:
            target = pool.target_prefix + self._url(path, params)
            if body is None:  # GET, HEAD: one prepared write, the same bytes
                resp = exchange(conn, method, target, pool.host_header, sent)
            else:
                conn.request(method, target, body=body, headers=sent)
                resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status == 407 and pool.proxy is not None:  # only a proxy answers 407
            conn.close()
            raise proxies.refused(pool.proxy, f"{pool.host}:{pool.port}", 407, resp.reason)
        for hook in self.hooks:
            hook(method, path, headers, resp.status)
        return conn, resp

    def _done(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Give the connection back if the response was read to its end."""
        if resp.isclosed() and not resp.will_close:
            self.pool.put(conn)
        else:
            conn.close()

    def _drain(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Read a small body to its end (the connection stays usable) and release."""
        try:
            if resp.length is None or resp.length <= ERROR_BODY_MAX:  # None: chunked
                resp.read(ERROR_BODY_MAX)
        except BaseException:
            conn.close()
            raise
        self._done(conn, resp)

    def _error(
        self, op: str, key: str, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
    ) -> StorageError:
        self._drain(conn, resp)
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return error_for_status(
            resp.status,
            op=op,
            key=key,
            store=self.root,
            code=headers.get("x-ms-error-code"),
            headers=headers,
        )

    def _range_headers(self, offset: int, length: int, etag: str | None) -> dict[str, str]:
        headers = self._headers()
        headers["x-ms-range"] = f"bytes={offset}-{offset + length - 1}"
        if etag is not None:
            headers["If-Match"] = etag
        return headers

    def _open_range(
        self, key: str, offset: int, length: int, etag: str | None, timeout: float
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, int]:
        """GET bytes [offset, offset+length); the response and how many bytes
        of body to read (0, with the connection released, past the end)."""
        headers = self._range_headers(offset, length, etag)
        conn, resp = self._send("GET", self.path(key), [], headers, None, timeout)
        status = resp.status
        if status == 416:  # at or after the end, or a 0-byte blob
            self._drain(conn, resp)
            return conn, resp, 0
        if status >= 300:
            raise self._error("read", key, conn, resp)
        try:
            n = _body_length(resp.status, resp.headers, key, offset, length)
        except BaseException:
            conn.close()
            raise
        if n == 0:  # a 200 with an empty body
            self._drain(conn, resp)
        return conn, resp, n

    def get_into_views(
        self,
        key: str,
        offset: int,
        buffers: Sequence[memoryview],
        *,
        etag: str | None,
        timeout: float,
    ) -> int:
        """Fill consecutive `buffers` from `offset` in one GET, in order; the
        byte count (short at the end: the last buffers filled in part or not).
        The GET runs in C without the GIL (storage.nativeget) where it can."""
        length = sum(map(len, buffers))
        if self.pool.native and len(buffers) <= nativeget.MAX_BUFFERS:
            opened = self._native_open(key, offset, length, buffers, etag, timeout)
            if opened is not None:
                conn, n, keep, _ = opened  # the buffers hold the whole body
                if conn is not None:
                    self._release(conn, keep)
                return n
        conn, resp, n = self._open_range(key, offset, length, etag, timeout)
        if n == 0:
            return 0
        try:
            left = n
            for buffer in buffers:
                piece = buffer[: min(len(buffer), left)]
                if piece:
                    read_body_from_socket(conn.sock, resp, piece)
                left -= len(piece)
        except BaseException:
            conn.close()
            raise
        self._done(conn, resp)
        return n

    def _native_open(
        self,
        key: str,
        offset: int,
        length: int,
        buffers: Sequence[memoryview],
        etag: str | None,
        timeout: float,
    ) -> tuple[http.client.HTTPConnection | None, int, bool, bytes] | None:
        """GET [offset, offset+length) by nativeget: what `_send` and
        `_open_range` do, the same checks and errors. (the connection, the
        body's length, whether to keep the connection once the body is read,
        the body's bytes read past `buffers`), the first bytes of the body in
        `buffers`; (None, 0, False, b"") for no body, the connection
        released; None when the connection cannot take it (nothing was sent;
        the pool stops trying)."""
        headers = self._range_headers(offset, length, etag)
        path = self.path(key)
        self.auth.sign("GET", path, [], headers)
        pool = self.pool
        sent = {**headers, **pool.forward_headers} if pool.forward else headers
        conn = pool.get(timeout)
        try:
            target = pool.target_prefix + self._url(path, [])
            request = request_head("GET", target, pool.host_header, sent)
            assert conn.sock is not None
            answer = nativeget.get_into(conn.sock, request, offset, length, buffers, timeout)
        except BaseException:
            conn.close()
            raise
        if answer is None:
            pool.native = False
            pool.put(conn)
            return None
        status, n, keep, answered = answer
        if isinstance(answered, bytes):  # a body
            for hook in self.hooks:
                hook("GET", path, headers, status)
            return conn, n, keep, answered
        if keep:
            pool.put(conn)
        else:
            conn.close()
        reason, found = answered
        if status == 407 and pool.proxy is not None:  # only a proxy answers 407
            raise proxies.refused(pool.proxy, f"{pool.host}:{pool.port}", 407, reason)
        for hook in self.hooks:
            hook("GET", path, headers, status)
        if status == 416:  # at or after the end, or a 0-byte blob
            return None, 0, False, b""
        if status >= 300:
            lower = {k.lower(): v for k, v in found.items()}
            raise error_for_status(
                status,
                op="read",
                key=key,
                store=self.root,
                code=lower.get("x-ms-error-code"),
                headers=lower,
            )
        # A 2xx the C side did not take as the range asked: what the checks say of it.
        if _body_length(status, found, key, offset, length) == 0:
            return None, 0, False, b""
        raise http.client.HTTPException(
            f"an answer to a range GET framed as no blob's is ({status})"
        )

    def _release(self, conn: http.client.HTTPConnection, keep: bool) -> None:
        if keep:
            self.pool.put(conn)
        else:
            conn.close()

    def get_pieces(
        self,
        key: str,
        offset: int,
        length: int,
        buffer: memoryview,
        sink: Callable[[memoryview, int], None],
        *,
        etag: str | None,
        timeout: float,
    ) -> int:
        """GET [offset, offset+length) in one request, read through `buffer`
        a piece at a time, each handed to `sink(piece, position)` before the
        next is read (the socket timeout bounds each read, as in
        `get_into_views`); the byte count (short at the end). The GET runs
        in C without the GIL (storage.nativeget) where it can."""
        if self.pool.native and len(buffer):
            first = buffer[: min(len(buffer), length)]
            opened = self._native_open(key, offset, length, [first], etag, timeout)
            if opened is not None:
                return self._native_pieces(opened, offset, buffer, sink, timeout)
        conn, resp, n = self._open_range(key, offset, length, etag, timeout)
        if n == 0:
            return 0
        try:
            _pieces(n, offset, buffer, sink, functools.partial(_fill, resp))
        except BaseException:
            conn.close()
            raise
        self._done(conn, resp)
        return n

    def _native_pieces(
        self,
        opened: tuple[http.client.HTTPConnection | None, int, bool, bytes],
        offset: int,
        buffer: memoryview,
        sink: Callable[[memoryview, int], None],
        timeout: float,
    ) -> int:
        """The rest of `get_pieces` after `_native_open`: the first piece is in
        `buffer`, then the body's bytes read past it, then the socket."""
        conn, n, keep, spill = opened
        if conn is None:
            return 0
        sock = conn.sock
        assert sock is not None

        def fill(piece: memoryview) -> None:
            nonlocal spill
            taken = min(len(spill), len(piece))
            piece[:taken] = spill[:taken]
            spill = spill[taken:]
            if taken < len(piece):
                nativeget.read_body(sock, piece[taken:], timeout)

        try:
            _pieces(n, offset, buffer, sink, fill, first=min(len(buffer), n))
        except BaseException:
            conn.close()
            raise
        self._release(conn, keep)
        return n

    def get_bytes(
        self, key: str, offset: int, length: int, *, etag: str | None, timeout: float
    ) -> bytes:
        conn, resp, n = self._open_range(key, offset, length, etag, timeout)
        if n == 0:
            return b""
        try:
            data = resp.read(n)  # one allocation, filled by recv_into
            if len(data) < n:
                raise http.client.IncompleteRead(b"", n - len(data))
        except BaseException:
            conn.close()
            raise
        self._done(conn, resp)
        return data

    def put(
        self,
        op: str,
        key: str,
        params: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | memoryview,
        *,
        timeout: float,
    ) -> dict[str, str]:
        """PUT `body`; the response headers (lower-case names)."""
        all_headers = self._headers()
        all_headers.update(headers)
        all_headers["Content-Length"] = str(len(body))
        conn, resp = self._send("PUT", self.path(key), params, all_headers, _slices(body), timeout)
        return self._answer(op, key, conn, resp)[0]

    def head(self, key: str, *, timeout: float) -> dict[str, str]:
        """Get Blob Properties: the response headers (lower-case names)."""
        conn, resp = self._send("HEAD", self.path(key), [], self._headers(), None, timeout)
        return self._answer("stat", key, conn, resp)[0]

    def get_container(
        self, params: list[tuple[str, str]], *, op: str, key: str, timeout: float
    ) -> bytes:
        """GET on the container itself (List Blobs with comp=list): the body.
        `op` and `key` only name the request in errors."""
        conn, resp = self._send("GET", self.container_path, params, self._headers(), None, timeout)
        return self._answer(op, key, conn, resp)[1]

    def _answer(
        self, op: str, key: str, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
    ) -> tuple[dict[str, str], bytes]:
        """A whole (small) answer: its headers, lower-case, and its body."""
        if resp.status >= 300:
            raise self._error(op, key, conn, resp)
        try:
            body = resp.read()  # to its Content-Length or last chunk; b'' for HEAD
        except BaseException:
            conn.close()
            raise
        self._done(conn, resp)
        return {k.lower(): v for k, v in resp.getheaders()}, body

    def close(self) -> None:
        self.pool.close()
