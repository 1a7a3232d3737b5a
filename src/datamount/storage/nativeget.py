"""The ranged GET of RawClient.get_into_views outside the interpreter: the
request's head goes out, the answer's head is read and parsed, and its body
lands in the caller's buffers, all in C (`_httpget.get_into`) with the GIL
released. The Python GET held the GIL about 0.16–0.22 ms per small blob
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

# (status, body bytes read, the connection may carry the next request, the
# reason and headers of an answer left to Python, or None)
Answer = tuple[int, int, bool, tuple[str, Headers] | None]


def answer_head(head: bytes) -> tuple[str, Headers]:
    """The reason and the header lines of a head block (status line first),
    as http.client reads them (`read_headers`)."""
    line, _, rest = head.partition(b"\n")
    reason = line.decode("iso-8859-1")[13:].strip()  # after "HTTP/1.1 200 "
    return reason, read_headers(io.BytesIO(rest))


def get_into(
    sock: socket.socket, request: bytes, offset: int, buffers: Sequence[memoryview], timeout: float
) -> Answer | None:
    """Send `request` on `sock` and read the answer, its body into `buffers`
    when it is the range from `offset`; None when this socket cannot take it
    (nothing sent). Failures raise what http.client and the ssl module raise
    for them: TimeoutError, RemoteDisconnected, OSError, SSLError,
    HTTPException, IncompleteRead."""
    if isinstance(sock, ssl.SSLSocket):
        sslobj = sock._sslobj  # type: ignore[attr-defined]
        if not TLS_USABLE or sslobj is None:
            return None
    else:
        sslobj = None
    code, status, n, keep, head = _httpget.get_into(
        sslobj, sock.fileno(), request, offset, buffers, timeout
    )
    if code == _httpget.BODY:
        return status, n, bool(keep), None
    if code == _httpget.HEAD:
        return status, 0, bool(keep), answer_head(head)
    if code == _httpget.NOT_TLS_OBJECT:
        return None
    if code == _httpget.TIMEOUT:
        raise TimeoutError("timed out")
    if code == _httpget.CLOSED:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    if code == _httpget.SYSTEM:
        raise OSError(n, os.strerror(n))  # the errno's own class: ConnectionResetError...
    if code == _httpget.TLS:
        raise ssl.SSLError(head)
    if code == _httpget.BROKEN_BODY:
        raise http.client.IncompleteRead(b"", n)
    raise http.client.HTTPException(head or f"native GET failed ({code})")
