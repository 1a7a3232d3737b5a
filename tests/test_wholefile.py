"""WholeFileReader: open waits for one download per version (single flight),
reads are preads of the cached copy, LRU pruning keeps the folder under its
limit without touching open files, and what cannot fit is streamed by the
fallback reader. A large file from a server without ranges is one GET
(PinnedVersion.stream_into)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from datamount.errors import VersionChanged
from datamount.read.blocks import ObjectId
from datamount.read.reader import DirectReader, ReadHandle
from datamount.read.wholefile import PinnedVersion, WholeFileReader, entry_name
from datamount.storage.base import ObjectStore
from datamount.storage.http import HttpStore
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy
from datamount.transfer.downloader import DownloadOptions
from faults import FaultPlan, FaultyStore, forbidden
from test_reader_fakes import GatedStore, object_id, source, wait_for
from test_storage_http import QuietServer, Site, make_handler

pytestmark = pytest.mark.unit

RANGE = 4096
OPTIONS = DownloadOptions(threads=4, range_size=RANGE, reserved_free_disk_space=0)
FILES = {
    "empty": b"",
    "small.bin": source(1000),
    "one-range.bin": source(RANGE),
    "large.bin": source(5 * RANGE + 17),
    "dir/sub/x y.bin": source(2 * RANGE + 1),
}


class Fallback:
    """A DirectReader that records what it opened."""

    def __init__(self, store: ObjectStore) -> None:
        self.inner = DirectReader(store)
        self.opened: list[str] = []
        self.closed = False

    def open(self, obj: ObjectId) -> ReadHandle:
        self.opened.append(obj.key)
        return self.inner.open(obj)

    def close(self) -> None:
        self.closed = True


def unlimited(free: int, used: int) -> int:
    return 1 << 50


def fixed(n: int) -> Callable[[int, int], int]:
    return lambda free, used: n


def cached_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def make(
    store: ObjectStore,
    folder: Path,
    limit: Callable[[int, int], int] = unlimited,
    *,
    prune_target: float = 0.7,
) -> tuple[WholeFileReader, Fallback]:
    fallback = Fallback(store)
    reader = WholeFileReader(store, folder, OPTIONS, limit, fallback, prune_target=prune_target)
    return reader, fallback


def read_all(handle: ReadHandle, step: int = 777) -> bytes:
    parts, offset = [], 0
    while chunk := handle.read(offset, step):
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)


@pytest.mark.parametrize("key", sorted(FILES))
def test_reads_equal_the_source(key: str, tmp_path: Path) -> None:
    store = MemoryStore(FILES)
    reader, fallback = make(store, tmp_path)
    handle = reader.open(object_id(store, key))
    data = FILES[key]
    assert read_all(handle) == data
    for offset, n in [
        (0, 1),
        (len(data) // 2, 100),
        (max(0, len(data) - 1), 10),
        (len(data) + 5, 10),
    ]:
        assert handle.read(offset, n) == data[offset : offset + n]
    handle.close()
    assert fallback.opened == []
    assert [p.name for p in tmp_path.iterdir()] == [entry_name(object_id(store, key))]
    reads = store.requests["read"]
    again = reader.open(object_id(store, key))  # served from the cache folder
    assert read_all(again) == data
    assert store.requests["read"] == reads
    assert reads == -(-len(data) // RANGE)  # one request per range, none for an empty file


@pytest.mark.parametrize("key", ["small.bin", "large.bin"])
def test_two_concurrent_opens_share_one_download(key: str, tmp_path: Path) -> None:
    store = GatedStore(FILES)
    reader, _ = make(store, tmp_path)
    obj = object_id(store, key)
    gate = store.gate(key, 0)
    handles: list[ReadHandle] = []
    threads = [threading.Thread(target=lambda: handles.append(reader.open(obj))) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: (key, 0) in store.started)
    assert handles == []  # both opens wait for the download
    gate.set()
    for t in threads:
        t.join(10)
    assert [read_all(h) for h in handles] == [FILES[key]] * 2
    assert store.requests["read"] == -(-len(FILES[key]) // RANGE)  # one download


def test_pruning_keeps_the_folder_under_its_limit(tmp_path: Path) -> None:
    files = {f"f{i}": source(3000, seed=i) for i in range(10)}
    store = MemoryStore(files)
    reader, fallback = make(store, tmp_path, fixed(10_000))
    for key, data in files.items():
        handle = reader.open(object_id(store, key))
        assert read_all(handle) == data
        handle.close()
        assert cached_bytes(tmp_path) <= 10_000
        assert reader.used_bytes == cached_bytes(tmp_path)
    assert fallback.opened == []
    # Least recently used went first: the last file is still there, the first is not.
    assert (tmp_path / entry_name(object_id(store, "f9"))).exists()
    assert not (tmp_path / entry_name(object_id(store, "f0"))).exists()


def test_reopening_makes_a_file_recently_used(tmp_path: Path) -> None:
    files = {f"f{i}": source(3000, seed=i) for i in range(4)}
    store = MemoryStore(files)
    reader, _ = make(store, tmp_path, fixed(9_000), prune_target=1.0)
    for key in ("f0", "f1", "f2", "f0", "f3"):
        reader.open(object_id(store, key)).close()
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {entry_name(object_id(store, k)) for k in ("f0", "f2", "f3")}


def test_open_files_are_never_pruned_and_what_cannot_fit_streams(tmp_path: Path) -> None:
    files = {f"f{i}": source(3000, seed=i) for i in range(4)}
    store = MemoryStore(files)
    reader, fallback = make(store, tmp_path, fixed(9_000))
    held = [reader.open(object_id(store, f"f{i}")) for i in range(3)]
    late = reader.open(object_id(store, "f3"))
    assert fallback.opened == ["f3"]
    assert read_all(late) == files["f3"]
    assert [read_all(h) for h in held] == [files[f"f{i}"] for i in range(3)]
    held[0].close()
    reader.open(object_id(store, "f3")).close()  # now f0 can go
    assert fallback.opened == ["f3"]
    assert not (tmp_path / entry_name(object_id(store, "f0"))).exists()


def test_a_file_bigger_than_the_cache_streams(tmp_path: Path) -> None:
    store = MemoryStore(FILES)
    reader, fallback = make(store, tmp_path, fixed(10_000))
    handle = reader.open(object_id(store, "large.bin"))
    assert read_all(handle) == FILES["large.bin"]
    assert fallback.opened == ["large.bin"]
    assert list(tmp_path.iterdir()) == []


def test_a_download_the_disk_cannot_hold_streams(tmp_path: Path) -> None:
    store = MemoryStore(FILES)
    fallback = Fallback(store)
    options = DownloadOptions(threads=2, range_size=RANGE, reserved_free_disk_space=1 << 60)
    reader = WholeFileReader(store, tmp_path, options, unlimited, fallback)
    handle = reader.open(object_id(store, "large.bin"))
    assert read_all(handle) == FILES["large.bin"]
    assert fallback.opened == ["large.bin"]
    assert list(tmp_path.iterdir()) == []
    assert reader.used_bytes == 0


@pytest.mark.parametrize("key", ["small.bin", "large.bin"])
def test_a_changed_object_is_estale(key: str, tmp_path: Path) -> None:
    store = MemoryStore(FILES)
    reader, _ = make(store, tmp_path)
    obj = object_id(store, key)
    store.put(key, b"new bytes")
    with pytest.raises(OSError) as caught:
        reader.open(obj)
    assert caught.value.errno == errno.ESTALE
    assert list(tmp_path.iterdir()) == []
    assert reader.used_bytes == 0
    assert read_all(reader.open(object_id(store, key))) == b"new bytes"


def test_a_failed_download_fails_every_waiter_then_is_retried(tmp_path: Path) -> None:
    store = GatedStore(FILES)
    reader, _ = make(store, tmp_path)
    obj = object_id(store, "small.bin")
    gate = store.gate("small.bin", 0)
    errors: list[int | None] = []

    def opener() -> None:
        try:
            reader.open(obj)
        except OSError as exc:
            errors.append(exc.errno)

    threads = [threading.Thread(target=opener) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: ("small.bin", 0) in store.started)  # the download is in its request
    store.put("small.bin", b"changed")  # the pinned read will fail
    gate.set()
    for t in threads:
        t.join(10)
    assert errors == [errno.ESTALE, errno.ESTALE]
    assert list(tmp_path.iterdir()) == [] and reader.used_bytes == 0
    assert read_all(reader.open(object_id(store, "small.bin"))) == b"changed"


def test_a_permanent_error_is_the_openers_error(tmp_path: Path) -> None:
    plan = FaultPlan().fail("read", times=1, error=forbidden())
    store = FaultyStore(MemoryStore(FILES), plan, retry=RetryPolicy(2))
    reader, fallback = make(store, tmp_path)
    obj = object_id(store, "large.bin")
    with pytest.raises(OSError) as caught:
        reader.open(obj)
    assert caught.value.errno == errno.EACCES
    assert fallback.opened == [] and list(tmp_path.iterdir()) == []
    assert read_all(reader.open(obj)) == FILES["large.bin"]


def test_a_restarted_reader_reuses_complete_files_and_drops_partial_ones(
    tmp_path: Path,
) -> None:
    store = MemoryStore(FILES)
    reader, _ = make(store, tmp_path)
    for key in ("small.bin", "large.bin"):
        reader.open(object_id(store, key)).close()
    reader.close()
    truncated = tmp_path / entry_name(object_id(store, "one-range.bin"))
    truncated.write_bytes(b"only part")
    (tmp_path / ".leftover.part").write_bytes(b"x")
    (tmp_path / ".dl-leftover").mkdir()
    reads = store.requests["read"]

    again, _ = make(store, tmp_path)
    assert not truncated.exists()
    assert not (tmp_path / ".leftover.part").exists()
    assert not (tmp_path / ".dl-leftover").exists()
    assert again.used_bytes == len(FILES["small.bin"]) + len(FILES["large.bin"])
    for key in ("small.bin", "large.bin"):
        assert read_all(again.open(object_id(store, key))) == FILES[key]
    assert store.requests["read"] == reads


def test_close_closes_the_fallback_and_refuses_new_opens(tmp_path: Path) -> None:
    store = MemoryStore(FILES)
    reader, fallback = make(store, tmp_path)
    handle = reader.open(object_id(store, "small.bin"))
    reader.close()
    assert fallback.closed
    assert handle.read(0, 10) == FILES["small.bin"][:10]  # open handles keep working
    handle.close()
    with pytest.raises(OSError):
        handle.read(0, 10)
    with pytest.raises(OSError):
        reader.open(object_id(store, "small.bin"))
    assert os.listdir(tmp_path)  # cached files stay for the next mount


def test_a_large_file_from_a_server_without_ranges_is_one_get(tmp_path: Path) -> None:
    data = FILES["large.bin"]
    site = Site(ranges=False)
    site.publish("/large.bin", data)
    server = QuietServer(("127.0.0.1", 0), make_handler(site))
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        store = HttpStore(f"http://127.0.0.1:{server.server_address[1]}")
        info = store.stat("large.bin")  # as the namespace's stat: the server declares no ranges
        assert not store.supports_ranges
        reader, fallback = make(store, tmp_path / "cache")
        obj = ObjectId("http", "large.bin", info.etag, info.size)
        site.requests.clear()
        assert read_all(reader.open(obj)) == data
        assert [r[0] for r in site.requests] == ["GET"]  # stream_into: the whole file, once
        assert fallback.opened == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_pinned_version_serves_one_version_of_one_object(tmp_path: Path) -> None:
    store = MemoryStore(FILES)
    obj = object_id(store, "large.bin")
    pinned = PinnedVersion(store, obj)
    store.requests.clear()
    assert pinned.supports_ranges and pinned.local_path("large.bin") is None
    pages = list(pinned.list_pages("", delimiter="/"))
    assert [o.key for p in pages for o in p.objects] == ["large.bin"]
    assert [p.objects for p in pinned.list_pages("other/")] == [[]]
    assert store.requests == {}  # listing and stat answer the pinned ObjectId
    info = pinned.stat("large.bin")
    assert (info.size, info.etag) == (obj.size, obj.etag)
    with pytest.raises(VersionChanged):  # a second stat: the Downloader wants to restart
        pinned.stat("large.bin")
    assert pinned.read("large.bin", 3, 5) == FILES["large.bin"][3:8]
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert pinned.stream_into("large.bin", fd) == obj.size
    finally:
        os.close(fd)
    assert out.read_bytes() == FILES["large.bin"]
    store.put("large.bin", b"changed")
    with pytest.raises(VersionChanged):  # every read is pinned to the handle's etag
        pinned.read_into("large.bin", 0, memoryview(bytearray(4)))
    pinned.close()
    assert not store.closed  # the store stays its owner's
