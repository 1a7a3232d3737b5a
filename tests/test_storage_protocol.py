"""One ObjectStore suite, run over MemoryStore, LocalStore, FaultyStore (over a
MemoryStore) and AzureBlobStore (on Azurite, over HTTP and over HTTPS with the
harness's throwaway CA passed as the store's CA bundle): every read, and every read_into,
is compared with a slice of the source bytes. The declared capabilities
(stream_into, supports_ranges, local_path, refused writes) are checked over
every store, the read-only ones (HttpStore with and without ranges,
FileListStore) too."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datamount.errors import (
    BadRequest,
    ObjectNotFound,
    ReadOnlyError,
    StorageError,
    VersionChanged,
)
from datamount.storage import ObjectStore, ReadableStore
from datamount.storage import base as storage_base
from datamount.storage.azure_blob import AzureBlobStore
from datamount.storage.base import STREAM_RANGE, ListPage, ReadOnlyStore
from datamount.storage.credentials import Credential
from datamount.storage.filelist import FileListStore, ListedFile
from datamount.storage.http import HttpStore
from datamount.storage.local import LocalStore
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy
from faults import FaultyStore
from test_storage_http import QuietServer, Site, make_handler

SIZE = 100_003  # odd on purpose: no range lines up with a power of two
SOURCE = random.Random(7).randbytes(SIZE)
ODD_RANGES = [
    (0, 1),
    (1, 7),
    (4095, 4097),
    (12_345, 54_321),
    (SIZE - 10, 10),
    (SIZE - 10, 100),  # runs past the end
    (SIZE - 1, 1),
    (SIZE, 5),  # at the end
    (SIZE + 1000, 5),  # after it
    (0, SIZE + 1),
    (77, 0),
]
ODD_NAMES = [
    "dir with space/file name.txt",
    "naïve/日本語 ファイル.bin",
    "hash#tag/50%off %20 %2F.dat",
    "top/plus+and&amp=eq;semi,comma'quote!(x) ~.bin",
]


def fast_retry() -> RetryPolicy:
    return RetryPolicy(retries=2, sleep=lambda s: None)


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.unit),
        pytest.param("local", marks=pytest.mark.unit),
        pytest.param("faulty", marks=pytest.mark.unit),
        pytest.param("azure", marks=pytest.mark.azurite),
        pytest.param("azure_https", marks=pytest.mark.azurite),
    ],
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    s = make_store(request.param, request, tmp_path)
    yield s
    s.close()


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    s: ObjectStore
    if kind == "memory":
        s = MemoryStore(page_size=3)  # small pages: listings cross pages
    elif kind == "faulty":  # no faults planned: it must be transparent
        s = FaultyStore(MemoryStore(page_size=3), retry=fast_retry())
    elif kind == "local":
        s = LocalStore(tmp_path / "root", page_size=3)
        (tmp_path / "root").mkdir()
    else:
        az = request.getfixturevalue("azurite" if kind == "azure" else "azurite_https")
        container = az.create_container(f"p{uuid.uuid4().hex[:24]}")
        request.addfinalizer(container.delete_container)
        s = AzureBlobStore(
            az.endpoint,
            container.container_name,
            Credential.account_key(az.key),
            account=az.account,
            retry=fast_retry(),
            ca_bundle=az.tls.ca if az.tls else None,
        )
    return s


def keys(pages: Iterator[ListPage]) -> tuple[list[str], list[str]]:
    objects: list[str] = []
    prefixes: list[str] = []
    for page in pages:
        objects += [o.key for o in page.objects]
        prefixes += page.prefixes
    return objects, prefixes


FILL = 0xA5  # read_into must leave the rest of a buffer as it was


def read_via_buffer(
    store: ObjectStore, key: str, offset: int, length: int, etag: str | None = None
) -> bytes:
    """read_into a buffer with a margin on both sides; check the margins and
    that the count is what was written."""
    raw = bytearray([FILL]) * (length + 32)
    n = store.read_into(key, offset, memoryview(raw)[16 : 16 + length], etag=etag)
    assert 0 <= n <= length
    assert raw[:16] == bytes([FILL]) * 16
    assert raw[16 + n :] == bytes([FILL]) * (length - n + 16)
    return bytes(raw[16 : 16 + n])


def test_put_stat_and_odd_ranges_equal_source_slices(store: ObjectStore) -> None:
    info = store.put("data/blob.bin", SOURCE)
    assert info.size == SIZE and info.key == "data/blob.bin"
    stat = store.stat("data/blob.bin")
    assert (stat.size, stat.etag, stat.is_dir) == (SIZE, info.etag, False)
    for offset, length in ODD_RANGES:
        want = SOURCE[offset : offset + length]
        assert store.read("data/blob.bin", offset, length) == want
        assert store.read("data/blob.bin", offset, length, etag=stat.etag) == want
        assert read_via_buffer(store, "data/blob.bin", offset, length) == want
        assert read_via_buffer(store, "data/blob.bin", offset, length, stat.etag) == want


def test_read_into_reuses_one_buffer(store: ObjectStore) -> None:
    store.put("reuse", SOURCE)
    buffer = memoryview(bytearray(4096))
    out = bytearray()
    offset = 0
    while n := store.read_into("reuse", offset, buffer):
        out += buffer[:n]
        offset += n
    assert out == SOURCE  # the last count is short, then 0 at the end
    assert store.read_into("reuse", 7, memoryview(bytearray())) == 0
    plain = bytearray(100)  # not a memoryview: filled in place all the same
    assert store.read_into("reuse", 99, plain) == 100  # type: ignore[arg-type]
    assert plain == SOURCE[99:199]


def test_read_into_views_fills_consecutive_buffers_in_order(store: ObjectStore) -> None:
    store.put("views", SOURCE)
    etag = store.stat("views").etag
    sizes = [4096, 1, 70_000, 333]
    for offset in (0, 5, SIZE - 50_000):
        raws = [bytearray([FILL]) * n for n in sizes]
        n = store.read_into_views("views", offset, [memoryview(r) for r in raws], etag=etag)
        want = SOURCE[offset : offset + sum(sizes)]
        assert n == len(want)  # short only at the end of the object
        joined = b"".join(raws)
        assert joined[:n] == want
        assert joined[n:] == bytes([FILL]) * (sum(sizes) - n)  # the rest left as it was
    assert store.read_into_views("views", SIZE, [memoryview(bytearray(8))] * 2) == 0
    assert store.read_into_views("views", 0, []) == 0


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["memory", "local"])
def test_random_reads_equal_source_slices(kind: str, tmp_path: Path) -> None:
    s: ObjectStore = MemoryStore() if kind == "memory" else LocalStore(tmp_path)
    s.put("r/blob", SOURCE)
    etag = s.stat("r/blob").etag

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, SIZE + 10), st.integers(0, 70_000), st.booleans())
    def check(offset: int, length: int, pin: bool) -> None:
        got = s.read("r/blob", offset, length, etag=etag if pin else None)
        assert got == SOURCE[offset : offset + length]
        got = read_via_buffer(s, "r/blob", offset, length, etag if pin else None)
        assert got == SOURCE[offset : offset + length]

    check()


def test_zero_byte_object(store: ObjectStore) -> None:
    info = store.put("empty", b"")
    assert store.stat("empty").size == 0
    assert store.read("empty", 0, 10) == b""
    assert store.read("empty", 0, 10, etag=info.etag) == b""
    assert store.read("empty", 5, 1) == b""
    assert read_via_buffer(store, "empty", 0, 10) == b""
    assert read_via_buffer(store, "empty", 0, 10, info.etag) == b""
    assert keys(store.list_pages("empty")) == (["empty"], [])


@pytest.mark.parametrize("name", ODD_NAMES)
def test_unicode_space_hash_percent_names(store: ObjectStore, name: str) -> None:
    data = name.encode() * 3
    store.put(name, data)
    assert store.stat(name).size == len(data)
    assert store.read(name, 1, 1000) == data[1:]
    top = name.split("/")[0] + "/"
    assert keys(store.list_pages(top)) == ([name], [])
    assert keys(store.list_pages("", delimiter="/")) == ([], [top])


def test_not_found_is_enoent(store: ObjectStore) -> None:
    store.put("there", b"x")
    for call in (
        lambda: store.stat("missing/file"),
        lambda: store.read("missing/file", 0, 10),
        lambda: store.read_into("missing/file", 0, memoryview(bytearray(10))),
        lambda: store.delete("missing/file"),
        lambda: store.copy("missing/file", "elsewhere"),
    ):
        with pytest.raises(ObjectNotFound) as info:
            call()
        assert info.value.errno == errno.ENOENT
        assert isinstance(info.value, FileNotFoundError)
        assert "missing/file" in str(info.value)


TREE = [
    "d/a.txt",
    "d/b.txt",
    "d/b/c.txt",
    "d/b/d/e.txt",
    "d/bb",
    "d/z",
    "d.txt",
    "other/x",
]


def test_list_recursive_and_delimited(store: ObjectStore) -> None:
    for k in TREE:
        store.put(k, k.encode())
    assert keys(store.list_pages("d/")) == (sorted(k for k in TREE if k.startswith("d/")), [])
    assert keys(store.list_pages("d/b")) == (["d/b.txt", "d/b/c.txt", "d/b/d/e.txt", "d/bb"], [])
    assert keys(store.list_pages("", delimiter="/")) == (["d.txt"], ["d/", "other/"])
    assert keys(store.list_pages("d/", delimiter="/")) == (
        ["d/a.txt", "d/b.txt", "d/bb", "d/z"],
        ["d/b/"],
    )
    assert keys(store.list_pages("d/b/", delimiter="/")) == (["d/b/c.txt"], ["d/b/d/"])
    listed = {o.key: o for page in store.list_pages("d/") for o in page.objects}
    stat = store.stat("d/b/c.txt")
    assert (listed["d/b/c.txt"].size, listed["d/b/c.txt"].etag) == (stat.size, stat.etag)


def test_list_of_nothing_is_one_empty_page(store: ObjectStore) -> None:
    pages = list(store.list_pages("nothing/here/"))
    assert len(pages) == 1
    assert pages[0].objects == [] and pages[0].prefixes == []


def test_list_is_lazy(store: ObjectStore) -> None:
    for i in range(10):
        store.put(f"lazy/{i:02d}", b"x")
    pages = store.list_pages("lazy/")
    first = next(pages)  # nothing else requested yet; the rest follows on demand
    rest = [o.key for page in pages for o in page.objects]
    assert [o.key for o in first.objects] + rest == [f"lazy/{i:02d}" for i in range(10)]


def test_stage_and_commit_blocks_round_trip(store: ObjectStore) -> None:
    sizes = [65_536, 1, 4097, 30_000]
    chunks, pos = [], 0
    for n in sizes:
        chunks.append(SOURCE[pos : pos + n])
        pos += n
    ids = [f"{i:06d}" for i in range(len(chunks))]
    for block_id, chunk in reversed(list(zip(ids, chunks, strict=True))):  # any order
        store.stage_block("up/file.bin", block_id, chunk)
    whole = b"".join(chunks)
    md5 = hashlib.md5(whole).digest()
    info = store.commit_blocks("up/file.bin", ids, content_md5=md5, metadata={"k": "v"})
    assert info.size == len(whole)
    stat = store.stat("up/file.bin")
    assert (stat.size, stat.content_md5, stat.etag) == (len(whole), md5, info.etag)
    assert store.read("up/file.bin", 0, len(whole) + 5) == whole
    assert store.read("up/file.bin", 65_530, 10) == whole[65_530:65_540]
    assert keys(store.list_pages("up/")) == (["up/file.bin"], [])  # no staging leftovers


def test_commit_of_an_unstaged_block_fails(store: ObjectStore) -> None:
    store.stage_block("up/x", "000000", b"abc")
    with pytest.raises(BadRequest):
        store.commit_blocks("up/x", ["000000", "000001"])
    with pytest.raises(ObjectNotFound):
        store.stat("up/x")


def test_put_overwrites_with_a_new_etag_and_md5(store: ObjectStore) -> None:
    first = store.put("o", b"one")
    md5 = hashlib.md5(b"two!").digest()
    second = store.put("o", b"two!", content_md5=md5)
    assert first.etag != second.etag
    stat = store.stat("o")
    assert (stat.size, stat.etag, stat.content_md5) == (4, second.etag, md5)
    assert store.read("o", 0, 10) == b"two!"


def test_delete(store: ObjectStore) -> None:
    store.put("del/a", b"a")
    store.put("del/b", b"b")
    store.delete("del/a")
    with pytest.raises(ObjectNotFound):
        store.stat("del/a")
    assert keys(store.list_pages("del/")) == (["del/b"], [])


def test_copy(store: ObjectStore) -> None:
    md5 = hashlib.md5(SOURCE).digest()
    store.put("src/blob", SOURCE, content_md5=md5)
    info = store.copy("src/blob", "dst/blob copy")
    assert info.key == "dst/blob copy" and info.size == SIZE
    assert store.read("dst/blob copy", 0, SIZE) == SOURCE
    assert store.stat("dst/blob copy").content_md5 == md5
    assert store.read("src/blob", 10, 10) == SOURCE[10:20]  # the source is untouched


def test_pinned_read_of_a_changed_object_is_estale(store: ObjectStore) -> None:
    old = store.put("v", b"version one")
    if isinstance(store, LocalStore):
        # Same size, same second: the etag must still change (mtime_ns, inode).
        os.utime(os.path.join(store.root, "v"), ns=(1, 1))
        old = store.stat("v")
    new = store.put("v", b"version two")
    assert old.etag != new.etag
    with pytest.raises(VersionChanged) as info:
        store.read("v", 0, 7, etag=old.etag)
    assert info.value.errno == errno.ESTALE
    with pytest.raises(VersionChanged) as info:
        store.read_into("v", 0, memoryview(bytearray(7)), etag=old.etag)
    assert info.value.errno == errno.ESTALE
    assert store.read("v", 0, 7, etag=new.etag) == b"version"
    assert read_via_buffer(store, "v", 0, 7, new.etag) == b"version"


def test_negative_ranges_are_rejected(store: ObjectStore) -> None:
    store.put("n", b"abc")
    with pytest.raises(StorageError) as info:
        store.read("n", -1, 2)
    assert info.value.errno == errno.EINVAL
    with pytest.raises(StorageError) as info:
        store.read_into("n", -1, memoryview(bytearray(2)))
    assert info.value.errno == errno.EINVAL


# -- declared capabilities, over every store (read-only ones too) -----------

READ_ONLY = ["http", "http-no-ranges", "filelist"]


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.unit),
        pytest.param("local", marks=pytest.mark.unit),
        pytest.param("faulty", marks=pytest.mark.unit),
        *(pytest.param(kind, marks=pytest.mark.unit) for kind in READ_ONLY),
        pytest.param("azure", marks=pytest.mark.azurite),
        pytest.param("azure_https", marks=pytest.mark.azurite),
    ],
)
def readable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ReadableStore, str]]:
    """A store of each kind holding SOURCE, and its key there."""
    if request.param.startswith("http"):
        site = Site(ranges=request.param == "http")
        site.publish("/files/source.bin", SOURCE)
        server = QuietServer(("127.0.0.1", 0), make_handler(site))
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.daemon = True
        thread.start()
        http = HttpStore(f"http://127.0.0.1:{server.server_address[1]}", retry=fast_retry())
        yield http, "files/source.bin"
        http.close()
        server.shutdown()
        server.server_close()
        return
    if request.param == "filelist":
        origin = MemoryStore({"real/key.bin": SOURCE})
        info = origin.stat("real/key.bin")
        listed = ListedFile("shown/source.bin", origin, "real/key.bin", SIZE, info.etag)
        yield FileListStore([listed], inline={"MLTable": b"paths: []\n"}), "shown/source.bin"
        return
    writable = make_store(request.param, request, tmp_path)
    writable.put("src/source.bin", SOURCE)
    yield writable, "src/source.bin"
    writable.close()


def stream_to_file(store: ReadableStore, key: str, path: Path, etag: str | None = None) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return store.stream_into(key, fd, etag=etag)
    finally:
        os.close(fd)


@pytest.mark.parametrize("stream_range", [STREAM_RANGE, 4096, SIZE], ids=["default", "4k", "size"])
def test_stream_into_equals_the_source_bytes(
    readable: tuple[ReadableStore, str],
    tmp_path: Path,
    stream_range: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storage_base, "STREAM_RANGE", stream_range)  # ranges of the default
    store, key = readable
    out = tmp_path / "streamed"
    assert stream_to_file(store, key, out) == SIZE
    assert out.read_bytes() == SOURCE
    assert stream_to_file(store, key, out, etag=store.stat(key).etag) == SIZE
    assert out.read_bytes() == SOURCE


def test_stream_into_is_pinned_and_streams_empty_objects(
    store: ObjectStore, tmp_path: Path
) -> None:
    old = store.put("s/v", b"version one")
    if isinstance(store, LocalStore):
        os.utime(os.path.join(store.root, "s/v"), ns=(1, 1))  # same size, same second
        old = store.stat("s/v")
    store.put("s/v", b"version two")
    with pytest.raises(VersionChanged):
        stream_to_file(store, "s/v", tmp_path / "v", etag=old.etag)
    assert stream_to_file(store, "s/v", tmp_path / "v") == 11
    assert (tmp_path / "v").read_bytes() == b"version two"
    store.put("s/empty", b"")
    assert stream_to_file(store, "s/empty", tmp_path / "e") == 0
    with pytest.raises(ObjectNotFound):
        stream_to_file(store, "s/missing", tmp_path / "m")


def test_declared_capabilities(
    readable: tuple[ReadableStore, str], request: pytest.FixtureRequest
) -> None:
    store, key = readable
    store.stat(key)  # an http store learns from the HEAD whether its server serves ranges
    assert store.supports_ranges is (request.node.callspec.params["readable"] != "http-no-ranges")
    path = store.local_path(key)
    if isinstance(store, LocalStore):  # objects are files: folders are directories
        assert path is not None and Path(path).read_bytes() == SOURCE
    else:
        assert path is None
    if isinstance(store, FaultyStore):  # the wrapper declares what its inner store does
        assert store.supports_ranges is store.inner.supports_ranges


@pytest.mark.unit
def test_a_wrapper_declares_its_inner_stores_ranges(tmp_path: Path) -> None:
    site = Site(ranges=False)
    site.publish("/f", SOURCE)
    server = QuietServer(("127.0.0.1", 0), make_handler(site))
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        http = HttpStore(f"http://127.0.0.1:{server.server_address[1]}", retry=fast_retry())
        faulty = FaultyStore(http, retry=fast_retry())
        assert faulty.supports_ranges
        faulty.stat("f")  # the HEAD answer has no 'Accept-Ranges: bytes'
        assert not http.supports_ranges and not faulty.supports_ranges
        assert stream_to_file(faulty, "f", tmp_path / "f") == SIZE
        assert (tmp_path / "f").read_bytes() == SOURCE
        assert faulty.attempts["read"] == 1 and [r[0] for r in site.requests] == ["HEAD", "GET"]
    finally:
        server.shutdown()
        server.server_close()


WRITES: list[tuple[str, Callable[[ObjectStore, str], object]]] = [
    ("put", lambda s, k: s.put(k, b"x")),
    ("stage_block", lambda s, k: s.stage_block(k, "000001", b"x")),
    ("commit_blocks", lambda s, k: s.commit_blocks(k, ["000001"])),
    ("delete", lambda s, k: s.delete(k)),
    ("copy", lambda s, k: s.copy(k, k + ".copy")),
]


@pytest.mark.unit
@pytest.mark.parametrize("kind", READ_ONLY)
def test_read_only_stores_refuse_every_write_before_any_request(kind: str) -> None:
    if kind == "filelist":
        origin = MemoryStore({"real": SOURCE})
        info = origin.stat("real")
        store: ReadOnlyStore = FileListStore([ListedFile("shown", origin, "real", SIZE, info.etag)])
        key = "shown"
        origin.requests.clear()
    else:
        # Nothing listens there: a request would fail with another error.
        origin = None
        store, key = HttpStore("http://127.0.0.1:9", retry=fast_retry()), "files/x?sig=SECRET"
    for op, write in WRITES:
        with pytest.raises(StorageError) as info:
            write(store, key)
        assert isinstance(info.value, ReadOnlyError) and info.value.errno == errno.EROFS
        assert op in str(info.value) and "SECRET" not in str(info.value)
    if origin is not None:
        assert origin.total_requests == 0


@pytest.mark.parametrize(
    ("offset", "length", "piece"), [(0, SIZE, 4096), (7, 10_000, 3000), (SIZE - 5, 100, 64)]
)
def test_read_span_hands_every_piece_in_order(
    readable: tuple[ReadableStore, str], offset: int, length: int, piece: int
) -> None:
    store, key = readable
    etag = store.stat(key).etag
    seen: list[tuple[int, bytes]] = []
    got = store.read_span(
        key,
        offset,
        length,
        memoryview(bytearray(piece)),
        lambda v, p: seen.append((p, bytes(v))),
        etag=etag,
    )
    want = SOURCE[offset : offset + length]
    assert got == len(want)
    out = b""
    for pos, data in seen:
        assert pos == offset + len(out) and 0 < len(data) <= piece
        out += data
    assert out == want
