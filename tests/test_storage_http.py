"""HttpStore against a tiny local http.server: with Range support, without
it, and without ETags."""

from __future__ import annotations

import email.utils
import errno
import http.server
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from datamount.errors import ObjectNotFound, StorageError, VersionChanged
from datamount.storage import open_store
from datamount.storage.http import HttpStore
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy

pytestmark = pytest.mark.unit

SIZE = 300_007
DATA = random.Random(3).randbytes(SIZE)


@dataclass
class Site:
    """What the server serves and how it behaves."""

    files: dict[str, bytes] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    ranges: bool = True
    etags: bool = True
    fail_next: int = 0  # answer this many requests with 503 first
    overlong: bool = False  # a 206 one byte longer than the range asked
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    clients: set[tuple[str, int]] = field(default_factory=set)  # one per connection

    def publish(self, path: str, data: bytes) -> None:
        self.files[path] = data
        self.versions[path] = self.versions.get(path, 0) + 1


def make_handler(site: Site) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _headers(self, path: str) -> dict[str, str]:
            version = site.versions[path]
            headers = {
                "Last-Modified": email.utils.formatdate(1_700_000_000 + version, usegmt=True)
            }
            if site.etags:
                headers["ETag"] = f'"v{version}"'
            if site.ranges:
                headers["Accept-Ranges"] = "bytes"
            return headers

        def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            site.requests.append((self.command, self.path, self.headers.get("Range")))
            site.clients.add(self.client_address)
            if site.fail_next > 0:
                site.fail_next -= 1
                self._send(503, {"Retry-After": "1"})
                return
            if path not in site.files:
                self._send(404, {})
                return
            data, headers = site.files[path], self._headers(path)
            match = self.headers.get("If-Match")
            if match and match != headers.get("ETag"):
                self._send(412, {})
                return
            spec = self.headers.get("Range")
            if not (site.ranges and spec and self.command == "GET"):
                self._send(200, headers, data)
                return
            first, last = (int(x) for x in spec.removeprefix("bytes=").split("-"))
            if first >= len(data):
                self._send(416, {"Content-Range": f"bytes */{len(data)}"})
                return
            last = min(last, len(data) - 1)
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            self._send(206, headers, data[first : last + 1 + site.overlong])

    return Handler


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that stops reading a 200 it asked a range of: expected


@pytest.fixture
def site() -> Iterator[tuple[Site, str]]:
    site = Site()
    site.publish("/files/data.bin", DATA)
    site.publish("/files/empty", b"")
    server = QuietServer(("127.0.0.1", 0), make_handler(site))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield site, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def store_for(root: str, retries: int = 2) -> HttpStore:
    return HttpStore(root, retry=RetryPolicy(retries=retries, sleep=lambda s: None))


RANGES = [(0, 1), (1, 7), (4095, 4097), (123_456, 65_537), (SIZE - 5, 100), (SIZE, 10), (0, SIZE)]


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_stat_and_ranged_reads_equal_slices(site: tuple[Site, str], ranges: bool) -> None:
    s, root = site
    s.ranges = ranges
    store = store_for(root)
    info = store.stat("files/data.bin")
    assert (info.key, info.size, info.etag) == ("files/data.bin", SIZE, '"v1"')
    assert info.last_modified == 1_700_000_001
    s.requests.clear()
    for offset, length in RANGES:
        got = store.read("files/data.bin", offset, length, etag=info.etag)
        assert got == DATA[offset : offset + length]
    assert len(s.requests) == len(RANGES)  # one request per read
    assert all(r[2] and not r[2].endswith("-") for r in s.requests)  # bounded ranges
    assert store.supports_ranges is ranges
    store.close()


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_read_into_fills_the_buffer_with_the_slice_on_one_kept_connection(
    site: tuple[Site, str], ranges: bool
) -> None:
    s, root = site
    s.ranges = ranges
    store = store_for(root)
    info = store.stat("files/data.bin")
    s.requests.clear()
    s.clients.clear()
    for offset, length in RANGES:
        buffer = memoryview(bytearray(b"\xee" * (length + 3)))[:length]
        n = store.read_into("files/data.bin", offset, buffer, etag=info.etag)
        assert bytes(buffer[:n]) == DATA[offset : offset + length]
        assert n == len(DATA[offset : offset + length])
    assert len(s.requests) == len(RANGES)
    if ranges:  # each body (the 416's too) read to its end: one connection kept throughout
        assert len(s.clients) == 1
    store.close()


def test_an_answer_longer_than_the_range_is_a_transient_error(site: tuple[Site, str]) -> None:
    s, root = site
    store = store_for(root, retries=1)
    s.overlong = True
    with pytest.raises(StorageError, match="longer answer than the range asked") as exc:
        store.read_into("files/data.bin", 10, memoryview(bytearray(100)))
    assert exc.value.errno == errno.EIO
    assert len(s.requests) == 2  # transient: retried once
    store.close()


def test_zero_byte_file(site: tuple[Site, str]) -> None:
    store = store_for(site[1])
    assert store.stat("files/empty").size == 0
    assert store.read("files/empty", 0, 10) == b""


def test_missing_file_is_enoent_without_query(site: tuple[Site, str]) -> None:
    store = store_for(site[1])
    for call in (
        lambda: store.stat("files/nope.bin?sig=SECRET"),
        lambda: store.read("files/nope.bin?sig=SECRET", 0, 10),
    ):
        with pytest.raises(ObjectNotFound) as info:
            call()
        assert info.value.errno == errno.ENOENT
        assert "files/nope.bin" in str(info.value) and "SECRET" not in str(info.value)
    assert site[0].requests[-1][0] == "GET"  # no retries on 404: HEAD, then GET
    assert len(site[0].requests) == 2


@pytest.mark.parametrize("etags", [True, False], ids=["etag", "last-modified"])
def test_pinned_read_of_a_changed_file_is_estale(site: tuple[Site, str], etags: bool) -> None:
    s, root = site
    s.etags = etags
    store = store_for(root)
    old = store.stat("files/data.bin")
    s.publish("/files/data.bin", DATA[::-1])
    with pytest.raises(VersionChanged) as info:
        store.read("files/data.bin", 0, 10, etag=old.etag)
    assert info.value.errno == errno.ESTALE
    new = store.stat("files/data.bin")
    assert new.etag != old.etag
    assert store.read("files/data.bin", 0, 10, etag=new.etag) == DATA[::-1][:10]


def test_transient_503_is_retried(site: tuple[Site, str]) -> None:
    s, root = site
    s.fail_next = 2
    delays: list[float] = []
    store = HttpStore(root, retry=RetryPolicy(retries=3, sleep=delays.append))
    assert store.read("files/data.bin", 10, 5) == DATA[10:15]
    assert len(s.requests) == 3 and len(delays) == 2 and min(delays) >= 1.0


def test_listing_is_the_one_file(site: tuple[Site, str]) -> None:
    store = store_for(site[1])
    pages = list(store.list_pages("files/data.bin"))
    assert [[o.key for o in p.objects] for p in pages] == [["files/data.bin"]]
    assert [p.objects for p in store.list_pages("files/missing")] == [[]]


def test_writes_are_refused(site: tuple[Site, str]) -> None:
    store = store_for(site[1])
    for call in (
        lambda: store.put("files/x", b"x"),
        lambda: store.stage_block("files/x", "0001", b"x"),
        lambda: store.commit_blocks("files/x", ["0001"]),
        lambda: store.delete("files/data.bin"),
        lambda: store.copy("files/data.bin", "files/y"),
    ):
        with pytest.raises(StorageError) as info:
            call()
        assert info.value.errno == errno.EROFS
    assert site[0].requests == []


def test_open_store_for_an_http_location(site: tuple[Site, str]) -> None:
    location = StorageLocation(StorageKind.HTTP, f"{site[1]}/files/data.bin")
    store = open_store(location, retry=RetryPolicy(retries=0))
    assert isinstance(store, HttpStore)
    assert store.read(location.key, 7, 3) == DATA[7:10]
    store.close()
