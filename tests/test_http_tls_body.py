"""http_response.read_body_from_socket over TLS: the body read record by record
through the C `_SSLSocket.read` lands whole and in order, the response closes as
after its own read, and a server that drops the connection mid-body without a
TLS close_notify (a ragged EOF) is a short body (IncompleteRead), as before."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from azurite import Certs, make_certs
from datamount.storage.http_response import read_body_from_socket

pytestmark = pytest.mark.unit

BODY = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4: many 16 KiB records


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(Path(tmp_path_factory.mktemp("tls")))


def serve(certs: Certs, body: bytes, length: int) -> tuple[int, threading.Thread]:
    """One TLS connection answering one request with `length` in Content-Length
    and `body` as the bytes sent, then closing the TCP socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.cert, certs.key)

    def run() -> None:
        with listener:
            raw, _ = listener.accept()
            conn = ctx.wrap_socket(raw, server_side=True)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + body)
            raw.close()  # no close_notify: a short body ends in a ragged EOF

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.fixture
def client(certs: Certs) -> Iterator[ssl.SSLContext]:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    yield ctx


def fetch(ctx: ssl.SSLContext, port: int, size: int) -> tuple[http.client.HTTPResponse, bytearray]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    conn.request("GET", "/blob")
    resp = conn.getresponse()
    view = bytearray(size)
    read_body_from_socket(conn.sock, resp, memoryview(view))
    return resp, view


def test_a_tls_body_is_read_whole_and_the_response_closes(
    certs: Certs, client: ssl.SSLContext
) -> None:
    port, thread = serve(certs, BODY, len(BODY))
    resp, got = fetch(client, port, len(BODY))
    assert bytes(got) == BODY
    assert resp.isclosed()
    thread.join(10)


def test_a_ragged_tls_eof_mid_body_is_a_short_body(certs: Certs, client: ssl.SSLContext) -> None:
    port, thread = serve(certs, BODY[: len(BODY) // 2], len(BODY))
    with pytest.raises(http.client.IncompleteRead):
        fetch(client, port, len(BODY))
    thread.join(10)
