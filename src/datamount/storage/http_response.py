"""An http.client response whose header block is parsed without the email
package: the per-request cost that dominates a small blob's GET.

http.client parses every response's headers with email.parser (a feed
parser, a policy object and a Message per response): a large share of a
small GET's CPU (docs/design/storage.md, "Per-request Python costs").
`Response` reads the same lines under the same limits (http.client's
_MAXLINE, _MAXHEADERS) and keeps them in `Headers`, which answers what
HTTPResponse and its callers ask of a message (`get`, `get_all`, `items`,
`[]`, `in`; names case-insensitive, the first value wins as in email.message).
Everything after the headers — chunked bodies, Content-Length, keep-alive —
is http.client's own code.

`read_body_from_socket` fills a caller's buffer from a sized body straight
from the socket (one Python call per TLS record), keeping the response's
count so it closes as after its own reads.

`exchange` sends a request without a body as one prepared block of bytes
(`request_head`)
and reads its answer's status and headers: the same bytes http.client's
request() puts on the wire (request line, Host, Accept-Encoding: identity,
then the caller's headers in order; the same checks of the target and the
values), without its per-header putheader calls and its state machine
(why: the same section of docs/design/storage.md).

Threads: none of its own; one Response is read by one thread.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from collections.abc import Callable, Iterator
from typing import Any

_MAXLINE = 65536  # http.client._MAXLINE
_MAXHEADERS = 100  # http.client._MAXHEADERS
# What http.client refuses in a request target (_contains_disallowed_url_pchar_re)
# and in a header value (_is_illegal_header_value: a line break not followed by
# folding whitespace, or a leading or trailing one).
_BAD_TARGET = re.compile("[\x00-\x20\x7f]")
_BAD_VALUE = re.compile(r"\n(?![ \t])|\r(?![ \t\n])")


class Headers:
    """Response headers in arrival order; lookups by lower-case name."""

    __slots__ = ("_items", "_by_name")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        by_name: dict[str, list[str]] = {}
        for name, value in items:
            by_name.setdefault(name.lower(), []).append(value)
        self._by_name = by_name

    def get(self, name: str, default: Any = None) -> Any:
        values = self._by_name.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, default: Any = None) -> Any:
        values = self._by_name.get(name.lower())
        return list(values) if values else default

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> list[str]:
        return [name for name, _ in self._items]

    def values(self) -> list[str]:
        return [value for _, value in self._items]

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)


def read_headers(fp: Any) -> Headers:
    """The header lines up to the blank line, as http.client reads them and
    email's compat32 policy splits them (ISO-8859-1; an obsolete folded line
    is kept, line break included, in the value of the header before it)."""
    items: list[tuple[str, str]] = []
    count = 0
    while True:
        line = fp.readline(_MAXLINE + 1)
        if len(line) > _MAXLINE:
            raise http.client.LineTooLong("header line")
        count += 1
        if count > _MAXHEADERS:
            raise http.client.HTTPException(f"got more than {_MAXHEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            return Headers([(name, value.rstrip("\r\n")) for name, value in items])
        text = line.decode("iso-8859-1")
        if text[:1] in (" ", "\t"):  # obs-fold (RFC 7230 3.2.4)
            if items:
                items[-1] = (items[-1][0], items[-1][1] + text)
            continue
        name, sep, value = text.partition(":")
        if sep:  # a line without a colon is dropped (email.parser: a defect)
            items.append((name, value.lstrip(" \t")))


class Response(http.client.HTTPResponse):
    """HTTPResponse with `read_headers` instead of email.parser; the rest of
    `begin` is http.client's (status line, 100-continue, framing)."""

    def begin(self) -> None:
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            read_headers(self.fp)  # the 100 answer's headers
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        headers = read_headers(self.fp)
        self.headers = self.msg = headers
        tr_enc = headers.get("transfer-encoding")
        self.chunked = bool(tr_enc) and tr_enc.lower() == "chunked"
        if self.chunked:
            self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:
                    self.length = None
        if (
            status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
            or 100 <= status < 200
            or self._method == "HEAD"
        ):
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


def read_body_into(resp: http.client.HTTPResponse, view: memoryview) -> None:
    """Fill `view` from the body of `resp`; IncompleteRead if it ends first."""
    got, want = 0, len(view)
    while got < want:
        n = resp.readinto(view[got:])
        if not n:
            raise http.client.IncompleteRead(b"", want - got)
        got += n


def read_body_from_socket(
    sock: socket.socket | None, resp: http.client.HTTPResponse, view: memoryview
) -> None:
    """`read_body_into`, reading the body straight from the socket once the bytes the
    header parse left buffered are taken: over TLS one call of the C
    `_SSLSocket.read` per record (SSL_read returns at most one 16 KiB record,
    65,536 per GiB, whatever the size asked), with no Python frame around it;
    the buffered reader adds three (SocketIO.readinto, SSLSocket.recv_into,
    SSLSocket.read). The response's own count is kept, so it closes (and the
    connection goes back to the pool) as if it had read the bytes itself.
    A chunked or unsized body: `read_body_into`."""
    want, fp = len(view), resp.fp
    if sock is None or fp is None or resp.chunked or resp.length is None or resp.length < want:
        read_body_into(resp, view)
        return
    got = resp.readinto(view[: min(want, len(fp.peek()))])  # peek: at most one socket read
    if not got:
        raise http.client.IncompleteRead(b"", want)
    sslobj = getattr(sock, "_sslobj", None) if isinstance(sock, ssl.SSLSocket) else None
    read: Callable[[int, memoryview], int]
    if sslobj is not None:
        # The C `_SSLSocket.read`, without SSLSocket.read's Python frame around it:
        # one Python-level call per 16 KiB record instead of two (OpenSSL 3 returns
        # at most one record per read whatever the size asked). A TLS EOF without
        # close_notify ends the body early, as SSLSocket.read's 0 does.
        read = sslobj.read
    elif isinstance(sock, ssl.SSLSocket):
        read = sock.read  # type: ignore[assignment]  # given a buffer, it returns the count
    else:
        read = lambda size, into: sock.recv_into(into, size)  # noqa: E731
    direct = 0
    try:
        while got < want:
            n = read(want - got, view[got:])
            if not n:
                raise http.client.IncompleteRead(b"", want - got)
            got += n
            direct += n
    except ssl.SSLEOFError:
        raise http.client.IncompleteRead(b"", want - got) from None
    if direct:
        resp.length -= direct
        resp.readinto(view[:0])  # at the end: the response closes as after its own read


def host_header(host: str, port: int, default_port: int) -> str:
    """The Host header http.client sends for a connection to host:port."""
    name = f"[{host}]" if ":" in host else host
    return name if port == default_port else f"{name}:{port}"


def request_head(method: str, target: str, host: str, headers: dict[str, str]) -> bytes:
    """The bytes http.client's request() sends for `method target` without a
    body: request line, Host, Accept-Encoding: identity, then `headers` in
    order; what it refuses in the target or a value is refused the same way."""
    if _BAD_TARGET.search(target):
        raise http.client.InvalidURL(f"URL can't contain control characters. {target!r}")
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity"]
    for name, value in headers.items():
        if _BAD_VALUE.search(value):
            raise ValueError(f"Invalid header value {value.encode('latin-1')!r}")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


def exchange(
    conn: http.client.HTTPConnection,
    method: str,
    target: str,
    host: str,
    headers: dict[str, str],
) -> http.client.HTTPResponse:
    """Send `method target` (no body) with these headers on the open
    connection `conn` and return its response, status and headers read.
    The connection stays idle for http.client (its next request() works);
    an answer that closes the connection closes `conn`, as getresponse does."""
    sock = conn.sock
    assert sock is not None
    sock.sendall(request_head(method, target, host, headers))
    resp = conn.response_class(sock, method=method)
    try:
        resp.begin()
    except ConnectionError:
        conn.close()
        raise
    if resp.will_close:
        conn.close()  # the response keeps the socket open until its body is read
    return resp
