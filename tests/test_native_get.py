"""storage.nativeget: the ranged GET in C against scripted servers on
loopback, plain and over TLS (the test CA): the body lands whole and in order
across buffers, the connection is kept or dropped as http.client would, every
failure is the exception http.client raises for it, and the GIL is free while
the call waits."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from azurite import Certs, make_certs
from datamount.storage import _httpget, nativeget
from datamount.storage.http_response import Response, request_head

pytestmark = pytest.mark.unit

BODY = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4: many 16 KiB TLS records
Step = Callable[[socket.socket], None]


def answer(status: str, headers: list[str], body: bytes = b"") -> Step:
    def send(conn: socket.socket) -> None:
        conn.sendall(
            f"HTTP/1.1 {status}\r\n".encode()
            + "".join(f"{h}\r\n" for h in headers).encode()
            + b"\r\n"
            + body
        )

    return send


def ranged(offset: int, body: bytes, extra: list[str] | None = None) -> Step:
    last = offset + len(body) - 1
    headers = [f"Content-Length: {len(body)}", f"Content-Range: bytes {offset}-{last}/99999999"]
    return answer("206 Partial Content", headers + (extra or []), body)


class Server:
    """One connection on loopback (TLS with the test CA when `certs`): each
    request read is answered by the next step; a step may also close or stall."""

    def __init__(self, steps: list[Step], certs: Certs | None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.steps = steps
        self.requests: list[bytes] = []
        self.context: ssl.SSLContext | None = None
        if certs is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(certs.cert, certs.key)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            raw, _ = self.listener.accept()
        except OSError:
            return
        conn = self.context.wrap_socket(raw, server_side=True) if self.context else raw
        with conn:
            pending = b""
            for step in self.steps:
                while b"\r\n\r\n" not in pending:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    pending += chunk
                request, _, pending = pending.partition(b"\r\n\r\n")
                self.requests.append(request)
                try:
                    step(conn)
                except OSError:
                    return
            time.sleep(0.2)  # the client reads to its end before the close

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(params=[False, True], ids=["http", "https"])
def serve(request: pytest.FixtureRequest, certs: Certs) -> Iterator[Callable[..., socket.socket]]:
    """serve(*steps) -> a connected client socket (an SSLSocket for https)."""
    made: list[tuple[Server, socket.socket]] = []

    def start(*steps: Step) -> socket.socket:
        server = Server(list(steps), certs if request.param else None)
        start.servers.append(server)  # type: ignore[attr-defined]
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        if request.param:
            ctx = ssl.create_default_context(cafile=str(certs.ca))
            sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
        made.append((server, sock))
        return sock

    start.servers = []  # type: ignore[attr-defined]
    yield start
    for server, sock in made:
        sock.close()
        server.close()


def get(
    sock: socket.socket,
    offset: int,
    buffers: list[memoryview],
    timeout: float = 5.0,
    length: int | None = None,
) -> nativeget.Answer:
    request = request_head("GET", "/c/blob", "127.0.0.1", {"x-ms-range": f"bytes={offset}-"})
    asked = sum(map(len, buffers)) if length is None else length
    got = nativeget.get_into(sock, request, offset, asked, buffers, timeout)
    assert got is not None
    return got


def views(*sizes: int) -> tuple[list[bytearray], list[memoryview]]:
    arrays = [bytearray(n) for n in sizes]
    return arrays, [memoryview(a) for a in arrays]


def test_the_body_fills_the_buffers_in_order_and_the_connection_carries_on(serve) -> None:
    sock = serve(ranged(7, BODY), ranged(7 + len(BODY), b"xyz"))
    arrays, bufs = views(1000, 0, len(BODY) - 1000 + 50)
    assert get(sock, 7, bufs) == (206, len(BODY), True, b"")
    assert bytes(arrays[0]) + bytes(arrays[2][: len(BODY) - 1000]) == BODY
    assert bytes(arrays[2][len(BODY) - 1000 :]) == bytes(50)  # past the body: untouched
    arrays, bufs = views(3)
    assert get(sock, 7 + len(BODY), bufs) == (206, 3, True, b"")
    assert arrays[0] == b"xyz"


def test_the_request_goes_out_as_request_head_builds_it(serve) -> None:
    sock = serve(ranged(0, b"ab"))
    request = request_head("GET", "/c/b%20lob?sv=x", "127.0.0.1:1", {"x-ms-range": "bytes=0-1"})
    assert nativeget.get_into(sock, request, 0, 2, [memoryview(bytearray(2))], 5.0) is not None
    assert serve.servers[-1].requests == [request[:-4]]


def test_a_whole_200_from_offset_0_is_a_body(serve) -> None:
    sock = serve(answer("200 OK", ["Content-Length: 4"], b"abcd"))
    arrays, bufs = views(8)
    assert get(sock, 0, bufs) == (200, 4, True, b"")
    assert arrays[0][:4] == b"abcd"


def test_an_error_answer_comes_back_as_http_client_reads_it_and_keeps_the_connection(serve) -> None:
    body = b"<?xml?><Error><Code>BlobNotFound</Code></Error>"
    headers = [
        f"Content-Length: {len(body)}",
        "x-ms-error-code: BlobNotFound",
        "X-Folded: one",
        " two",
        "x-ms-error-code: second",
    ]
    sock = serve(answer("404 The specified blob does not exist.", headers, body), ranged(0, b"ok"))
    status, n, keep, head = get(sock, 0, views(16)[1])
    assert (status, n, keep) == (404, 0, True)
    assert isinstance(head, tuple)
    reason, found = head
    assert reason == "The specified blob does not exist."
    wire = f"HTTP/1.1 404 x\r\n{''.join(h + chr(13) + chr(10) for h in headers)}\r\n".encode()
    theirs = Response(FakeSock(wire), method="GET")
    theirs.begin()
    assert found.items() == theirs.headers.items()
    assert found.get("x-ms-error-code") == "BlobNotFound"  # the first value wins
    assert get(sock, 0, views(2)[1])[:3] == (206, 2, True)  # the body was drained


class FakeSock:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> object:
        import io

        return io.BytesIO(self.data)


def test_connection_close_and_http_1_0_are_not_kept(serve) -> None:
    sock = serve(ranged(0, b"ab", ["Connection: close"]))
    assert get(sock, 0, views(2)[1]) == (206, 2, False, b"")
    sock = serve(lambda c: c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nab"))
    assert get(sock, 0, views(2)[1]) == (200, 2, False, b"")


def test_a_range_not_the_one_asked_is_left_to_python(serve) -> None:
    sock = serve(ranged(5, b"abc"))
    status, n, keep, head = get(sock, 4, views(3)[1])
    assert (status, n, isinstance(head, tuple)) == (206, 0, True)
    assert isinstance(head, tuple) and head[1].get("Content-Range") == "bytes 5-7/99999999"
    sock = serve(ranged(0, b"abcd"))  # longer than the buffers
    assert isinstance(get(sock, 0, views(3)[1])[3], tuple)


def hang_up(conn: socket.socket) -> None:
    """End the connection (over TLS its close_notify first, then TCP's)."""
    (conn.unwrap() if isinstance(conn, ssl.SSLSocket) else conn).shutdown(socket.SHUT_RDWR)


def cut_short(length: int, sent: int) -> Step:
    """A 206 of `length` bytes from offset 0, of which `sent` go out before the end."""

    def send(conn: socket.socket) -> None:
        head = f"HTTP/1.1 206 P\r\nContent-Length: {length}\r\n"
        head += f"Content-Range: bytes 0-{length - 1}/{length}\r\n\r\n"
        conn.sendall(head.encode() + b"x" * sent)
        hang_up(conn)

    return send


def test_a_body_cut_short_is_an_incomplete_read_of_what_is_missing(serve) -> None:
    sock = serve(cut_short(100, 60))
    with pytest.raises(http.client.IncompleteRead) as info:
        get(sock, 0, views(100)[1])
    assert info.value.expected == 40


def test_a_close_before_the_head_is_remote_disconnected(serve) -> None:
    sock = serve(hang_up)
    with pytest.raises(http.client.RemoteDisconnected):
        get(sock, 0, views(4)[1])


def test_a_stall_times_out_and_the_gil_is_free_meanwhile(serve) -> None:
    def stall(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 206 P\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/10\r\n\r\nabc"
        )
        time.sleep(1.5)

    sock = serve(stall)
    sock.settimeout(0.4)  # non-blocking with a timeout, as the pool's sockets are
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            get(sock, 0, views(10)[1], timeout=0.4)
    finally:
        stop.set()
        counter.join()
    assert 0.35 < time.monotonic() - started < 1.4
    assert ticks > 10_000  # the counting thread ran while the call waited


def test_what_is_not_http_is_an_http_exception(serve) -> None:
    sock = serve(lambda c: c.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"))
    with pytest.raises(http.client.HTTPException, match="not an HTTP/1.x answer"):
        get(sock, 0, views(4)[1])
    sock = serve(lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n"))
    with pytest.raises(http.client.HTTPException, match="an answer head over 65536 bytes"):
        get(sock, 0, views(4)[1])


def test_an_object_that_is_not_the_sockets_own_tls_is_refused_before_sending(certs: Certs) -> None:
    server = Server([ranged(0, b"ab")], None)
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        bio = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO())
        buf = [memoryview(bytearray(2))]
        for other in (object(), bio._sslobj):  # type: ignore[attr-defined]
            request = b"GET / HTTP/1.1\r\n\r\n"
            code = _httpget.get_into(other, sock.fileno(), request, 0, 2, buf, 1.0)[0]
            assert code == _httpget.NOT_TLS_OBJECT
        request = request_head("GET", "/", "h", {})
        assert nativeget.get_into(sock, request, 0, 2, buf, 5.0) is not None
        assert server.requests == [b"GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: identity"]
        sock.close()
    finally:
        server.close()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="1 to 64 buffers"):
        _httpget.get_into(None, 0, b"", 0, 1, [], 1.0)
    with pytest.raises(ValueError, match="must not be negative"):
        _httpget.get_into(None, -1, b"", 0, 1, [memoryview(bytearray(1))], 1.0)
    with pytest.raises(ValueError, match="length positive"):
        _httpget.get_into(None, 0, b"", 0, 0, [memoryview(bytearray(1))], 1.0)
    with pytest.raises(BufferError, match="not writable"):
        _httpget.get_into(None, 0, b"", 0, 1, [memoryview(b"read-only")], 1.0)
    with pytest.raises(ValueError, match="within the buffers"):
        _httpget.read_body(None, 0, [memoryview(bytearray(1))], 2, 1.0)


def test_a_span_longer_than_the_buffer_goes_on_a_buffer_at_a_time(serve) -> None:
    """What the first read took past the buffer comes back; read_body reads
    the rest, and the connection carries the next request."""
    sock = serve(ranged(3, BODY), ranged(0, b"next"))
    first = bytearray(1000)
    status, n, keep, spill = get(sock, 3, [memoryview(first)], length=len(BODY))
    assert (status, n, keep) == (206, len(BODY), True)
    assert isinstance(spill, bytes) and len(spill) < nativeget._httpget.HEAD_MAX
    got = bytes(first) + spill
    while len(got) < n:
        piece = bytearray(min(70_000, n - len(got)))
        nativeget.read_body(sock, memoryview(piece), 5.0)
        got += piece
    assert got == BODY
    assert get(sock, 0, views(4)[1])[:3] == (206, 4, True)


def test_a_span_cut_short_is_an_incomplete_read_of_what_is_missing(serve) -> None:
    sock = serve(cut_short(100_000, 60_000))
    status, n, _, spill = get(sock, 0, [memoryview(bytearray(100))], length=100_000)
    assert (status, n) == (206, 100_000)
    assert isinstance(spill, bytes)
    rest = bytearray(100_000 - 100 - len(spill))
    with pytest.raises(http.client.IncompleteRead) as info:
        nativeget.read_body(sock, memoryview(rest), 5.0)
    assert info.value.expected == 40_000
