"""The ranged GETs of RawClient outside the interpreter: the
request's head goes out, the answer's head is read and parsed, and its body
lands in the caller's buffers, all in C (`_httpget.get_into`) with the GIL
released; a span longer than the buffer goes on a buffer at a time
(`read_body`). The Python GET held the GIL about 0.16–0.22 ms per small blob
(sending, reading the status line and headers, one Python call per 16 KiB TLS
record); this one holds it for the call alone (docs/design/storage.md,
"The native GET").

What stays in Python: the connection (the pool, TLS set-up, proxies), the
request's head (`http_response.request_head`, signed as before), the
retries, and every answer that is not a 200 or 206 carrying the range asked:
its head comes back and is parsed here (`answer_head`), the errors mapped as
before. Over TLS the connection's own OpenSSL object is used, only when this
module was built against the OpenSSL the ssl module runs (`TLS_USABLE`);
otherwise, and for any socket the C side does not recognise, `get_into`
answers None before sending anything and the caller reads in Python.

Threads: none of its own; the calling thread owns the connection.
"""

from __future__ import annotations

import http.client
import io
import os
import socket
import ssl
from collections.abc import Sequence

from datamount.storage import _httpget
from datamount.storage.http_response import Headers, read_headers

MAX_BUFFERS = 64  # _httpget's limit on the buffers of one call
TLS_USABLE = _httpget.OPENSSL_VERSION_NUMBER == ssl.OPENSSL_VERSION_NUMBER

# (status, the body's length, the connection may carry the next request once
# the body is read, then either the reason and headers of an answer left to
# Python, or for a body: its bytes read past the buffers, b"" for none)
Answer = tuple[int, int, bool, tuple[str, Headers] | bytes]


def answer_head(head: bytes) -> tuple[str, Headers]:
    """The reason and the header lines of a head block (status line first),
    as http.client reads them (`read_headers`)."""
    line, _, rest = head.partition(b"\n")
    reason = line.decode("iso-8859-1")[13:].strip()  # after "HTTP/1.1 200 "
    return reason, read_headers(io.BytesIO(rest))


def _tls(sock: socket.socket) -> tuple[bool, object | None]:
    """(the native GET can use `sock`, its TLS object or None for plain TCP)."""
    if isinstance(sock, ssl.SSLSocket):
        sslobj = sock._sslobj  # type: ignore[attr-defined]
        return TLS_USABLE and sslobj is not None, sslobj
    return True, None


def get_into(
    sock: socket.socket,
    request: bytes,
    offset: int,
    length: int,
    buffers: Sequence[memoryview],
    timeout: float,
) -> Answer | None:
    """Send `request` on `sock` and read the answer: when it is at most
    `length` bytes from `offset`, its body, as much as fits, into `buffers`
    (the rest with `read_body`); None when this socket cannot take it
    (nothing sent). Failures raise what http.client and the ssl module raise
    for them: TimeoutError, RemoteDisconnected, OSError, SSLError,
    HTTPException, IncompleteRead."""
    usable, sslobj = _tls(sock)
    if not usable:
        return None
    code, status, n, keep, head = _httpget.get_into(
        sslobj, sock.fileno(), request, offset, length, buffers, timeout
    )
    if code == _httpget.BODY:
        return status, n, bool(keep), head or b""
    if code == _httpget.HEAD:
        return status, 0, bool(keep), answer_head(head)
    if code == _httpget.NOT_TLS_OBJECT:
        return None
    raise _failure(code, n, head)


def read_body(sock: socket.socket, view: memoryview, timeout: float) -> None:
    """The next len(view) bytes of the body `get_into` began, into `view`."""
    _, sslobj = _tls(sock)
    code, _, n, _, message = _httpget.read_body(sslobj, sock.fileno(), [view], len(view), timeout)
    if code != _httpget.BODY:
        raise _failure(code, n, message)


def _failure(code: int, n: int, message: str | None) -> Exception:
    if code == _httpget.TIMEOUT:
        return TimeoutError("timed out")
    if code == _httpget.CLOSED:
        return http.client.RemoteDisconnected("Remote end closed connection without response")
    if code == _httpget.SYSTEM:
        return OSError(n, os.strerror(n))  # the errno's own class: ConnectionResetError...
    if code == _httpget.TLS:
        return ssl.SSLError(message)
    if code == _httpget.BROKEN_BODY:
        return http.client.IncompleteRead(b"", n)
    return http.client.HTTPException(message or f"native GET failed ({code})")
