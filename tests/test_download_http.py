"""The response class of the download's request path (storage.http_response):
headers read without email.parser, answering as http.client's message does."""

from __future__ import annotations

import http.client
import io

import pytest

from datamount.storage.http_response import Response, read_headers

pytestmark = pytest.mark.unit

ANSWER = (
    b"HTTP/1.1 206 Partial Content\r\n"
    b"Content-Range: bytes 0-4/10\r\n"
    b"content-length: 5\r\n"
    b'ETag: "0x1"\r\n'
    b"x-ms-meta-a: one\r\n"
    b"X-MS-META-A: two\r\n"
    b"x-folded: first\r\n\t second\r\n"
    b"\r\n"
    b"hello"
)


class FakeSock:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.raw))  # type: ignore[arg-type]


def both(raw: bytes, method: str = "GET") -> tuple[http.client.HTTPResponse, Response]:
    stdlib = http.client.HTTPResponse(FakeSock(raw), method=method)  # type: ignore[arg-type]
    ours = Response(FakeSock(raw), method=method)  # type: ignore[arg-type]
    stdlib.begin()
    ours.begin()
    return stdlib, ours


@pytest.mark.parametrize(
    "raw",
    [
        ANSWER,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 100 Continue\r\nX-A: b\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\n\r\nhello",  # no length: read to the close
    ],
)
def test_framing_and_headers_match_http_client(raw: bytes) -> None:
    stdlib, ours = both(raw)
    for attr in ("status", "reason", "version", "chunked", "length", "will_close"):
        assert getattr(ours, attr) == getattr(stdlib, attr), attr
    assert ours.getheaders() == stdlib.getheaders()
    for name in ("content-range", "ETAG", "x-ms-meta-a", "x-folded", "missing"):
        assert ours.getheader(name) == stdlib.getheader(name), name
    assert ours.read() == stdlib.read() == b"hello"


def test_head_has_no_body() -> None:
    stdlib, ours = both(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", method="HEAD")
    assert ours.length == stdlib.length == 0
    assert ours.read() == b""


def test_header_lookups_are_case_insensitive_first_value_wins() -> None:
    headers = read_headers(io.BufferedReader(io.BytesIO(ANSWER.split(b"\r\n", 1)[1])))  # type: ignore[arg-type]
    assert headers.get("x-ms-meta-a") == headers["X-Ms-Meta-A"] == "one"
    assert headers.get_all("x-ms-meta-a") == ["one", "two"]
    assert "etag" in headers and "nope" not in headers
    assert headers.get("nope", "d") == "d"
    assert headers.get("x-folded") == "first\r\n\t second"  # as email.parser keeps it


def test_limits_are_http_clients() -> None:
    long_line = b"X: " + b"a" * 70_000 + b"\r\n\r\n"
    with pytest.raises(http.client.LineTooLong):
        read_headers(io.BufferedReader(io.BytesIO(long_line)))  # type: ignore[arg-type]
    many = b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n"
    with pytest.raises(http.client.HTTPException):
        read_headers(io.BufferedReader(io.BytesIO(many)))  # type: ignore[arg-type]
