"""The raw request path of AzureBlobStore (azure_raw): on a real Azurite for
credentials and request counts, and on a stub HTTP server in a thread for
what Azurite never does (connections reset mid-body, 503 with Retry-After, a
server that stalls after its headers, idle connections closed).
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import http.server
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from azure.storage.blob import ContainerClient, ContainerSasPermissions, generate_container_sas

from azurite import ACCOUNT, KEY, Azurite
from datamount.errors import AccessDenied, StorageError, VersionChanged
from datamount.storage import _httpget, open_store
from datamount.storage.azure_blob import AzureBlobStore
from datamount.storage.base import ObjectInfo
from datamount.storage.credentials import Credential, CredentialKind
from datamount.storage.http import HttpStore
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy

WRONG_KEY = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3Jvbmc="
SIZE = 1_000_003
DATA = random.Random(11).randbytes(SIZE)


def fast_retry(retries: int = 2) -> RetryPolicy:
    return RetryPolicy(retries=retries, sleep=lambda s: None)


def buffer(n: int) -> memoryview:
    return memoryview(bytearray(n))


# -- on Azurite ---------------------------------------------------------------


def key_store(az: Azurite, container: ContainerClient, key: str = KEY, **kw: Any) -> AzureBlobStore:
    return AzureBlobStore(
        az.endpoint,
        container.container_name,
        Credential.account_key(key),
        account=az.account,
        retry=kw.pop("retry", fast_retry()),
        **kw,
    )


class Requests:
    """The raw path's requests, from its hook."""

    def __init__(self, store: AzureBlobStore) -> None:
        self.seen: list[tuple[str, str | None, int]] = []
        store.raw.hooks.append(self)

    def __call__(self, method: str, path: str, headers: dict[str, str], status: int) -> None:
        self.seen.append((method, headers.get("x-ms-range"), status))


@pytest.mark.azurite
def test_each_read_into_is_one_bounded_request(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("r/blob", DATA)
    store = key_store(azurite, container)
    etag = store.stat("r/blob").etag
    seen = Requests(store)
    buf = buffer(1 << 16)
    assert store.read_into("r/blob", 333, buf, etag=etag) == 1 << 16
    assert buf == DATA[333 : 333 + (1 << 16)]
    assert store.read_into("r/blob", SIZE - 100, buf) == 100
    assert buf[:100] == DATA[-100:]
    assert store.read_into("r/blob", SIZE, buf) == 0
    # Azure answers the last one 416; Azurite an empty 206. Both mean 0 bytes.
    assert [(m, r) for m, r, _ in seen.seen] == [
        ("GET", f"bytes=333-{333 + (1 << 16) - 1}"),
        ("GET", f"bytes={SIZE - 100}-{SIZE - 100 + (1 << 16) - 1}"),
        ("GET", f"bytes={SIZE}-{SIZE + (1 << 16) - 1}"),
    ]
    store.close()


@pytest.mark.azurite
@pytest.mark.parametrize("tls", [False, True])
def test_read_into_views_reads_the_body_from_the_socket_and_keeps_the_connection(
    request: pytest.FixtureRequest, tls: bool
) -> None:
    az = request.getfixturevalue("azurite_https" if tls else "azurite")
    container = az.create_container("views-tls" if tls else "views")
    container.upload_blob("v/blob", DATA)
    store = AzureBlobStore(
        az.endpoint, container.container_name, Credential.account_key(az.key),
        account=az.account, retry=fast_retry(), ca_bundle=az.tls.ca if az.tls else None,
    )  # fmt: skip
    seen = Requests(store)
    for offset in (0, 1, SIZE - 70_000):
        views = [buffer(65_536), buffer(3), buffer(100_000)]
        n = store.read_into_views("v/blob", offset, views)
        assert n == min(165_539, SIZE - offset)
        assert b"".join(views)[:n] == DATA[offset : offset + n]
    assert len(seen.seen) == 3
    assert len(store.raw.pool._idle) == 1  # each response read to its end: one connection
    store.close()
    container.delete_container()


@pytest.mark.azurite
def test_wrong_key_read_into_is_access_denied_at_once(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("secret/blob", b"x" * 10)
    store = key_store(azurite, container, WRONG_KEY)
    seen = Requests(store)
    with pytest.raises(AccessDenied) as info:
        store.read_into("secret/blob", 0, buffer(5))
    assert (info.value.errno, info.value.status) == (errno.EACCES, 403)
    text = f"{info.value} {info.value!r} {info.value.args}"
    assert WRONG_KEY not in text and WRONG_KEY[:20] not in text and "secret/blob" in text
    assert len(seen.seen) == 1  # permanent: not repeated
    store.close()


@pytest.mark.azurite
def test_sas_read_into_and_put(azurite: Azurite, container: ContainerClient) -> None:
    sas = generate_container_sas(
        azurite.account,
        container.container_name,
        account_key=azurite.key,
        permission=ContainerSasPermissions(read=True, write=True),
        expiry=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
    )
    location = StorageLocation(
        StorageKind.BLOB,
        "s/blob",
        account=azurite.account,
        container=container.container_name,
        endpoint=azurite.endpoint,
        credential=Credential.sas(sas),
    )
    store = open_store(location, retry=fast_retry(), read_timeout=7.5)
    assert isinstance(store, AzureBlobStore) and store.read_timeout == 7.5
    info = store.put("s/blob", DATA[:5000], metadata={"kind": "test"})
    buf = buffer(3000)
    assert store.read_into("s/blob", 4000, buf, etag=info.etag) == 1000
    assert buf[:1000] == DATA[4000:5000]
    props = container.get_blob_client("s/blob").get_blob_properties()
    assert props.metadata == {"kind": "test"} and f'"{props.etag}"'.strip('"') in info.etag
    with pytest.raises(VersionChanged):
        store.read_into("s/blob", 0, buf, etag='"0x1"')
    store.close()


@pytest.mark.azurite
def test_large_put_and_blocks_are_sent_whole(azurite: Azurite, container: ContainerClient) -> None:
    store = key_store(azurite, container)
    big = random.Random(2).randbytes(3 * (1 << 20) + 5)  # several send slices
    info = store.put("big/put", big)
    assert info.size == len(big) and store.read("big/put", 0, len(big)) == big
    store.stage_block("big/blocks", "b1", big)
    store.stage_block("big/blocks", "b2", memoryview(big)[:7])  # type: ignore[arg-type]
    assert store.commit_blocks("big/blocks", ["b1", "b2"]).size == len(big) + 7
    assert container.download_blob("big/blocks").readall() == big + big[:7]
    store.close()


@pytest.mark.azurite
def test_anonymous_read_into_of_a_public_container(azurite: Azurite) -> None:
    container = azurite.create_container()
    container.set_container_access_policy({}, public_access="blob")
    container.upload_blob("pub/blob", DATA[:777])
    store = AzureBlobStore(azurite.endpoint, container.container_name, retry=fast_retry())
    buf = buffer(1000)
    assert store.read_into("pub/blob", 7, buf) == 770 and buf[:770] == DATA[7:777]
    store.close()
    container.delete_container()


@pytest.mark.unit
def test_a_token_is_never_sent_over_http(stub: tuple[Stub, str]) -> None:
    state, root = stub
    managed = Credential(CredentialKind.MANAGED_IDENTITY, client_id="1")
    with pytest.raises(AccessDenied) as info:
        AzureBlobStore(f"{root}/{ACCOUNT}", "c", managed, retry=fast_retry())
    assert "https" in str(info.value)
    assert state.ranges == []  # refused before any request


@pytest.mark.unit
def test_a_server_ignoring_the_range(stub: tuple[Stub, str]) -> None:
    state, root = stub
    state.script = ["norange", "norange"]
    store = stub_store(root, retry=fast_retry())
    with pytest.raises(StorageError) as info:
        store.read_into("b", 5, buffer(10))  # a 200 with the whole object
    assert "ignored the range" in str(info.value) and not info.value.transient
    whole = buffer(SIZE + 10)
    assert store.read_into("b", 0, whole) == SIZE and whole[:SIZE] == DATA
    assert len(state.ranges) == 2
    store.close()


# -- a stub blob service that misbehaves on command ---------------------------


@dataclass
class Stub:
    """Serves DATA at any path, honouring x-ms-range; `script` says how the
    next requests misbehave: 'reset' (half the body, then a TCP reset),
    'busy' (503 + Retry-After), 'stall' (headers, then nothing), 'drop'
    (answer, then close the connection without saying so), 'norange' (200
    with the whole object)."""

    script: list[str] = field(default_factory=list)
    ranges: list[str | None] = field(default_factory=list)
    connections: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_action(self) -> str:
        with self.lock:
            return self.script.pop(0) if self.script else "ok"


def make_handler(stub: Stub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            with stub.lock:
                stub.connections += 1

        def log_message(self, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:  # stat: stalls before any header
            stub.ranges.append(None)
            if stub.next_action() == "stall":
                stub.release.wait(10)
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("Content-Length", str(SIZE))
            self.send_header("ETag", '"v1"')
            self.end_headers()

        def do_DELETE(self) -> None:  # an SDK operation: stalls before any header
            stub.ranges.append(None)
            if stub.next_action() == "stall":
                stub.release.wait(10)
                self.close_connection = True
                return
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            spec = self.headers.get("x-ms-range") or self.headers.get("Range")
            stub.ranges.append(spec)
            action = stub.next_action()
            if action == "busy":
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("x-ms-error-code", "ServerBusy")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if action == "norange":
                self.send_response(200)
                self.send_header("Content-Length", str(SIZE))
                self.end_headers()
                self.wfile.write(DATA)
                return
            assert spec is not None
            first, last = (int(x) for x in spec.removeprefix("bytes=").split("-"))
            body = DATA[first : last + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{first + len(body) - 1}/{SIZE}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", '"v1"')
            self.end_headers()
            if action == "stall":
                self.wfile.flush()
                stub.release.wait(10)
                self.close_connection = True
                return
            if action == "reset":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()  # RST, not FIN
                self.close_connection = True
                return
            self.wfile.write(body)
            if action == "drop":
                self.close_connection = True

    return Handler


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # resets and clients gone after a timeout: expected here


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    state = Stub()
    server = QuietServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    state.release.set()
    server.shutdown()
    server.server_close()


def stub_store(root: str, **kw: Any) -> AzureBlobStore:
    return AzureBlobStore(
        f"{root}/{ACCOUNT}", "c", Credential.account_key(KEY), account=ACCOUNT, **kw
    )


@pytest.mark.unit
def test_a_reset_mid_body_is_retried_whole(stub: tuple[Stub, str]) -> None:
    state, root = stub
    state.script = ["reset", "reset"]
    policy = fast_retry(3)
    store = stub_store(root, retry=policy)
    buf = buffer(300_000)
    assert store.read_into("b", 1234, buf) == len(buf)
    assert buf == DATA[1234 : 1234 + len(buf)]
    assert state.ranges == [f"bytes=1234-{1234 + len(buf) - 1}"] * 3  # the whole range each time
    assert policy.stats.retries == 2
    assert store.read("b", 10, 20) == DATA[10:30]
    store.close()


@pytest.mark.unit
def test_read_into_views_is_one_request_and_a_reset_refills_every_buffer(
    stub: tuple[Stub, str],
) -> None:
    state, root = stub
    state.script = ["reset"]
    policy = fast_retry(3)
    store = stub_store(root, retry=policy)
    views = [buffer(100_000), buffer(1), buffer(150_000)]
    assert store.read_into_views("b", 77, views) == 250_001
    assert b"".join(views) == DATA[77 : 77 + 250_001]
    assert state.ranges == [f"bytes=77-{77 + 250_001 - 1}"] * 2  # one GET, retried whole
    assert policy.stats.retries == 1
    store.close()


@pytest.mark.unit
def test_503_with_retry_after_is_retried(stub: tuple[Stub, str]) -> None:
    state, root = stub
    state.script = ["busy", "busy"]
    delays: list[float] = []
    policy = RetryPolicy(retries=3, sleep=delays.append)
    store = stub_store(root, retry=policy)
    buf = buffer(1000)
    assert store.read_into("b", 5, buf) == 1000 and buf == DATA[5:1005]
    assert len(state.ranges) == 3 and len(delays) == 2 and min(delays) >= 1.0
    assert policy.stats.throttled == 2
    store.close()


@pytest.mark.slow  # waits out read timeouts (0.5 s an attempt)
def test_a_stalled_body_times_out_retries_then_fails(stub: tuple[Stub, str]) -> None:
    state, root = stub
    state.script = ["stall"] * 3
    policy = RetryPolicy(retries=2, base_delay=0.01)
    store = stub_store(root, retry=policy, read_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.read_into("b", 0, buffer(100_000))
    elapsed = time.monotonic() - started
    assert 1.4 < elapsed < 5.0  # three attempts of 0.5 s each, nothing longer
    err = info.value
    assert err.errno == errno.EIO and not err.transient
    assert "timed out" in str(err) and "gave up after 2 retries" in str(err)
    assert len(state.ranges) == 3 and policy.stats.exhausted == 1
    store.close()


@pytest.mark.slow  # waits out read timeouts (0.5 s an attempt)
@pytest.mark.parametrize("op", ["stat", "delete"])  # the raw path's HEAD, the SDK's DELETE
def test_both_paths_have_the_same_stall_timeout(stub: tuple[Stub, str], op: str) -> None:
    state, root = stub
    state.script = ["stall"] * 2
    store = stub_store(root, retry=RetryPolicy(retries=1, base_delay=0.01), read_timeout=0.5)
    call = getattr(store, op)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        call("b")
    assert 0.9 < time.monotonic() - started < 4.0
    assert info.value.errno == errno.EIO and "timed out" in str(info.value)
    call("b")
    assert len(state.ranges) == 3
    if op == "stat":
        assert store.stat("b") == ObjectInfo("b", SIZE, '"v1"', None)
    store.close()


@pytest.mark.slow  # waits out read timeouts (0.5 s an attempt)
def test_http_store_stall_times_out_too(stub: tuple[Stub, str]) -> None:
    state, root = stub
    state.script = ["stall"] * 2
    store = HttpStore(root, retry=RetryPolicy(retries=1, base_delay=0.01), read_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.read_into("b", 0, buffer(100_000))
    assert time.monotonic() - started < 4.0
    assert info.value.errno == errno.EIO and not info.value.transient
    buf = buffer(10)
    assert store.read_into("b", 3, buf) == 10 and buf == DATA[3:13]
    store.close()


@pytest.mark.unit
def test_connections_are_kept_alive_and_dropped_ones_replaced(stub: tuple[Stub, str]) -> None:
    state, root = stub
    policy = fast_retry(0)  # a stale connection must not cost a retry
    store = stub_store(root, retry=policy)
    buf = buffer(4096)
    for i in range(20):
        assert store.read_into("b", i, buf) == 4096 and buf == DATA[i : i + 4096]
    assert state.connections == 1  # one thread: one keep-alive connection
    state.script = ["drop"]  # answers, then closes the idle connection
    assert store.read_into("b", 1, buf) == 4096
    time.sleep(0.1)  # the FIN arrives while the connection sits in the pool
    assert store.read_into("b", 2, buf) == 4096 and buf == DATA[2:4098]
    assert state.connections == 2 and policy.stats.retries == 0
    store.close()


@pytest.mark.unit
def test_threads_share_the_pool(stub: tuple[Stub, str]) -> None:
    state, root = stub
    store = stub_store(root, retry=fast_retry(), pool_size=4)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        buf = buffer(50_000)
        try:
            for _ in range(25):
                offset = rng.randrange(SIZE)
                n = store.read_into("b", offset, buf)
                assert buf[:n] == DATA[offset : offset + n]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(state.ranges) == 100
    assert state.connections <= 4
    store.close()


# -- read_span: one GET for many pieces of the caller's buffer ------------------


class Pieces:
    """A read_span sink: what reached it, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes]] = []

    def __call__(self, view: memoryview, pos: int) -> None:
        self.seen.append((pos, bytes(view)))

    def joined(self, start: int) -> bytes:
        out = b""
        for pos, data in self.seen:
            assert pos == start + len(out)  # contiguous: no piece twice, none missing
            out += data
        return out


@pytest.mark.azurite
def test_read_span_is_one_request_read_through_the_buffer(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("s/blob", DATA)
    store = key_store(azurite, container)
    etag = store.stat("s/blob").etag
    seen = Requests(store)
    sink = Pieces()
    assert store.read_span("s/blob", 333, 300_000, buffer(1 << 16), sink, etag=etag) == 300_000
    assert [len(d) for _, d in sink.seen] == [1 << 16] * 4 + [300_000 - 4 * (1 << 16)]
    assert sink.joined(333) == DATA[333 : 333 + 300_000]
    assert [(m, r) for m, r, _ in seen.seen] == [("GET", f"bytes=333-{333 + 300_000 - 1}")]
    tail = Pieces()  # past the end: short, still one request
    assert store.read_span("s/blob", SIZE - 100, 5000, buffer(64), tail) == 100
    assert tail.joined(SIZE - 100) == DATA[-100:]
    assert len(seen.seen) == 2
    store.close()


@pytest.mark.unit
def test_read_span_retry_asks_only_for_what_the_sink_has_not_had(
    stub: tuple[Stub, str],
) -> None:
    state, root = stub
    state.script = ["reset"]  # half the body, then a TCP reset
    policy = fast_retry(3)
    store = stub_store(root, retry=policy)
    sink = Pieces()
    assert store.read_span("b", 1234, 300_000, buffer(50_000), sink) == 300_000
    assert sink.joined(1234) == DATA[1234 : 1234 + 300_000]
    assert policy.stats.retries == 1 and len(state.ranges) == 2
    first, second = state.ranges
    assert first == f"bytes=1234-{1234 + 300_000 - 1}"
    start = int(second.removeprefix("bytes=").split("-")[0])  # type: ignore[union-attr]
    assert (start - 1234) % 50_000 == 0 and 1234 <= start <= 1234 + 150_000
    assert second == f"bytes={start}-{1234 + 300_000 - 1}"
    store.close()


@pytest.mark.unit
def test_read_span_sink_errors_are_raised_unchanged_and_not_retried(
    stub: tuple[Stub, str],
) -> None:
    state, root = stub
    policy = fast_retry(3)
    store = stub_store(root, retry=policy)

    def full(view: memoryview, pos: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as info:
        store.read_span("b", 0, 200_000, buffer(50_000), full)
    assert type(info.value) is OSError and info.value.errno == errno.ENOSPC
    assert len(state.ranges) == 1 and policy.stats.retries == 0
    assert store.read("b", 10, 20) == DATA[10:30]  # the pool is still usable
    store.close()


@pytest.mark.azurite
def test_the_native_and_the_python_get_agree_and_a_refused_socket_falls_back(
    azurite_https: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTPS: reads into views, spans and a changed version's 412 give
    the same bytes, requests and errors by the native GET and by Python; a
    connection the native side refuses (not the ssl module's own object) is
    read in Python, nothing sent twice, and the pool stops trying."""
    az = azurite_https
    container = az.create_container("both-paths")
    container.upload_blob("p/blob", DATA)
    results = {}
    for native in (True, False):
        store = AzureBlobStore(
            az.endpoint, container.container_name, Credential.account_key(az.key),
            account=az.account, retry=fast_retry(), ca_bundle=az.tls.ca if az.tls else None,
        )  # fmt: skip
        store.raw.pool.native = native
        seen = Requests(store)
        etag = store.stat("p/blob").etag
        views = [buffer(70_000), buffer(5)]
        n = store.read_into_views("p/blob", 11, views, etag=etag)
        pieces: list[tuple[int, bytes]] = []
        sink = functools.partial(lambda got, v, p: got.append((p, bytes(v))), pieces)
        span = store.read_span("p/blob", 5, SIZE - 5, buffer(300_000), sink, etag=etag)
        with pytest.raises(VersionChanged):
            store.read_into("p/blob", 0, buffer(10), etag='"0x8D000000000000"')
        results[native] = (n, b"".join(views), span, pieces, seen.seen)
        assert store.raw.pool.native == native
        store.close()
    assert results[True] == results[False]
    n, data, span, pieces, seen = results[True]
    assert (n, data) == (70_005, DATA[11:70_016])
    assert span == SIZE - 5 and b"".join(p for _, p in pieces) == DATA[5:]
    assert [p for p, _ in pieces] == list(range(5, SIZE, 300_000))
    assert [s for _, _, s in seen] == [200, 206, 206, 412]  # HEAD, GET, span, changed

    monkeypatch.setattr(_httpget, "get_into", lambda *a: (_httpget.NOT_TLS_OBJECT, 0, 0, 0, None))
    store = AzureBlobStore(
        az.endpoint, container.container_name, Credential.account_key(az.key),
        account=az.account, retry=fast_retry(), ca_bundle=az.tls.ca if az.tls else None,
    )  # fmt: skip
    seen = Requests(store)
    view = buffer(1000)
    assert store.read_into("p/blob", 7, view) == 1000 and view == DATA[7:1007]
    assert store.raw.pool.native is False and len(seen.seen) == 1
    store.close()
    container.delete_container()
