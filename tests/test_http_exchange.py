"""http_response.exchange: a bodyless request sent as one prepared write puts
the same bytes on the wire as http.client's request(), refuses what it
refuses, and leaves the connection usable by http.client afterwards."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from datamount.storage.http_response import Response, exchange, host_header

pytestmark = pytest.mark.unit


class Recorder:
    """A one-connection HTTP server on loopback that records each request's
    bytes and answers 200 with a 2-byte body (or closes, when told)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.close_after = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # the fixture closed the listener: no client came
            return
        with conn:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                request, _, pending = pending.partition(b"\r\n\r\n")
                self.requests.append(request + b"\r\n\r\n")
                close = b"Connection: close\r\n" if self.close_after else b""
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + close + b"\r\nok")
                if self.close_after:
                    return


@pytest.fixture
def server() -> Iterator[Recorder]:
    made = Recorder()
    yield made
    made.listener.close()


def connection(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.response_class = Response
    conn.connect()
    return conn


HEADERS = {
    "x-ms-version": "2026-10-06",
    "x-ms-date": "Tue, 01 Dec 2026 17:00:00 GMT",
    "x-ms-range": "bytes=4096-73727",
    "If-Match": '"0x8DC123456789ABC"',
    "Authorization": "SharedKey devstoreaccount1:c2lnbmF0dXJl",
}


def test_the_same_bytes_as_http_client_and_the_connection_stays_usable(
    server: Recorder,
) -> None:
    conn = connection(server.port)
    target = "/devstoreaccount1/bench/A/big%20file.bin?comp=x"
    conn.request("GET", target, headers=HEADERS)
    first = conn.getresponse()
    assert first.read() == b"ok"
    resp = exchange(conn, "GET", target, f"127.0.0.1:{server.port}", HEADERS)
    assert resp.status == 200 and resp.read() == b"ok" and resp.isclosed()
    conn.request("HEAD", target, headers=HEADERS)  # http.client again, after exchange
    assert conn.getresponse().status == 200
    conn.close()
    assert server.requests[0] == server.requests[1]
    assert server.requests[1].startswith(
        f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode()
    )


def test_an_answer_that_closes_closes_the_connection(server: Recorder) -> None:
    server.close_after = True
    conn = connection(server.port)
    resp = exchange(conn, "GET", "/x", "h", {})
    assert resp.will_close and conn.sock is None
    assert resp.read() == b"ok"


def test_what_http_client_refuses_is_refused(server: Recorder) -> None:
    conn = connection(server.port)
    with pytest.raises(http.client.InvalidURL):
        exchange(conn, "GET", "/a b", "h", {})
    with pytest.raises(ValueError):
        exchange(conn, "GET", "/a", "h", {"x-ms-meta": "a\r\nInjected: 1"})
    conn.close()
    assert server.requests == []


def test_host_header_as_http_client_writes_it() -> None:
    assert host_header("example.com", 443, 443) == "example.com"
    assert host_header("127.0.0.1", 10000, 443) == "127.0.0.1:10000"
    assert host_header("::1", 80, 80) == "[::1]"
