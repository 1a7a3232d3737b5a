"""A fault-injecting HTTP/1.1 reverse proxy for tests: put it between the
code under test and Azurite, and make storage misbehave on demand.

`FaultProxy(upstream_port)` listens on 127.0.0.1 (a free port) and forwards
every request byte for byte to the upstream (one upstream connection per
client connection, keep-alive both ways; bodies framed by Content-Length or
chunked, relayed as they arrive). Rules, each consumed as it fires:

- `fail_ranged(n, status=503)`: the next `n` GETs carrying a Range or
  x-ms-range header are answered `status` with `Retry-After: 0` (never
  forwarded);
- `reset_ranged(n)`: the next `n` ranged GETs are forwarded, but only the
  status line, the headers and half of the body reach the client, then the
  connection is reset (RST);
- `deny(blob, status=403)`: every GET of a blob whose path ends with `/blob`
  is answered `status` (AuthorizationPermissionMismatch) until `allow(blob)`;
- `fail_writes(n, status=503)`: the next `n` PUTs (Put Blob, Put Block, Put
  Block List) are answered `status` with `Retry-After: 0` (never forwarded);
- `deny_writes(blob, status=403)`: every PUT of a blob whose path ends with
  `/blob` is answered `status` until `allow_writes(blob)`;
- `down()` / `up()` / `outage(seconds)`: storage unreachable at the TCP
  level: connections refused, open ones reset, then served again on the
  same port.

`requests` records (method, path, range, status) of every answer before it
is sent, `reset()` forgets them. Threads: the accept loop and one daemon thread per client
connection; `close()` stops them all. Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import select
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

ACCOUNT = "devstoreaccount1"
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # decoded, without the query
    range: str | None
    status: int  # what the client was answered (0: reset before an answer)
    injected: str = ""  # "", "fail", "reset", "deny"


class _Head:
    """A request or response head: its first line, headers (raw, in order) and
    the lower-cased names for lookups."""

    def __init__(self, first: bytes, lines: list[bytes]) -> None:
        self.first = first
        self.lines = lines
        self.fields: dict[str, str] = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            self.fields[name.strip().lower()] = value.strip()

    def raw(self) -> bytes:
        return self.first + b"".join(self.lines) + b"\r\n"

    def get(self, name: str) -> str | None:
        return self.fields.get(name.lower())

    @property
    def chunked(self) -> bool:
        return "chunked" in (self.get("transfer-encoding") or "").lower()

    @property
    def closes(self) -> bool:
        return (self.get("connection") or "").lower() == "close"


def _read_head(stream: BinaryIO) -> _Head | None:
    first = stream.readline(65537)
    while first in (b"\r\n", b"\n"):  # tolerated between messages (RFC 9112 §2.2)
        first = stream.readline(65537)
    if not first:
        return None
    lines = []
    while True:
        line = stream.readline(65537)
        if line in (b"\r\n", b"\n", b""):
            return _Head(first, lines)
        lines.append(line)


def _relay_body(
    head: _Head, src: BinaryIO, send: Callable[[bytes], None], *, limit: int | None = None
) -> bool:
    """Copy the body `head` announces from `src` to `send`, framing included.
    With `limit`, stop after that many bytes (False: cut short)."""
    sent = 0

    def out(data: bytes) -> bool:
        nonlocal sent
        if limit is not None and sent + len(data) > limit:
            send(data[: limit - sent])
            return False
        send(data)
        sent += len(data)
        return True

    if head.chunked:
        while True:
            size_line = src.readline(65537)
            if not size_line:
                raise ConnectionError("body ended inside a chunk header")
            if not out(size_line):
                return False
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = src.readline(65537)
                    if not out(line) or line in (b"\r\n", b"\n", b""):
                        return True
            left = size + 2  # the chunk and its CRLF
            while left:
                data = src.read(min(CHUNK, left))
                if not data:
                    raise ConnectionError("body ended inside a chunk")
                left -= len(data)
                if not out(data):
                    return False
    length = int(head.get("content-length") or 0)
    while length:
        data = src.read(min(CHUNK, length))
        if not data:
            raise ConnectionError("body ended early")
        length -= len(data)
        if not out(data):
            return False
    return True


def _dropped(sock: socket.socket) -> bool:
    """An idle connection that is readable was closed by its peer."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?><Error>'
        f"<Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._fail: list[int] = []  # statuses of the next ranged GETs to fail
        self._resets = 0
        self._denied: dict[str, int] = {}
        self._fail_writes: list[int] = []
        self._denied_writes: dict[str, int] = {}
        self._requests: list[Request] = []
        self._sockets: set[socket.socket] = set()
        self._latency = 0.0  # seconds each request waits before it is forwarded
        self._in_flight = 0
        self.most_in_flight = 0  # the most requests forwarded at once
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.connection, self.rfile)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self._listen = lambda port: Server(("127.0.0.1", port), Handler)  # up() after down()
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="faultproxy", daemon=True
        )
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    # -- rules -------------------------------------------------------------

    def fail_ranged(self, n: int, status: int = 503) -> None:
        with self._lock:
            self._fail += [status] * n

    def reset_ranged(self, n: int) -> None:
        with self._lock:
            self._resets += n

    def deny(self, blob: str, status: int = 403) -> None:
        with self._lock:
            self._denied[blob.strip("/")] = status

    def allow(self, blob: str) -> None:
        with self._lock:
            self._denied.pop(blob.strip("/"), None)

    def fail_writes(self, n: int, status: int = 503) -> None:
        with self._lock:
            self._fail_writes += [status] * n

    def deny_writes(self, blob: str, status: int = 403) -> None:
        with self._lock:
            self._denied_writes[blob.strip("/")] = status

    def allow_writes(self, blob: str) -> None:
        with self._lock:
            self._denied_writes.pop(blob.strip("/"), None)

    def latency(self, seconds: float) -> None:
        """Every request waits `seconds` before it goes on: a link's round trip."""
        with self._lock:
            self._latency = seconds

    def pending(self) -> tuple[int, int]:
        """(failures, resets) still to fire."""
        with self._lock:
            return len(self._fail), self._resets

    # -- outages ---------------------------------------------------------------

    def down(self) -> None:
        """Storage unreachable at the TCP level: the listening socket closes
        (a new connection is refused) and every open connection is reset
        (RST), whatever it was doing, until `up()`."""
        # A listening socket shut down refuses at once (and wakes the accept loop).
        with contextlib.suppress(OSError):
            self._server.socket.shutdown(socket.SHUT_RDWR)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: the handler's close() sends RST; SHUT_RD wakes it.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)

    def up(self) -> None:
        """Listen again, on the same port, after `down()`."""
        self._server = self._listen(self.port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="faultproxy", daemon=True
        )
        self._thread.start()

    def outage(self, seconds: float) -> None:
        """`down()` for `seconds`, then `up()`."""
        self.down()
        try:
            time.sleep(seconds)
        finally:
            self.up()

    # -- what happened -------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def ranged_gets(self, blob: str | None = None) -> list[Request]:
        """Ranged GETs answered (any status), optionally of one blob."""
        return [
            r
            for r in self.requests
            if r.method == "GET" and r.range and (blob is None or r.path.endswith("/" + blob))
        ]

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()
            self.most_in_flight = self._in_flight

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving -------------------------------------------------------------

    def _record(self, head: _Head, status: int, injected: str = "") -> None:
        method, target = head.first.decode("latin-1").split()[:2]
        path = unquote(urlsplit(target).path)
        rng = head.get("x-ms-range") or head.get("range")
        with self._lock:
            self._requests.append(Request(method, path, rng, status, injected))

    def _rule(self, head: _Head) -> tuple[str, int]:
        """What to do with this request: ("", 0) forward it untouched."""
        method, target = head.first.decode("latin-1").split()[:2]
        path = unquote(urlsplit(target).path)
        if method == "PUT":
            with self._lock:
                for blob, status in self._denied_writes.items():
                    if path.endswith("/" + blob):
                        return "deny", status
                if self._fail_writes:
                    return "fail", self._fail_writes.pop(0)
            return "", 0
        if method != "GET":
            return "", 0
        ranged = bool(head.get("x-ms-range") or head.get("range"))
        with self._lock:
            for blob, status in self._denied.items():
                if path.endswith("/" + blob):
                    return "deny", status
            if ranged and self._fail:
                return "fail", self._fail.pop(0)
            if ranged and self._resets:
                self._resets -= 1
                return "reset", 0
        return "", 0

    def _serve(self, client: socket.socket, rfile: BinaryIO) -> None:
        with self._lock:
            self._sockets.add(client)
        upstream: socket.socket | None = None
        up_file: BinaryIO | None = None
        try:
            while True:
                head = _read_head(rfile)
                if head is None:
                    return
                action, status = self._rule(head)
                if action in ("fail", "deny"):
                    _relay_body(head, rfile, lambda data: None)  # the request body, dropped
                    self._answer(client, head, action, status)
                    if head.closes:
                        return
                    continue
                if upstream is not None and _dropped(upstream):
                    # The upstream closed its idle keep-alive connection: a new one.
                    with self._lock:
                        self._sockets.discard(upstream)
                    upstream.close()
                    upstream = None
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=60)
                    up_file = upstream.makefile("rb")
                    with self._lock:
                        self._sockets.add(upstream)
                assert up_file is not None
                with self._lock:
                    self._in_flight += 1
                    self.most_in_flight = max(self.most_in_flight, self._in_flight)
                    latency = self._latency
                try:
                    time.sleep(latency)
                    upstream.sendall(head.raw())
                    _relay_body(head, rfile, upstream.sendall)
                    keep = self._relay_response(client, head, up_file, reset=action == "reset")
                finally:
                    with self._lock:
                        self._in_flight -= 1
                if not keep or head.closes:
                    return
        except (OSError, ValueError, ConnectionError):
            return  # a peer went away: end this connection
        finally:
            for sock in (upstream, client):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
                    with self._lock:
                        self._sockets.discard(sock)

    def _answer(self, client: socket.socket, head: _Head, action: str, status: int) -> None:
        if action == "fail":
            code, reason = "ServerBusy", "Service Unavailable"
            body = _error_body(code, "Injected by faultproxy: the server is busy.")
            extra = "Retry-After: 0\r\n"
        else:
            code, reason = "AuthorizationPermissionMismatch", "Forbidden"
            body = _error_body(code, "Injected by faultproxy: no permission.")
            extra = ""
        # Recorded before it is sent: a client may act on the answer (and the
        # test look at `requests`) before this thread runs again.
        self._record(head, status, action)
        client.sendall(
            (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                f"x-ms-error-code: {code}\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )

    def _relay_response(
        self, client: socket.socket, request: _Head, up_file: BinaryIO, *, reset: bool
    ) -> bool:
        """Relay one response (after any 1xx); False when the connection must end."""
        method = request.first.split()[0]
        while True:
            head = _read_head(up_file)
            if head is None:
                raise ConnectionError("upstream closed before answering")
            status = int(head.first.split()[1])
            if not 100 <= status < 200 or status == 101:
                break
            client.sendall(head.raw())
        no_body = method == b"HEAD" or status in (204, 304) or 100 <= status < 200
        framed = head.chunked or head.get("content-length") is not None
        resetting = reset and not no_body and framed
        # Recorded before the answer goes out: a client may act on it (and the
        # test look at `requests`) before this thread runs again.
        self._record(request, status, "reset" if resetting else "")
        client.sendall(head.raw())
        if resetting:
            length = int(head.get("content-length") or 2 * CHUNK)
            _relay_body(head, up_file, client.sendall, limit=length // 2)
            # SO_LINGER 0: close() sends RST, the reader sees a reset mid-body.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if no_body:
            pass
        elif framed:
            _relay_body(head, up_file, client.sendall)
        else:  # delimited by the upstream closing the connection
            while data := up_file.read(CHUNK):
                client.sendall(data)
            return False
        return not head.closes
