"""Namespace over a MemoryStore (no FUSE, no network): what a listing shows,
how many requests each answer costs, and how long answers are kept."""

from __future__ import annotations

import threading

import pytest

from datamount.fs.namespace import Namespace
from datamount.storage.memory import MemoryStore

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TREE = {
    "ds/": b"",  # the folder's own marker
    "ds/a.txt": b"alpha",
    "ds/b": b"shadowed by the directory b/",
    "ds/b.txt": b"bee",
    "ds/b/c.txt": b"c",
    "ds/empty/": b"",  # marker only: an empty directory
    "ds/marked/": b"",
    "ds/marked/m.txt": b"m",
    "ds/dir with space/naïve 日本.txt": b"u",
    "ds//weird": b"an empty path component: not representable",
    "other/x.txt": b"outside the mount",
}


def listing(ns: Namespace, path: str = "/") -> dict[str, tuple[bool, int]]:
    return {name: (a.is_dir, a.size) for name, a in ns.list_dir(path)}


@pytest.mark.parametrize("page_size", [1, 2, 1000])
def test_listing_shows_dirs_markers_and_names(page_size: int) -> None:
    store = MemoryStore(TREE, page_size=page_size)
    ns = Namespace(store, "ds")
    assert listing(ns) == {
        "a.txt": (False, 5),
        "b": (True, 0),  # a directory shadows the blob of the same name, on any page split
        "b.txt": (False, 3),
        "dir with space": (True, 0),
        "empty": (True, 0),
        "marked": (True, 0),
    }
    assert listing(ns, "/dir with space") == {"naïve 日本.txt": (False, 1)}
    assert listing(ns, "/empty") == {}
    assert listing(ns, "/marked") == {"m.txt": (False, 1)}
    assert listing(ns, "/b") == {"c.txt": (False, 1)}
    a = ns.getattr("/a.txt")
    assert (a.key, a.size, a.etag) == ("ds/a.txt", 5, store.stat("ds/a.txt").etag)


def test_lookups_without_a_listing_agree_with_it() -> None:
    ns = Namespace(MemoryStore(TREE), "ds/")
    assert ns.getattr("/b").is_dir  # one request sees the blob 'b' and the prefix 'b/'
    assert ns.getattr("/empty").is_dir and ns.getattr("/marked").is_dir
    assert not ns.getattr("/b.txt").is_dir
    assert ns.getattr("/dir with space/naïve 日本.txt").size == 1
    with pytest.raises(NotADirectoryError):
        list(ns.list_dir("/a.txt"))
    with pytest.raises(FileNotFoundError):
        list(ns.list_dir("/nothing"))


def test_whole_container_root() -> None:
    ns = Namespace(MemoryStore({"x/y.txt": b"y", "top.txt": b"t"}), "")
    assert listing(ns) == {"top.txt": (False, 1), "x": (True, 0)}
    assert ns.getattr("/x/y.txt").key == "x/y.txt"


def test_listing_streams_page_by_page() -> None:
    store = MemoryStore({f"big/{i:05d}": b"" for i in range(20_000)}, page_size=1000)
    ns = Namespace(store, "big")
    entries = ns.list_dir("/")
    first = next(entries)
    assert first[0] == "00000"
    assert store.requests["list"] == 1  # the first entry before the second page is asked for
    assert sum(1 for _ in entries) == 19_999
    assert store.requests["list"] == 20


def test_ls_l_costs_the_listing_requests_only() -> None:
    store = MemoryStore({f"ds/d{i % 3}/f{i:03d}": b"x" * i for i in range(300)}, page_size=50)
    ns = Namespace(store, "ds")
    for name, attrs in ns.list_dir("/"):
        assert ns.getattr(f"/{name}") == attrs
        for child, child_attrs in ns.list_dir(f"/{name}"):
            assert ns.getattr(f"/{name}/{child}") == child_attrs
    # 1 root page + 3 directories x 2 pages; no stat, no lookup per entry.
    assert store.requests == {"list": 7}
    # A missing name in a fully listed directory: known absent, no request.
    with pytest.raises(FileNotFoundError):
        ns.getattr("/d0/missing")
    # Listing again: served from the cached complete listing.
    assert len(list(ns.list_dir("/d1"))) == 100
    assert store.requests == {"list": 7}
    assert ns.requests == 7


def test_negative_cache_and_ttl() -> None:
    store = MemoryStore({"ds/a.txt": b"a"})
    clock = Clock()
    ns = Namespace(store, "ds", ttl=2.0, clock=clock)
    with pytest.raises(FileNotFoundError):
        ns.getattr("/new.txt")
    with pytest.raises(FileNotFoundError):
        ns.getattr("/new.txt")
    assert store.requests["list"] == 1  # the miss was remembered
    store.put("ds/new.txt", b"fresh")
    clock.now += 1.9
    with pytest.raises(FileNotFoundError):
        ns.getattr("/new.txt")  # still within the TTL
    clock.now += 0.2
    assert ns.getattr("/new.txt").size == 5  # expired: asked again
    assert store.requests["list"] == 2


def test_never_expiring_by_default() -> None:
    store = MemoryStore({"ds/a.txt": b"a"})
    clock = Clock()
    ns = Namespace(store, "ds", clock=clock)
    assert [n for n, _ in ns.list_dir("/")] == ["a.txt"]
    store.put("ds/b.txt", b"b")
    clock.now += 10**9
    assert [n for n, _ in ns.list_dir("/")] == ["a.txt"]
    with pytest.raises(FileNotFoundError):
        ns.getattr("/b.txt")
    assert store.requests["list"] == 1


def test_ttl_zero_caches_nothing() -> None:
    store = MemoryStore({"ds/a.txt": b"a"})
    ns = Namespace(store, "ds", ttl=0)
    for _ in range(3):
        ns.getattr("/a.txt")
    assert store.requests["list"] == 3


def test_invalidate_forgets_a_name() -> None:
    store = MemoryStore({"ds/a.txt": b"a"})
    ns = Namespace(store, "ds")
    old = ns.getattr("/a.txt").etag
    store.put("ds/a.txt", b"changed")
    assert ns.getattr("/a.txt").etag == old
    ns.invalidate("/a.txt")
    assert ns.getattr("/a.txt").size == 7


def test_uri_file_root_holds_exactly_the_file() -> None:
    store = MemoryStore({"models/v1/model weights.bin": b"w" * 10, "models/v1/other": b"o"})
    ns = Namespace(store, file_key="models/v1/model weights.bin")
    assert listing(ns) == {"model weights.bin": (False, 10)}
    assert ns.getattr("/model weights.bin").key == "models/v1/model weights.bin"
    with pytest.raises(FileNotFoundError):
        ns.getattr("/other")
    with pytest.raises(NotADirectoryError):
        list(ns.list_dir("/model weights.bin"))
    assert store.requests == {"stat": 1}  # the other name needs no request at all


def test_concurrent_lookups_and_listings_agree() -> None:
    store = MemoryStore({f"ds/d{i % 7}/f{i:04d}": b"x" for i in range(700)}, page_size=40)
    ns = Namespace(store, "ds")
    results: list[int] = []
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            n = 0
            for d in range(7):
                dirname = f"/d{(d + seed) % 7}"
                for name, attrs in ns.list_dir(dirname):
                    assert ns.getattr(f"{dirname}/{name}") == attrs
                    n += 1
            results.append(n)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [700] * 8


def test_files_opened_by_name_cost_one_listing_per_folder() -> None:
    """A job reading 200 files by name from its own file list, 8 threads at
    once: the first miss in each folder lists it, every other name (present
    or missing) is answered from that listing."""
    store = MemoryStore({f"ds/d{i % 4}/f{i:04d}": b"x" * i for i in range(200)})
    ns = Namespace(store, "ds")
    names = [f"/d{i % 4}/f{i:04d}" for i in range(200)]

    def look(i: int) -> int:
        return ns.getattr(names[i]).size

    threads = [
        threading.Thread(target=lambda k=k: [look(i) for i in range(k, 200, 8)]) for k in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [look(i) for i in range(200)] == list(range(200))
    with pytest.raises(FileNotFoundError):
        ns.getattr("/d1/missing")
    assert store.requests == {"list": 5}  # the root (for the folders) and each folder once


def test_a_big_folder_is_listed_once_then_looked_up_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datamount.fs import namespace

    monkeypatch.setattr(namespace, "PARENT_LISTING_MAX", 10)
    store = MemoryStore({f"ds/f{i:03d}": b"x" for i in range(50)}, page_size=10)
    ns = Namespace(store, "ds")
    assert ns.getattr("/f040").size == 1  # one page of 10 and the next, then a lookup
    first = store.requests["list"]
    assert first <= 3
    assert ns.getattr("/f005").size == 1  # seen on the first pages: no request
    assert ns.getattr("/f041").size == 1  # a lookup of its own, no listing again
    assert store.requests["list"] == first + 1


def test_metadata_in_ram_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from datamount.fs import namespace

    monkeypatch.setattr(namespace, "MAX_CACHED_ATTRS", 10)
    monkeypatch.setattr(namespace, "MAX_CACHED_LISTING_ENTRIES", 6)
    store = MemoryStore({f"ds/d{d}/f{i}": b"" for d in range(2) for i in range(4)})
    ns = Namespace(store, "ds")
    list(ns.list_dir("/d0"))
    list(ns.list_dir("/d1"))  # 4 + 4 entries > 6: the listing of d0 is dropped
    assert len(ns._attrs._items) <= 10 and ns._listings.weight <= 6
    before = store.requests["list"]
    list(ns.list_dir("/d1"))
    assert store.requests["list"] == before  # still cached
    list(ns.list_dir("/d0"))
    assert store.requests["list"] == before + 1  # evicted: listed again
